"""Offline work behind ``icos-agent fit``: the invariants of a model, or of a table of any model's predictions,
fitted and written as a bundle, in stages (:mod:`agent.offline.fit_stages`) timed one by one."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from agent.data.files import Dataset
from agent.data.tables import TableBatch, TableColumns
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.reliability import weak_oracle
from agent.estimation.estimators.trust import MIN_CALIBRATION_ERRORS
from agent.estimation.pairs.calibration import PairCalibration
from agent.model.classifier import OnnxClassifier
from agent.offline.data_advice import ValidationAdvice, validation_advice
from agent.offline.fit_pair import pair_of_model, pair_of_table
from agent.offline.fit_progress import FitMeter, fit_meter
from agent.offline.fit_stages import (
    ModelFitInputs,
    Written,
    calibrate_model,
    calibrate_table,
    choose_headline_of,
    fit_the_flag,
    fit_the_oracle,
    model_report,
    read_model_data,
    read_table_data,
    segment_model,
    segment_table,
    table_report,
)
from invariants.bundle import Bundle
from invariants.fit_params import CalibrationPlan, FitParams

Progress = Callable[[str], None]

#: The stages of a fit, in order: what :attr:`FitReport.stage_seconds` times.
STAGES = ("read", "oracle", "calibrate", "segments", "headline", "flag", "write")
#: The stage a challenger fitted with its champion runs last (``fit --champion``).
PAIR_STAGE = "pair"


@dataclass(frozen=True)
class FitReport:
    """A fitted bundle, its estimators' calibration, the figures ``fit`` prints, and the seconds each stage
    took (:data:`STAGES`)."""

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


_R = TypeVar("_R")


def _stages(with_pair: bool) -> tuple[str, ...]:
    """The stages a fit runs: :data:`STAGES`, and :data:`PAIR_STAGE` last when a champion is given."""
    return (*STAGES, PAIR_STAGE) if with_pair else STAGES


class _Clock:
    """Runs the stages of one fit, keeps the seconds each took and moves the fit's progress bar
    (:mod:`agent.offline.fit_progress`) as they go."""

    def __init__(self, meter: FitMeter) -> None:
        self.seconds: dict[str, float] = {}
        self.meter = meter

    def run(self, stage: str, fn: Callable[..., _R], *args: Any) -> _R:
        started = time.perf_counter()
        self.meter.begin(stage)
        out = fn(*args)
        self.meter.end()
        self.seconds[stage] = round(time.perf_counter() - started, 3)
        return out

    def report(
        self,
        written: Written,
        calibration: EstimatorCalibration,
        params: FitParams,
        pair: PairCalibration | None = None,
    ) -> FitReport:
        if pair is not None:
            written.bundle.pair = pair.to_dict()
        return FitReport(
            bundle=written.bundle,
            calibration=calibration,
            train_accuracy=written.train_accuracy,
            val_accuracy=written.val_accuracy,
            n_rules=written.n_rules,
            n_selected=written.n_selected,
            coverage=written.coverage,
            stage_seconds=dict(self.seconds),
            pair=pair,
            validation=validation_advice(written.val_n, written.val_wrong, params.calibration_fraction),
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
    say = progress or (lambda _m: None)
    inputs = ModelFitInputs(model, train, val, idi_path, params, plan, preprocess)
    with fit_meter(_stages(champion is not None)) as meter:
        clock = _Clock(meter)
        data = clock.run("read", read_model_data, inputs, say)
        oracle = clock.run("oracle", fit_the_oracle, data.oracle_data, params, say)
        calibrated = clock.run("calibrate", calibrate_model, inputs, data, oracle, say)
        calibrated = clock.run("segments", segment_model, inputs, data, oracle, calibrated, say)
        chosen = clock.run("headline", choose_headline_of, calibrated, oracle, params, plan, say)
        chosen = clock.run("flag", fit_the_flag, data.oracle_data, oracle, calibrated, chosen, params, plan, say)
        written = clock.run("write", model_report, inputs, data, oracle, chosen)
        pair = clock.run(PAIR_STAGE, pair_of_model, inputs, data, champion, say) if champion is not None else None
    return clock.report(written, chosen.calibration, params, pair)


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
    say = progress or (lambda _m: None)
    with fit_meter(_stages(champion_probabilities is not None)) as meter:
        clock = _Clock(meter)
        data = clock.run("read", read_table_data, ref, columns, classes, params, idi_path, say)
        oracle = clock.run("oracle", fit_the_oracle, data.oracle_data, params, say)
        calibrated = clock.run("calibrate", calibrate_table, data, oracle)
        calibrated = clock.run("segments", segment_table, data, oracle, calibrated, params, plan, say)
        chosen = clock.run("headline", choose_headline_of, calibrated, oracle, params, plan, say)
        chosen = clock.run("flag", fit_the_flag, data.oracle_data, oracle, calibrated, chosen, params, plan, say)
        written = clock.run("write", table_report, data, columns, params, oracle, chosen)
        pair = (
            clock.run(PAIR_STAGE, pair_of_table, ref, champion_probabilities, data.y, params, plan)
            if champion_probabilities is not None
            else None
        )
    return clock.report(written, chosen.calibration, params, pair)


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
