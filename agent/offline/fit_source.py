"""What a fit reads its data from: a :class:`FitSource`, one per kind of source (a model and its labeled sets,
:mod:`agent.offline.fit_source_model`; a reference table of any model's predictions,
:mod:`agent.offline.fit_source_table`).

A source holds exactly what differs between them: how the data is read and viewed (:meth:`FitSource.read`,
giving the same :class:`OracleData` whatever the source), how the estimators are calibrated beyond the classic
ones (:meth:`FitSource.calibrate`: a model's corrupted copies through it, none for a table), how the view is cut
into segments (:meth:`FitSource.view_shape`), what its bundle records besides the invariants
(:meth:`FitSource.bundle`) and how a challenger's comparison with its champion is calibrated
(:meth:`FitSource.pair`). The stages of :mod:`agent.offline.fit_stages` are written once over it and never
ask which source they hold.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from agent.errors import UserError
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.pairs.calibration import PairCalibration
from agent.offline.calibration.estimators.shift_fitting import ShiftFit
from agent.offline.calibration.judged import JudgedSet
from agent.offline.calibration.segments.data import ViewShape
from agent.offline.calibration.sets import CalibrationSets
from invariants.adi import AlgorithmInvariants
from invariants.bundle import Bundle
from invariants.fit_params import CalibrationPlan, FitParams
from invariants.fitting import FittedOracle
from invariants.idi import IdiRuleSet
from invariants.oracle import OracleCalibration
from invariants.tdi import TrainingInvariants

Progress = Callable[[str], None]


@dataclass(frozen=True)
class OracleData:
    """What the oracle is fitted from, whatever the source: the training view and labels (the TDIs), and the
    validation view, labels, probabilities, predicted classes and metadata (the ADIs and the calibration
    split); ``val_metadata`` includes the values the IDI rules read of named inputs."""

    train_features: np.ndarray
    train_y: np.ndarray
    val_features: np.ndarray
    val_y: np.ndarray
    val_probabilities: np.ndarray
    val_predicted: np.ndarray
    val_metadata: Mapping[str, np.ndarray]
    feature_names: list[str] | None
    classes: list[str]
    idi: IdiRuleSet | None


class SourceData(Protocol):
    """What a source's read gives (stage 1): its own data, and the oracle's data every later stage reads."""

    @property
    def oracle_data(self) -> OracleData: ...


@dataclass(frozen=True)
class OracleFit:
    """Stage 2: the fitted oracle, its calibration split (``fitted.calibration_index``, into the validation
    rows) judged as a labeled set (``clean``), and the estimators that need only the judged predictions
    calibrated on it (``classic``)."""

    fitted: FittedOracle
    clean: JudgedSet
    classic: EstimatorCalibration

    @property
    def calibration_index(self) -> np.ndarray:
        return self.fitted.calibration_index


@dataclass(frozen=True)
class Calibrated:
    """Stage 3: the estimators' calibration (``shift_aware``'s where it was fitted), the judged sets it was
    fitted from (None: no corruption applies, or no model), the oracle's view of the rows the headline is
    chosen on (None: nothing to choose on) and ``shift_aware``'s refits without each group of related
    corruptions (what the flag is fitted with)."""

    calibration: EstimatorCalibration
    sets: CalibrationSets | None = None
    features: np.ndarray | None = None
    shift: ShiftFit | None = None


@dataclass(frozen=True)
class Chosen:
    """Stage 4: the estimators' calibration carrying the headline's evidence, and the headline the bundle's
    manifest names (None: the recommended one)."""

    calibration: EstimatorCalibration
    headline: str | None


@dataclass(frozen=True)
class FittedParts:
    """What every bundle records, whatever its source: the invariants, the oracle's and the estimators'
    calibration, the headline and the oracle fit's parameters (the source adds its own)."""

    idi: IdiRuleSet | None
    tdi: TrainingInvariants
    adi: AlgorithmInvariants
    calibration: OracleCalibration
    estimator_calibration: dict[str, Any]
    headline: str | None
    fit_params: dict[str, Any]


D = TypeVar("D", bound=SourceData)


class FitSource(ABC, Generic[D]):
    """Where a fit reads its data, and everything about the fit that depends on it (see the module)."""

    params: FitParams
    plan: CalibrationPlan

    @abstractmethod
    def read(self, say: Progress) -> D:
        """Stage 1 (read): the data read and viewed, and the oracle's data from it."""

    @abstractmethod
    def calibrate(self, data: D, fit: OracleFit, say: Progress) -> Calibrated:
        """Stage 3 (calibrate): the estimators' calibration beyond the classic ones, where the source allows."""

    @abstractmethod
    def view_shape(self, data: D) -> ViewShape:
        """The columns of the view the segments are cut along (stage 3b)."""

    @abstractmethod
    def bundle(self, data: D, parts: FittedParts) -> Bundle:
        """The bundle of the fit (stage 5): ``parts`` and what the source records of itself."""

    @abstractmethod
    def correct(self, data: D) -> tuple[np.ndarray, np.ndarray]:
        """Whether each training and each validation prediction was right (the figures of the fit)."""

    @property
    @abstractmethod
    def pairs(self) -> bool:
        """Whether a champion is given, whose comparison with this model the ``pair`` stage calibrates."""

    @abstractmethod
    def pair(self, data: D, say: Progress) -> PairCalibration:
        """The ``pair`` stage: the comparison with the champion calibrated (only when :attr:`pairs`)."""


def threshold_applies(threshold: float | None, n_classes: int) -> None:
    """A decision threshold is a binary model's: any other is the user's mistake."""
    if threshold is not None and n_classes != 2:
        raise UserError(f"--decision-threshold applies to binary models only; this one has {n_classes} classes")
