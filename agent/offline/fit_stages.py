"""The stages of ``icos-agent fit``, each written once over a :class:`~agent.offline.fit_source.FitSource` (a
model, :mod:`agent.offline.fit_source_model`, or a reference table, :mod:`agent.offline.fit_source_table`) and
the frozen result of the stage before it, asking the source only for what differs:

1. **read** the data and view it (:meth:`~agent.offline.fit_source.FitSource.read`): either source gives the
   same :class:`~agent.offline.fit_source.OracleData`;
2. **oracle**: IDI/TDI/ADI fitted and judged on the calibration split, and the estimators that need only
   the judged predictions calibrated on it (:func:`fit_the_oracle`);
3. **calibrate**: what the source calibrates beyond them (a model: ``shift_aware`` on corrupted copies of the
   calibration split passed through it; a table: nothing, it has no model);
4. **segments**: the segments every window is also cut into, along the source's view, and their reference
   on the labeled validation data (:mod:`agent.offline.calibration.segments.fitting`);
5. **headline**: the headline chosen from evidence (:func:`choose_headline_of`);
6. **flag**: the flag "this number may be wrong" fitted on windows of shifts the headline's estimate was
   fitted without (:func:`fit_the_flag`);
7. **write**: the bundle (the source adds what it records of itself) and the figures of the report;
8. **pair** (with a champion only): the challenger's comparison with its champion.

:data:`FIT_STAGES` declares them in order (:mod:`agent.offline.stage_loop`); :mod:`agent.offline.fit` runs
them and times each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Generic

import numpy as np

from agent.errors import UserError
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import (
    RECOMMENDED_ESTIMATOR,
    TABLE_HEADLINE,
    default_headline,
    estimator_specs,
    headline_candidates,
    headline_estimator,
)
from agent.estimation.pairs.calibration import PairCalibration
from agent.model.classifier import label_confidences
from agent.offline.calibration.estimators.headline_choice import (
    choose_headline,
    choose_model_headline,
    classic_calibration,
    ineligible,
)
from agent.offline.calibration.flag.fitting import model_flag, table_flag
from agent.offline.calibration.judged import JudgedSet
from agent.offline.calibration.segments.data import SegmentData
from agent.offline.calibration.segments.fitting import define_segments
from agent.offline.calibration.shift_windows import tilt_coordinates
from agent.offline.fit_source import (
    Calibrated,
    Chosen,
    D,
    FitSource,
    FittedParts,
    OracleData,
    OracleFit,
    Progress,
)
from agent.offline.stage_loop import Stages
from invariants.bundle import Bundle
from invariants.fit_params import FitParams
from invariants.fitting import fit_oracle


@dataclass(frozen=True)
class Oracled(Generic[D]):
    """After the oracle stage: the source's data and the fitted oracle."""

    data: D
    oracle: OracleFit


@dataclass(frozen=True)
class CalibratedFit(Oracled[D]):
    """After the calibrate and segments stages: the estimators' calibration so far."""

    calibrated: Calibrated


@dataclass(frozen=True)
class ChosenFit(CalibratedFit[D]):
    """After the headline and flag stages: the headline and the calibration carrying its evidence and flag."""

    chosen: Chosen


@dataclass(frozen=True)
class Written:
    """The bundle and the figures the fit reports."""

    bundle: Bundle
    train_accuracy: float
    val_accuracy: float
    n_rules: int
    n_selected: int
    coverage: float
    #: validation predictions and the wrong ones among them (how much more data a fit needs)
    val_n: int = 0
    val_wrong: int = 0


@dataclass(frozen=True)
class WrittenFit(ChosenFit[D]):
    """After the write stage (and the pair stage, with a champion): the bundle, its figures and the pair."""

    written: Written
    pair: PairCalibration | None = None


def read_data(source: FitSource[D], _: None, say: Progress) -> D:
    """Stage 1 (read): the source's data, read and viewed."""
    return source.read(say)


def fit_the_oracle(data: OracleData, params: FitParams, say: Progress) -> OracleFit:
    """:func:`invariants.fitting.fit_oracle` (paper §4, §5.4), then the calibration split judged and the
    classic estimators calibrated on it."""
    try:
        fitted = fit_oracle(
            data.train_features,
            data.train_y,
            data.val_features,
            data.val_y,
            data.val_probabilities,
            idi=data.idi,
            val_metadata=data.val_metadata or None,
            params=params,
            feature_names=data.feature_names,
            class_names=data.classes,
            progress=say,
            val_predicted=data.val_predicted,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    cal = fitted.calibration_index
    probabilities, predicted, y = data.val_probabilities[cal], data.val_predicted[cal], data.val_y[cal]
    result = fitted.calibration_result  # the oracle's verdicts on the split, as its calibration counted them
    clean = JudgedSet(
        "clean", np.asarray(result.verdict), label_confidences(probabilities, predicted), predicted == y, y
    )
    classic = EstimatorCalibration.fit(clean.confidences, clean.correct, result.failed)
    return OracleFit(fitted, clean, classic)


def oracle_stage(source: FitSource[D], data: D, say: Progress) -> Oracled[D]:
    """Stage 2 (oracle): :func:`fit_the_oracle` on the source's oracle data."""
    return Oracled(data, fit_the_oracle(data.oracle_data, source.params, say))


def calibrate_stage(source: FitSource[D], fit: Oracled[D], say: Progress) -> CalibratedFit[D]:
    """Stage 3 (calibrate): what the source calibrates beyond the classic estimators."""
    return CalibratedFit(fit.data, fit.oracle, source.calibrate(fit.data, fit.oracle, say))


def segment_stage(source: FitSource[D], fit: CalibratedFit[D], say: Progress) -> CalibratedFit[D]:
    """Stage 3b (segments): the source's view's columns (or regions of it), the predicted class and the
    selected TDI rules (:mod:`agent.offline.calibration.segments.fitting`)."""
    od, oracle, params = fit.data.oracle_data, fit.oracle, source.params
    data = SegmentData(
        od.train_features,
        od.train_y,
        od.val_features,
        od.val_y,
        od.val_probabilities,
        od.val_predicted,
        oracle.calibration_index,
        oracle.clean.verdicts,
        oracle.fitted.oracle.tdi,
        od.classes,
    )
    calibration = fit.calibrated.calibration
    segments = define_segments(
        data,
        source.view_shape(fit.data),
        calibration,
        max_segments=params.max_segments,
        plan=source.plan,
        seed=params.seed,
    )
    if segments is not None:
        kinds = ", ".join(f"{d.name} {len(d.segments)}" for d in segments.dimensions)
        say(f"segments: {segments.size} ({kinds})")
    return replace(fit, calibrated=replace(fit.calibrated, calibration=calibration.with_segments(segments)))


def _manifest_headline(calibration: EstimatorCalibration) -> str | None:
    """The headline a model bundle's manifest names: None (the recommended one, the default) unless the
    evidence chose another; without a ``shift_aware`` calibration, the estimator standing in for it."""
    if calibration.shift is None:
        return TABLE_HEADLINE
    chosen = calibration.headline.chosen if calibration.headline is not None else RECOMMENDED_ESTIMATOR
    return None if chosen == RECOMMENDED_ESTIMATOR else chosen


def choose_headline_of(calibrated: Calibrated, fit: OracleFit, source: FitSource[Any], say: Progress) -> Chosen:
    """The headline chosen from the estimators' errors on simulated shifts of the calibration split
    (:mod:`agent.offline.calibration.estimators.headline_choice`); with ``shift_aware`` calibrated, among the others and
    refitted per fold, and the default unless another clearly does better; without it, among the estimators
    that need no model. Estimators resting on a weak oracle are not eligible."""
    params, plan = source.params, source.plan
    calibration, exclude = calibrated.calibration, ineligible(calibrated.calibration)
    if calibrated.sets is not None:
        say(
            "choosing the headline estimator on simulated shifts of the calibration split "
            "(shift_aware refitted per fold)"
        )
        evidence = choose_model_headline(
            calibrated.sets, calibrated.features, seed=params.seed, exclude=exclude, plan=plan
        )
        reason = evidence.reason if evidence is not None else "too few calibration rows to choose on"
        say(f"headline estimator {evidence.chosen if evidence else RECOMMENDED_ESTIMATOR}: {reason}")
        calibration = calibration.with_headline(evidence)
        return Chosen(calibration, _manifest_headline(calibration))
    if calibrated.features is None:  # a model whose inputs no corruption applies to
        return Chosen(calibration, _manifest_headline(calibration))
    model_only = ", ".join(s.name for s in estimator_specs() if s.needs_model)
    say(f"choosing the headline estimator on simulated shifts of the calibration split ({model_only} needs a model)")
    coords = tilt_coordinates(calibrated.features)
    evidence = choose_headline(
        fit.clean, [], coords, classic_calibration(fit.clean), seed=params.seed, exclude=exclude, plan=plan
    )
    headline = evidence.chosen if evidence is not None else default_headline(headline_candidates(with_model=False))
    say(f"headline estimator {headline}: {evidence.reason if evidence else 'too few calibration rows to choose'}")
    return Chosen(calibration.with_headline(evidence), headline)


def headline_stage(source: FitSource[D], fit: CalibratedFit[D], say: Progress) -> ChosenFit[D]:
    """Stage 4 (headline): :func:`choose_headline_of`."""
    chosen = choose_headline_of(fit.calibrated, fit.oracle, source, say)
    return ChosenFit(fit.data, fit.oracle, fit.calibrated, chosen)


def fit_the_flag(
    data: OracleData, fit: OracleFit, calibrated: Calibrated, chosen: Chosen, source: FitSource[Any], say: Progress
) -> Chosen:
    """The flag "this number may be wrong" (:mod:`agent.offline.calibration.flag.fitting`): with
    ``shift_aware``, on the windows its interval's refits estimate of the corruptions each left out and of
    simulated shifts; without it, on simulated shifts of held-out folds of the calibration split. The flag
    predicts the chosen headline's error."""
    params, plan, calibration = source.params, source.plan, chosen.calibration
    headline = headline_estimator(chosen.headline, with_model=calibration.shift is not None)
    k = len(data.classes)
    if calibrated.sets is not None and calibrated.shift is not None and calibrated.shift.refits:
        say(f"fitting the flag on {len(calibrated.shift.refits)} refits of shift_aware, each without some corruptions")
        coords = tilt_coordinates(calibrated.features)
        flag = model_flag(
            calibrated.sets, calibrated.shift, calibration, headline, coords, k, seed=params.seed, plan=plan
        )
    else:
        say("fitting the flag on simulated shifts of held-out folds of the calibration split")
        cal = fit.calibration_index
        coords = tilt_coordinates(data.val_features[cal])
        flag = table_flag(fit.clean, data.val_predicted[cal], headline, coords, k, seed=params.seed, plan=plan)
    if flag is None:
        say("flag: too few calibration rows to fit it; the trust distance alone marks windows")
    return Chosen(calibration.with_flag(flag), chosen.headline)


def flag_stage(source: FitSource[D], fit: ChosenFit[D], say: Progress) -> ChosenFit[D]:
    """Stage 5 (flag): :func:`fit_the_flag`."""
    chosen = fit_the_flag(fit.data.oracle_data, fit.oracle, fit.calibrated, fit.chosen, source, say)
    return replace(fit, chosen=chosen)


def _fitted_parts(fit: ChosenFit[Any]) -> FittedParts:
    """What every bundle records of the fit, whatever its source."""
    fitted = fit.oracle.fitted
    tdi, adi = fitted.oracle.tdi, fitted.oracle.adi
    assert tdi is not None and adi is not None  # fit_oracle always builds both
    return FittedParts(
        idi=fit.data.oracle_data.idi,
        tdi=tdi,
        adi=adi,
        calibration=fitted.calibration,
        estimator_calibration=fit.chosen.calibration.to_dict(),
        headline=fit.chosen.headline,
        fit_params=dict(fitted.fit_params),
    )


def write_stage(source: FitSource[D], fit: ChosenFit[D], say: Progress) -> WrittenFit[D]:
    """Stage 6 (write): the source's bundle and the figures of the fit."""
    bundle = source.bundle(fit.data, _fitted_parts(fit))
    train_correct, val_correct = source.correct(fit.data)
    tdi = bundle.tdi
    written = Written(
        bundle,
        train_accuracy=float(train_correct.mean()),
        val_accuracy=float(val_correct.mean()),
        n_rules=len(tdi.rules),
        n_selected=len(tdi.selected_rules),
        coverage=float(tdi.coverage(fit.data.oracle_data.val_features)),
        val_n=len(val_correct),
        val_wrong=int(len(val_correct) - np.count_nonzero(val_correct)),
    )
    return WrittenFit(fit.data, fit.oracle, fit.calibrated, fit.chosen, written)


def pair_stage(source: FitSource[D], fit: WrittenFit[D], say: Progress) -> WrittenFit[D]:
    """Stage 7 (pair, with a champion): the comparison with the champion, recorded in the bundle too."""
    pair = source.pair(fit.data, say)
    fit.written.bundle.pair = pair.to_dict()
    return replace(fit, pair=pair)


#: The stages of every fit, in order.
FIT_STAGES: Stages[FitSource[Any], WrittenFit[Any]] = (
    Stages.first("read", read_data)
    .then("oracle", oracle_stage)
    .then("calibrate", calibrate_stage)
    .then("segments", segment_stage)
    .then("headline", headline_stage)
    .then("flag", flag_stage)
    .then("write", write_stage)
)
#: The stages of a challenger's fit with its champion: the pair stage last.
PAIRED_STAGES = FIT_STAGES.then("pair", pair_stage)


def stages_of(source: FitSource[Any]) -> Stages[FitSource[Any], WrittenFit[Any]]:
    """The stages a fit of ``source`` runs: :data:`PAIRED_STAGES` when a champion is given."""
    return PAIRED_STAGES if source.pairs else FIT_STAGES
