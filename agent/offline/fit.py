"""Offline work behind ``icos-agent fit``: train the invariants of a model and write a bundle."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.data.files import Dataset, label_indices
from agent.errors import UserError
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators import RECOMMENDED_ESTIMATOR, TABLE_HEADLINE
from agent.estimation.headline_choice import choose_model_headline
from agent.estimation.input_shifts import input_calibration_sets
from agent.estimation.reliability import ORACLE_ESTIMATORS, weak_oracle
from agent.estimation.shifts import CalibrationSets, calibration_sets
from agent.estimation.trust import MIN_CALIBRATION_ERRORS
from agent.model.classifier import Batch, OnnxClassifier, Prediction
from agent.model.inputs import Inputs, rule_values
from agent.model.view_choice import choose_view
from agent.model.views import ViewError
from invariants.bundle import Bundle
from invariants.fit_params import MODEL, FitParams
from invariants.fitting import fit_oracle
from invariants.idi import IdiRuleSet

Progress = Callable[[str], None]

#: The estimate shown first (the headline) in reports and dashboards: the recommended estimator
#: (``shift_aware``, see ``agent.estimation.estimators`` and ``docs/estimation.md``).


#: Training samples a lazy source (image files) shows the view choice.
VIEW_SAMPLE = 512
#: Training samples of a lazy source that set the corruptions' parameters (the pixel range); the shift-aware
#: reference is the view of the whole training split, computed once.
LARGE_TRAIN_SAMPLE = 256
#: The calibration samples and corrupted sets of the shift-aware fit of a lazy source (each set is one
#: pass of the model over the samples: large images cost milliseconds each).
LARGE_CALIBRATION = 400
LARGE_SETS = 48


class LazySource:
    """Inputs read a batch at a time from files (an image folder), prepared for the model as they come."""

    def __init__(self, model: OnnxClassifier, raw: Any) -> None:
        self.model = model
        self.raw = raw

    @property
    def n(self) -> int:
        return int(self.raw.n)

    def __len__(self) -> int:
        return self.n

    def batches(self, size: int) -> Iterator[Inputs]:
        for b in self.raw.batches(size):
            yield self.model.prepare_file(b)

    def take(self, index: np.ndarray | slice) -> Inputs:
        return self.model.prepare_file(self.raw.take(index))


def source_of(model: OnnxClassifier, x: Any) -> Inputs | LazySource:
    """A data set's inputs, prepared for ``model``: in memory, or read from files a batch at a time."""
    if hasattr(x, "batches") and hasattr(x, "take") and not isinstance(x, Inputs | np.ndarray | dict):
        return LazySource(model, x)
    return model.prepare_file(x)


def _subset(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """At most ``k`` of ``n`` indices, sorted (all of them when ``n ≤ k``)."""
    return np.arange(n) if n <= k else np.sort(rng.choice(n, size=k, replace=False))


def predict_with_progress(model: OnnxClassifier, x: Batch, desc: str, batch_size: int | None = None) -> Prediction:
    """Batch prediction with a progress bar on stderr (hidden for short runs)."""
    return predict_and_view(model, model.prepare_file(x), desc, batch_size)[0]


def predict_and_view(
    model: OnnxClassifier, x: Inputs | LazySource, desc: str, batch_size: int | None = None
) -> tuple[Prediction, np.ndarray]:
    """Predictions and the feature view of ``x``, batch by batch, with a progress bar on stderr (hidden for
    short runs); the model's extra outputs (an embedding) are read into the view and not kept."""
    from tqdm import tqdm

    probs: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    feats: list[np.ndarray] = []
    with tqdm(total=len(x), desc=desc, unit="sample", leave=False, mininterval=0.5, delay=1.0) as bar:
        for batch in x.batches(batch_size or model.signature.batch_rows()):
            p = model.predict_prepared(batch)
            probs.append(p.probabilities)
            labels.append(p.predicted)
            feats.append(model.features(batch, p))
            bar.update(len(p.predicted))
    return Prediction(np.concatenate(probs), np.concatenate(labels)), np.concatenate(feats)


@dataclass
class FitReport:
    bundle: Bundle
    calibration: EstimatorCalibration
    train_accuracy: float
    val_accuracy: float
    n_rules: int
    n_selected: int
    coverage: float


def fit_warnings(calibration: EstimatorCalibration) -> list[str]:
    """What the user should know about the fitted estimator calibration (printed by ``fit``, listed in
    ``fit --json``): a calibration split with too few wrong predictions gives TPR/FPR and per-bin
    confidence offsets that are noise, so the estimators keep raw confidence near clean data."""
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
    return out


def _calibrate_shift_and_choose(
    est_cal: EstimatorCalibration, sets: CalibrationSets, features: np.ndarray, seed: int, say: Progress
) -> EstimatorCalibration:
    """``est_cal`` with the ``shift_aware`` calibration fitted on ``sets`` and the headline chosen from
    evidence (:func:`~agent.estimation.headline_choice.choose_model_headline`; ``shift_aware`` stays
    unless another estimator clearly does better out of sample)."""
    est_cal = est_cal.with_shift(sets.fit(seed))
    say("choosing the headline estimator on simulated shifts of the calibration split (shift_aware refitted per fold)")
    weak = {k: "the oracle separates right from wrong poorly" for k in ORACLE_ESTIMATORS if weak_oracle(est_cal)}
    evidence = choose_model_headline(sets, features, seed=seed, exclude=weak)
    reason = evidence.reason if evidence is not None else "too few calibration rows to choose on"
    say(f"headline estimator {evidence.chosen if evidence else RECOMMENDED_ESTIMATOR}: {reason}")
    return est_cal.with_headline(evidence)


def _manifest_headline(est_cal: EstimatorCalibration) -> str | None:
    """The headline the manifest names: None (``shift_aware``, the default) unless the evidence chose
    another; the table headline without a ``shift_aware`` calibration."""
    if est_cal.shift is None:
        return TABLE_HEADLINE
    chosen = est_cal.headline.chosen if est_cal.headline is not None else RECOMMENDED_ESTIMATOR
    return None if chosen == RECOMMENDED_ESTIMATOR else chosen


def fit_bundle(
    model: OnnxClassifier,
    train: Dataset,
    val: Dataset,
    *,
    idi_path: str | Path | None = None,
    params: FitParams = FitParams(),
    progress: Progress | None = None,
    features: str | None = None,
) -> FitReport:
    """Fit IDI/TDI/ADI for ``model`` and calibrate the oracle and estimators (paper §4, §5.4).

    ``params.decision_threshold`` becomes the model's (its labels are what the invariants judge).
    ``features``: the feature view the invariants read (``fit --features``; None chooses one from the
    model's signature, :func:`~agent.model.view_choice.choose_view`).
    """
    say = progress or (lambda _m: None)
    if train.y is None or val.y is None:
        missing = " and ".join(n for n, d in (("training", train), ("validation", val)) if d.y is None)
        raise UserError(
            f"fit needs labels, and the {missing} data has none: name a table's label column with "
            "--label-column (CSV/Parquet), or add an array y to the .npz"
        )
    if params.decision_threshold is not None and model.n_classes != 2:
        raise UserError(f"--decision-threshold applies to binary models only; this one has {model.n_classes} classes")
    model.decision_threshold = params.decision_threshold
    idi = IdiRuleSet.load(idi_path, model.classes) if idi_path else None
    train_x = source_of(model, train.x)
    val_x = source_of(model, val.x)
    train_y = label_indices(train.y, model.classes)
    val_y = label_indices(val.y, model.classes)
    rng = np.random.default_rng(params.seed)
    try:  # categories are read from every training value; a lazy source (image files) from a sample
        sample = train_x if isinstance(train_x, Inputs) else train_x.take(_subset(train_x.n, VIEW_SAMPLE, rng))
        view = choose_view(model, sample, features, feature_names=train.feature_names, seed=params.seed)
    except ViewError as exc:
        raise UserError(str(exc)) from None
    say(f"feature view: {view.kind}, {view.width} columns ({view.why})")
    model = model.with_view(view)
    feature_names = list(view.names) if view.names else train.feature_names
    val_metadata = dict(val.metadata)
    if idi is not None and isinstance(val_x, Inputs):  # the rules' named inputs are read with the metadata
        val_metadata.update(rule_values(val_x, idi.input_fields))
    train_pred, train_f = predict_and_view(model, train_x, "predict train")
    val_pred, val_f = predict_and_view(model, val_x, "predict validation")
    fitted = fit_oracle(
        train_f,
        train_y,
        val_f,
        val_y,
        val_pred.probabilities,
        idi=idi,
        val_metadata=val_metadata or None,
        params=params,
        feature_names=feature_names,
        class_names=model.classes,
        progress=say,
        val_predicted=val_pred.predicted,
    )
    tdi, adi = fitted.oracle.tdi, fitted.oracle.adi
    assert tdi is not None and adi is not None  # fit_oracle always builds both
    cal_idx = fitted.calibration_index
    cal_result = fitted.oracle.judge(
        val_f[cal_idx],
        val_pred.probabilities[cal_idx],
        val_pred.predicted[cal_idx],
        metadata={k: v[cal_idx] for k, v in val_metadata.items()} or None,
        feature_names=feature_names,
    )
    est_cal = EstimatorCalibration.fit(
        val_pred.confidences[cal_idx], val_pred.predicted[cal_idx] == val_y[cal_idx], cal_result.failed
    )
    single = model.signature.single
    if (
        isinstance(train_x, Inputs)
        and isinstance(val_x, Inputs)
        and single is not None
        and not single.is_string
        and single.fixed
    ):
        say("calibrating the shift-aware estimator on corrupted copies of the calibration split (generic + audit)")
        sets: CalibrationSets | None = calibration_sets(
            model,
            fitted.oracle,
            val_x[single.name][cal_idx],
            val_y[cal_idx],
            train_x=train_x[single.name],
            metadata={k: v[cal_idx] for k, v in val_metadata.items()} or None,
            feature_names=feature_names,
            n_sets=params.shift_sets,
            seed=params.seed,
        )
        sets_features = val_f[cal_idx]
    else:
        say("calibrating the shift-aware estimator on corrupted copies of the calibration split (per input kind)")
        large = isinstance(train_x, LazySource)  # image files: a bounded share of the calibration split
        shift_idx = _subset(len(cal_idx), LARGE_CALIBRATION, rng) if large else np.arange(len(cal_idx))
        cal_shift = cal_idx[np.sort(shift_idx)]
        sets = input_calibration_sets(
            model,
            fitted.oracle,
            val_x.take(cal_shift),
            val_y[cal_shift],
            train_x=train_x.take(_subset(train_x.n, LARGE_TRAIN_SAMPLE, rng)) if large else train_x.take(slice(None)),
            train_features=train_f,
            metadata={k: v[cal_shift] for k, v in val.metadata.items()} or None,
            rule_inputs=idi.input_fields if idi is not None else frozenset(),
            feature_names=feature_names,
            n_sets=params.shift_sets or (LARGE_SETS if large else None),
            seed=params.seed,
        )
        sets_features = val_f[cal_shift]
        if sets is None:
            say("shift-aware calibration: no corruption applies to these inputs; the headline is doc")
    if sets is not None:
        est_cal = _calibrate_shift_and_choose(est_cal, sets, sets_features, params.seed, say)
    single_numeric = single is not None and not single.is_string and single.fixed
    bundle = Bundle(
        model_sha256=model.sha256,
        input_shape=list(model.input_shape) if single_numeric else [],
        classes=model.classes,
        feature_names=feature_names,
        fit_params={**fitted.fit_params, **params.recorded(MODEL)},
        idi=idi,
        tdi=tdi,
        adi=adi,
        calibration=fitted.calibration,
        estimator_calibration=est_cal.to_dict(),
        decision_threshold=model.decision_threshold,
        headline=_manifest_headline(est_cal),
        inputs=None if single_numeric else model.signature.to_list(),
        feature_view=view.to_dict(),
    )
    return FitReport(
        bundle=bundle,
        calibration=est_cal,
        train_accuracy=float((train_pred.predicted == train_y).mean()),
        val_accuracy=float((val_pred.predicted == val_y).mean()),
        n_rules=len(tdi.rules),
        n_selected=len(tdi.selected_rules),
        coverage=float(tdi.coverage(val_f)),
    )
