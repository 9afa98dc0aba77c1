"""The stages of ``icos-agent fit``, each a function of frozen inputs returning a frozen result.

1. **read** the data and view it: a model's training and validation sets predicted and read through the
   feature view chosen for it (:func:`read_model_data`), or a reference table split into both
   (:func:`read_table_data`); either gives the same :class:`OracleData`;
2. **oracle**: IDI/TDI/ADI fitted and judged on the calibration split, and the estimators that need only
   the judged predictions calibrated on it (:func:`fit_the_oracle`, the same for both sources);
3. **calibrate**: ``shift_aware`` fitted on corrupted copies of the calibration split passed through the
   model (:func:`calibrate_model`; a table has no model to pass them through);
4. **segments**: the segments every window is also cut into, and their reference on the labeled
   validation data (:func:`segment_model`, :func:`segment_table`; :mod:`agent.offline.calibration.segments.fitting`);
5. **headline**: the headline chosen from evidence (:func:`choose_headline_of`, both sources);
6. **flag**: the flag "this number may be wrong" fitted on windows of shifts the headline's estimate was
   fitted without (:func:`fit_the_flag`, both sources);
7. **write**: the bundle and the figures of the report (:func:`model_report`, :func:`table_report`).

:mod:`agent.offline.fit` runs them in order and times each. The model is never changed: the stages read
a copy with the fit's decision threshold and view. Every size the calibration draws is the
:class:`~invariants.fit_params.CalibrationPlan`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.data.files import Dataset, label_indices
from agent.data.tables import TableBatch, TableColumns
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
from agent.model.classifier import OnnxClassifier, label_confidences, predicted_classes_of
from agent.model.inputs import Inputs, rule_values
from agent.model.view_choice import choose_view
from agent.model.views import FeatureView, ViewError
from agent.offline.calibration.corruptions import calibration_family, is_image_input
from agent.offline.calibration.estimators.headline_choice import (
    choose_headline,
    choose_model_headline,
    classic_calibration,
    ineligible,
)
from agent.offline.calibration.estimators.shift_fitting import ShiftFit
from agent.offline.calibration.flag.fitting import model_flag, table_flag
from agent.offline.calibration.judged import JudgedSet
from agent.offline.calibration.segments.data import SegmentData, ViewShape, column_groups
from agent.offline.calibration.segments.fitting import define_segments
from agent.offline.calibration.sets import CalibrationSets, calibration_sets, input_calibration_sets
from agent.offline.calibration.shift_windows import tilt_coordinates
from agent.offline.fit_progress import expect_rows
from agent.offline.viewing import LazySource, Viewed, predict_and_view, source_of, subset
from invariants.adi import AlgorithmInvariants
from invariants.bundle import Bundle, TableSource
from invariants.fit_params import MODEL, TABLE, CalibrationPlan, FitParams
from invariants.fitting import FittedOracle, fit_oracle, stratified_split
from invariants.idi import IdiRuleSet
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


@dataclass(frozen=True)
class ModelFitInputs:
    """A model's fit as asked: the model, its labeled training and validation sets, the IDI rules' file, the
    fit's parameters and calibration plan, and how image files become inputs (``preprocess``, recorded in
    the bundle so that ``check`` reads them the same way; None for data in memory)."""

    model: OnnxClassifier
    train: Dataset
    val: Dataset
    idi_path: str | Path | None = None
    params: FitParams = FitParams()
    plan: CalibrationPlan = CalibrationPlan()
    preprocess: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ModelData:
    """Stage 1 of a model's fit: ``model`` reading the chosen ``view`` with the fit's decision threshold, both
    sets as it reads them (``train_x``/``val_x``, in memory or from files), their predictions and views, the
    oracle's data, and where the fit's random stream stands (``rng_state``: the calibration's draws of a
    file source continue it)."""

    model: OnnxClassifier
    view: FeatureView
    train_x: Inputs | LazySource
    val_x: Inputs | LazySource
    train: Viewed
    val: Viewed
    oracle_data: OracleData
    rng_state: Mapping[str, Any] = field(default_factory=dict)


def _labeled(train: Dataset, val: Dataset) -> None:
    if train.y is None or val.y is None:
        missing = " and ".join(n for n, d in (("training", train), ("validation", val)) if d.y is None)
        raise UserError(
            f"fit needs labels, and the {missing} data has none: name a table's label column with "
            "--label-column (CSV/Parquet), or add an array y to the .npz"
        )


def _threshold_applies(threshold: float | None, n_classes: int) -> None:
    if threshold is not None and n_classes != 2:
        raise UserError(f"--decision-threshold applies to binary models only; this one has {n_classes} classes")


def _one_numeric_tensor(model: OnnxClassifier) -> bool:
    """Whether the model reads one numeric tensor of a fixed shape (corrupted whole, recorded by its shape)."""
    single = model.signature.single
    return single is not None and not single.is_string and single.fixed


def read_model_data(inputs: ModelFitInputs, say: Progress) -> ModelData:
    """Stage 1 (read): the IDI rules, the feature view chosen for the model (``params.features``, else from
    its inputs; categories are read from every training value, a file source's from a sample), and both sets
    predicted and viewed through it."""
    params, train, val = inputs.params, inputs.train, inputs.val
    _labeled(train, val)
    _threshold_applies(params.decision_threshold, inputs.model.n_classes)
    model = inputs.model.with_decision_threshold(params.decision_threshold)
    idi = IdiRuleSet.load(inputs.idi_path, model.classes) if inputs.idi_path else None
    train_x, val_x = source_of(model, train.x), source_of(model, val.x)
    assert train.y is not None and val.y is not None
    train_y, val_y = label_indices(train.y, model.classes), label_indices(val.y, model.classes)
    rng = np.random.default_rng(params.seed)
    try:
        sample = (
            train_x if isinstance(train_x, Inputs) else train_x.take(subset(train_x.n, inputs.plan.view_sample, rng))
        )
        view = choose_view(model, sample, params.features, feature_names=train.feature_names, seed=params.seed)
    except ViewError as exc:
        raise UserError(str(exc)) from None
    say(f"feature view: {view.kind}, {view.width} columns ({view.why})")
    model = model.with_view(view)
    val_metadata = dict(val.metadata)
    if idi is not None and isinstance(val_x, Inputs):  # the rules' named inputs are read with the metadata
        val_metadata.update(rule_values(val_x, idi.input_fields))
    expect_rows(len(train_x) + len(val_x))
    train_v = predict_and_view(model, train_x, "predict train")
    val_v = predict_and_view(model, val_x, "predict validation")
    data = OracleData(
        train_features=train_v.features,
        train_y=train_y,
        val_features=val_v.features,
        val_y=val_y,
        val_probabilities=val_v.prediction.probabilities,
        val_predicted=val_v.prediction.predicted,
        val_metadata=val_metadata,
        feature_names=list(view.names) if view.names else train.feature_names,
        classes=model.classes,
        idi=idi,
    )
    return ModelData(model, view, train_x, val_x, train_v, val_v, data, rng.bit_generator.state)


@dataclass(frozen=True)
class TableData:
    """Stage 1 of a table's fit: the reference rows split into the TDIs' part and validation, every row's
    class index and predicted class (with the fit's decision threshold), and the oracle's data."""

    ref: TableBatch
    y: np.ndarray
    predicted: np.ndarray
    train_index: np.ndarray
    val_index: np.ndarray
    oracle_data: OracleData


def read_table_data(
    ref: TableBatch,
    columns: TableColumns,
    classes: Sequence[str],
    params: FitParams,
    idi_path: str | Path | None,
    say: Progress,
) -> TableData:
    """Stage 1 (read) of a table: its rows split, stratified by label, into a training part (the TDIs) and a
    validation part (the ADIs and the calibration split), and the IDI rules."""
    if ref.y is None:
        raise UserError("fit needs labels: name the reference table's label column (--label-column)")
    _threshold_applies(params.decision_threshold, len(classes))
    if ref.probabilities.shape[1] != len(classes):
        raise UserError(f"{ref.probabilities.shape[1]} probability columns but {len(classes)} classes")
    y = label_indices(ref.y, classes)
    predicted = predicted_classes_of(ref.probabilities, params.decision_threshold)
    val_idx, train_idx = stratified_split(y, params.train_fraction, params.seed)
    if len(train_idx) == 0 or len(val_idx) < 4:
        raise UserError(f"{len(y)} reference rows are too few to split into training and validation parts")
    say(f"reference: {len(y)} rows, {len(train_idx)} for the TDIs, {len(val_idx)} for the ADIs and calibration")
    idi = IdiRuleSet.load(idi_path, list(classes)) if idi_path else None
    data = OracleData(
        train_features=ref.x[train_idx],
        train_y=y[train_idx],
        val_features=ref.x[val_idx],
        val_y=y[val_idx],
        val_probabilities=ref.probabilities[val_idx],
        val_predicted=predicted[val_idx],
        val_metadata={k: v[val_idx] for k, v in ref.metadata.items()},
        feature_names=list(columns.features),
        classes=list(classes),
        idi=idi,
    )
    return TableData(ref, y, predicted, train_idx, val_idx, data)


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


def fit_the_oracle(data: OracleData, params: FitParams, say: Progress) -> OracleFit:
    """Stage 2 (oracle): :func:`invariants.fitting.fit_oracle` (paper §4, §5.4), then the calibration split
    judged and the classic estimators calibrated on it."""
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


def calibrate_table(data: TableData, fit: OracleFit) -> Calibrated:
    """Stage 3 (calibrate) of a table: no model to pass corrupted inputs through, so the classic estimators'
    calibration is the whole; the headline is chosen on the calibration split's rows."""
    return Calibrated(fit.classic, None, data.oracle_data.val_features[fit.calibration_index])


def _resumed(state: Mapping[str, Any]) -> np.random.Generator:
    """The fit's random stream where an earlier stage left it."""
    rng = np.random.default_rng()
    rng.bit_generator.state = dict(state)
    return rng


def _tensor_copies(
    model: OnnxClassifier,
    plan: CalibrationPlan,
    params: FitParams,
    train_x: np.ndarray,
    cal_idx: np.ndarray,
    rng_state: Mapping[str, Any],
) -> tuple[np.ndarray, int | None]:
    """The calibration rows of one numeric tensor that are corrupted, and how many copies
    (``fit --shift-sets``; None: the plan's count for its corruptions): all rows, unless the tensor is
    wide (:attr:`~invariants.fit_params.CalibrationPlan.wide_values`), whose copies are bounded in rows."""
    if is_image_input(model.input_shape) or int(np.prod(model.input_shape)) <= plan.wide_values:
        return cal_idx, params.shift_sets
    keep = plan.wide_sample_rows()
    rows = cal_idx if len(cal_idx) <= keep else cal_idx[subset(len(cal_idx), keep, _resumed(rng_state))]
    corruptions = len(calibration_family(model.input_shape, train_x)[0])
    return rows, params.shift_sets or plan.wide_sets(corruptions, len(rows))


def calibrate_model(inputs: ModelFitInputs, data: ModelData, fit: OracleFit, say: Progress) -> Calibrated:
    """Stage 3 (calibrate): ``shift_aware`` fitted on judged corrupted copies of the calibration split: one
    numeric tensor corrupted whole, else input by input (image files: a sample of the split and of the
    training set, :class:`~invariants.fit_params.CalibrationPlan`)."""
    params, plan, model, od = inputs.params, inputs.plan, data.model, data.oracle_data
    oracle, cal_idx = fit.fitted.oracle, fit.calibration_index
    train_x, val_x, single = data.train_x, data.val_x, model.signature.single
    if isinstance(train_x, Inputs) and isinstance(val_x, Inputs) and single is not None and _one_numeric_tensor(model):
        rows, n_sets = _tensor_copies(model, plan, params, train_x[single.name], cal_idx, data.rng_state)
        say(
            "calibrating the shift-aware estimator on corrupted copies of the calibration split (generic + audit)"
            + (f": {n_sets} copies of {len(rows)} rows (wide inputs)" if n_sets is not None else "")
        )
        expect_rows(len(rows) * (n_sets or plan.min_sets))
        sets: CalibrationSets | None = calibration_sets(
            model,
            oracle,
            val_x[single.name][rows],
            od.val_y[rows],
            train_x=train_x[single.name],
            metadata={k: v[rows] for k, v in od.val_metadata.items()} or None,
            feature_names=od.feature_names,
            n_sets=n_sets,
            seed=params.seed,
            train_features=od.train_features,
            clean=data.val.take(rows),
        )
    else:
        say("calibrating the shift-aware estimator on corrupted copies of the calibration split (per input kind)")
        rng = _resumed(data.rng_state)
        large = isinstance(train_x, LazySource)  # image files: a bounded share of the calibration split
        shift_idx = subset(len(cal_idx), plan.lazy_calibration, rng) if large else np.arange(len(cal_idx))
        rows = cal_idx[np.sort(shift_idx)]
        sets = input_calibration_sets(
            model,
            oracle,
            val_x.take(rows),
            od.val_y[rows],
            train_x=train_x.take(subset(train_x.n, plan.lazy_train_sample, rng))
            if large
            else train_x.take(slice(None)),
            train_features=od.train_features,
            metadata={k: v[rows] for k, v in inputs.val.metadata.items()} or None,
            rule_inputs=od.idi.input_fields if od.idi is not None else frozenset(),
            feature_names=od.feature_names,
            n_sets=params.shift_sets or (plan.lazy_sets if large else None),
            seed=params.seed,
        )
        if sets is None:
            say("shift-aware calibration: no corruption applies to these inputs; the headline is doc")
    if sets is None:
        return Calibrated(fit.classic)
    shift = sets.fit_with_refits(params.seed, plan=plan)
    return Calibrated(fit.classic.with_shift(shift.calibration), sets, od.val_features[rows], shift)


def _segmented(
    calibrated: Calibrated,
    od: OracleData,
    fit: OracleFit,
    shape: ViewShape,
    params: FitParams,
    plan: CalibrationPlan,
    say: Progress,
) -> Calibrated:
    tdi = fit.fitted.oracle.tdi
    data = SegmentData(
        od.train_features,
        od.train_y,
        od.val_features,
        od.val_y,
        od.val_probabilities,
        od.val_predicted,
        fit.calibration_index,
        fit.clean.verdicts,
        tdi,
        od.classes,
    )
    segments = define_segments(
        data, shape, calibrated.calibration, max_segments=params.max_segments, plan=plan, seed=params.seed
    )
    if segments is not None:
        kinds = ", ".join(f"{d.name} {len(d.segments)}" for d in segments.dimensions)
        say(f"segments: {segments.size} ({kinds})")
    return replace(calibrated, calibration=calibrated.calibration.with_segments(segments))


def segment_model(
    inputs: ModelFitInputs, data: ModelData, fit: OracleFit, calibrated: Calibrated, say: Progress
) -> Calibrated:
    """Stage 3b (segments) of a model: the view's table columns, or regions of it, the predicted class and the
    selected TDI rules (:mod:`agent.offline.calibration.segments.fitting`)."""
    od = data.oracle_data
    shape = column_groups(data.view, data.model.signature, od.feature_names)
    return _segmented(calibrated, od, fit, shape, inputs.params, inputs.plan, say)


def segment_table(
    data: TableData, fit: OracleFit, calibrated: Calibrated, params: FitParams, plan: CalibrationPlan, say: Progress
) -> Calibrated:
    """Stage 3b (segments) of a table: its feature columns, the predicted class and the selected TDI rules."""
    od = data.oracle_data
    return _segmented(calibrated, od, fit, column_groups(None, None, od.feature_names), params, plan, say)


@dataclass(frozen=True)
class Chosen:
    """Stage 4: the estimators' calibration carrying the headline's evidence, and the headline the bundle's
    manifest names (None: the recommended one)."""

    calibration: EstimatorCalibration
    headline: str | None


def _manifest_headline(calibration: EstimatorCalibration) -> str | None:
    """The headline a model bundle's manifest names: None (the recommended one, the default) unless the
    evidence chose another; without a ``shift_aware`` calibration, the estimator standing in for it."""
    if calibration.shift is None:
        return TABLE_HEADLINE
    chosen = calibration.headline.chosen if calibration.headline is not None else RECOMMENDED_ESTIMATOR
    return None if chosen == RECOMMENDED_ESTIMATOR else chosen


def choose_headline_of(
    calibrated: Calibrated, fit: OracleFit, params: FitParams, plan: CalibrationPlan, say: Progress
) -> Chosen:
    """Stage 4 (headline): the headline chosen from the estimators' errors on simulated shifts of the
    calibration split (:mod:`agent.offline.calibration.estimators.headline_choice`); with a model, ``shift_aware``
    among them, refitted per fold, and the default unless another clearly does better; from a table, among
    the estimators a table has. Estimators resting on a weak oracle are not eligible."""
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


def fit_the_flag(
    data: OracleData,
    fit: OracleFit,
    calibrated: Calibrated,
    chosen: Chosen,
    params: FitParams,
    plan: CalibrationPlan,
    say: Progress,
) -> Chosen:
    """Stage 5 (flag): the flag "this number may be wrong" (:mod:`agent.offline.calibration.flag.fitting`):
    with ``shift_aware``, on the windows its interval's refits estimate of the corruptions each left out and
    of simulated shifts; without it, on simulated shifts of held-out folds of the calibration split. The
    flag predicts the chosen headline's error."""
    calibration = chosen.calibration
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


@dataclass(frozen=True)
class Written:
    """Stage 5: the bundle and the figures the fit reports."""

    bundle: Bundle
    train_accuracy: float
    val_accuracy: float
    n_rules: int
    n_selected: int
    coverage: float
    #: validation predictions and the wrong ones among them (how much more data a fit needs)
    val_n: int = 0
    val_wrong: int = 0


def _invariants(fit: OracleFit) -> tuple[TrainingInvariants, AlgorithmInvariants]:
    tdi, adi = fit.fitted.oracle.tdi, fit.fitted.oracle.adi
    assert tdi is not None and adi is not None  # fit_oracle always builds both
    return tdi, adi


def _figures(bundle: Bundle, train_correct: np.ndarray, val_correct: np.ndarray, val_features: np.ndarray) -> Written:
    tdi = bundle.tdi
    assert tdi is not None
    return Written(
        bundle,
        train_accuracy=float(train_correct.mean()),
        val_accuracy=float(val_correct.mean()),
        n_rules=len(tdi.rules),
        n_selected=len(tdi.selected_rules),
        coverage=float(tdi.coverage(val_features)),
        val_n=len(val_correct),
        val_wrong=int(len(val_correct) - np.count_nonzero(val_correct)),
    )


def model_report(inputs: ModelFitInputs, data: ModelData, fit: OracleFit, chosen: Chosen) -> Written:
    """Stage 5 (write) of a model: its bundle (the model's digest and inputs, the view, the threshold, the
    image files' preprocessing) and the figures of the fit."""
    model, od = data.model, data.oracle_data
    single_numeric = _one_numeric_tensor(model)
    tdi, adi = _invariants(fit)
    bundle = Bundle(
        model_sha256=model.sha256,
        input_shape=list(model.input_shape) if single_numeric else [],
        classes=model.classes,
        feature_names=od.feature_names,
        fit_params={**fit.fitted.fit_params, **inputs.params.recorded(MODEL)},
        idi=od.idi,
        tdi=tdi,
        adi=adi,
        calibration=fit.fitted.calibration,
        estimator_calibration=chosen.calibration.to_dict(),
        decision_threshold=model.decision_threshold,
        headline=chosen.headline,
        inputs=None if single_numeric else model.signature.to_list(),
        feature_view=data.view.to_dict(),
        preprocess=dict(inputs.preprocess) if inputs.preprocess is not None else None,
    )
    train_correct = data.train.prediction.predicted == od.train_y
    return _figures(bundle, train_correct, od.val_predicted == od.val_y, od.val_features)


def table_report(data: TableData, columns: TableColumns, params: FitParams, fit: OracleFit, chosen: Chosen) -> Written:
    """Stage 5 (write) of a table: its bundle (the table's columns instead of a model) and the figures."""
    od = data.oracle_data
    tdi, adi = _invariants(fit)
    bundle = Bundle(
        model_sha256=None,
        input_shape=[len(columns.features)],
        classes=od.classes,
        feature_names=list(columns.features),
        fit_params={**fit.fitted.fit_params, **params.recorded(TABLE), "source": TABLE},
        idi=od.idi,
        tdi=tdi,
        adi=adi,
        calibration=fit.fitted.calibration,
        estimator_calibration=chosen.calibration.to_dict(),
        table=TableSource(columns.proba, columns.features, columns.label),
        decision_threshold=params.decision_threshold,
        headline=chosen.headline,
    )
    correct = data.predicted == data.y
    return _figures(bundle, correct[data.train_index], correct[data.val_index], od.val_features)
