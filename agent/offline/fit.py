"""Offline work behind ``icos-agent fit``: the invariants of a model, or of a table of any model's predictions,
fitted and written as a bundle, in stages (:mod:`agent.offline.fit_stages`) timed one by one."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.data.files import Dataset
from agent.data.tables import TableBatch, TableColumns
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.reliability import weak_oracle
from agent.estimation.estimators.trust import MIN_CALIBRATION_ERRORS
from agent.estimation.pairs.calibration import PairCalibration
from agent.model.classifier import OnnxClassifier
from agent.offline.data_advice import ValidationAdvice, validation_advice
from agent.offline.fit_progress import fit_meter
from agent.offline.fit_source import FitSource
from agent.offline.fit_source_model import ModelFitSource
from agent.offline.fit_source_table import TableFitSource
from agent.offline.fit_stages import FIT_STAGES, stages_of
from invariants.bundle import Bundle
from invariants.fit_params import CalibrationPlan, FitParams

Progress = Callable[[str], None]

#: The stages of a fit, in order: what :attr:`FitReport.stage_seconds` times.
STAGES = FIT_STAGES.names


@dataclass(frozen=True)
class FitReport:
    """A fitted bundle, its estimators' calibration, the figures ``fit`` prints, and the seconds each stage
    took (:data:`STAGES`, and ``pair`` last with a champion)."""

    bundle: Bundle
    calibration: EstimatorCalibration
    train_accuracy: float
    val_accuracy: float
    n_rules: int
    n_selected: int
    coverage: float
    stage_seconds: Mapping[str, float] = field(default_factory=dict)
    #: the comparison with the champion (``fit --champion``), recorded in the bundle
    pair: PairCalibration | None = None
    #: how much labeled validation data the fit needs for its calibration split to hold enough errors
    validation: ValidationAdvice | None = None


def fit_source(source: FitSource[Any], progress: Progress | None = None) -> FitReport:
    """Run the stages of a fit of ``source`` (:func:`~agent.offline.fit_stages.stages_of`) under one progress
    bar, timing each."""
    say = progress or (lambda _m: None)
    stages = stages_of(source)
    with fit_meter(stages.names) as meter:
        done, seconds = stages.run(source, say, meter)
    written = done.written
    return FitReport(
        bundle=written.bundle,
        calibration=done.chosen.calibration,
        train_accuracy=written.train_accuracy,
        val_accuracy=written.val_accuracy,
        n_rules=written.n_rules,
        n_selected=written.n_selected,
        coverage=written.coverage,
        stage_seconds=seconds,
        pair=done.pair,
        validation=validation_advice(written.val_n, written.val_wrong, source.params.calibration_fraction),
    )


def fit_bundle(
    model: OnnxClassifier,
    train: Dataset,
    val: Dataset,
    *,
    idi_path: str | Path | None = None,
    params: FitParams = FitParams(),
    progress: Progress | None = None,
    preprocess: Mapping[str, Any] | None = None,
    plan: CalibrationPlan = CalibrationPlan(),
    champion: OnnxClassifier | None = None,
) -> FitReport:
    """Fit IDI/TDI/ADI for ``model`` and calibrate the oracle and estimators (paper §4, §5.4).

    ``params.decision_threshold`` is the model's (its labels are what the invariants judge; ``model`` itself
    is not changed); ``params.features`` the feature view the invariants read (None chooses one from the
    model's signature, :func:`~agent.model.view_choice.choose_view`); ``preprocess``: how image files became
    the model's inputs, recorded in the bundle; ``champion``: the model this one is a challenger of, the
    comparison with it calibrated (the ``pair`` stage) and recorded in the bundle.
    """
    source = ModelFitSource(model, train, val, idi_path, params, plan, preprocess, champion)
    return fit_source(source, progress)


def fit_table_bundle(
    ref: TableBatch,
    columns: TableColumns,
    classes: Sequence[str],
    *,
    idi_path: str | Path | None = None,
    params: FitParams = FitParams(),
    progress: Progress | None = None,
    plan: CalibrationPlan = CalibrationPlan(),
    champion_probabilities: np.ndarray | None = None,
) -> FitReport:
    """Fit IDI/TDI/ADI and the estimators from a reference table (paper §4, §5.4): the stages of a model's
    fit, without ``shift_aware`` (it needs the model); see :mod:`agent.offline.tables`.
    ``champion_probabilities`` (a champion's probabilities of the same rows): the comparison with it is
    calibrated too (the ``pair`` stage)."""
    source = TableFitSource(ref, columns, classes, idi_path, params, plan, champion_probabilities)
    return fit_source(source, progress)


def fit_warnings(calibration: EstimatorCalibration, validation: ValidationAdvice | None = None) -> list[str]:
    """What the user should know about the fitted estimator calibration (printed by ``fit``, listed in
    ``fit --json``): a calibration split with too few wrong predictions gives TPR/FPR and per-bin
    confidence offsets that are noise, so the estimators keep raw confidence near clean data, and
    ``validation`` says how much more labeled validation data would give it enough."""
    out: list[str] = []
    if calibration.too_few_errors:
        out.append(
            f"the calibration split holds {calibration.n_wrong} wrong prediction(s) of {calibration.n} "
            f"(fewer than {MIN_CALIBRATION_ERRORS}): its TPR/FPR and confidence offsets are unreliable, so "
            "icos_corrected is noise and cbpe/shift_aware keep the model's raw confidence near clean data; "
            "give fit more validation data (or a larger --calibration-fraction) for a calibrated correction"
        )
    if weak_oracle(calibration):
        out.append(
            f"the oracle separates right from wrong predictions poorly on the calibration split (TPR "
            f"{calibration.tpr:.2f}, FPR {calibration.fpr:.2f}): icos and icos_corrected will be marked unreliable; "
            "more training data for the TDIs, more trees (--trees), IDI rules (--idi) or a richer feature view "
            "(--features) help"
        )
    if calibration.shift is not None and calibration.shift.trust is None:
        out.append("the shift-aware calibration has no trust model (no trust signal will be reported)")
    advice = validation.message() if validation is not None else None
    if advice is not None:
        out.append(advice)
    return out
