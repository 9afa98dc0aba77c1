"""The judged calibration sets ``shift_aware`` is fitted from: the clean calibration split and its corrupted
copies, each passed through the model and judged by the oracle, and the reference the window statistics
compare with.

A model of one fixed numeric tensor (images, a table's columns in one array) has its inputs corrupted as a
whole (:func:`calibration_sets`, :mod:`agent.offline.calibration.corruptions`); a model of named inputs,
text, categories, token ids or image files input by input, a batch at a time (:func:`input_calibration_sets`,
:mod:`agent.offline.calibration.input_corruptions`). Both read the model through the one offline loop,
:func:`agent.offline.viewing.predict_and_view`, and judge every copy the same way
(:func:`agent.offline.calibration.judged.judge_set`); only one corrupted copy exists at a time.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from agent.estimation.estimators.shift_calibration import ShiftCalibration
from agent.estimation.statistics.reference import InputReference
from agent.model.classifier import OnnxClassifier
from agent.model.inputs import Inputs
from agent.offline.calibration.corruptions import FAMILIES, is_image_input, iter_shifted_sets, schedule
from agent.offline.calibration.estimators.shift_fitting import ShiftFit, fit_shift, fit_shift_calibration
from agent.offline.calibration.held_out_kinds import iter_held_out_sets
from agent.offline.calibration.input_corruptions import InputCorruption, input_corruptions
from agent.offline.calibration.judged import JudgedSet, judge_set
from agent.offline.fit_progress import expect_rows
from agent.offline.viewing import Transform, Viewed, predict_and_view
from invariants.fit_params import CalibrationPlan
from invariants.oracle import Oracle


@dataclass(frozen=True)
class CalibrationSets:
    """What ``shift_aware`` is fitted from, and the headline's choice reuses: the judged clean calibration
    split, its judged corrupted copies (row ``i`` of each is row ``i`` of the split) and the reference; and
    ``held_out``, judged copies of the kinds of shift no ``shift_aware`` fit sees
    (:mod:`agent.offline.calibration.held_out_kinds`), which only the flag's fit reads."""

    clean: JudgedSet
    shifted: list[JudgedSet]
    reference: InputReference
    held_out: list[JudgedSet] = field(default_factory=list)

    def fit(
        self,
        seed: int,
        rows: np.ndarray | None = None,
        *,
        interval: bool = True,
        plan: CalibrationPlan = CalibrationPlan(),
    ) -> ShiftCalibration:
        """``shift_aware``'s calibration from these sets' ``rows`` (all by default; the reference's clean
        statistics are those rows'); ``interval=False`` skips the refits behind its interval's error term."""
        folds = plan.interval_folds if interval else 0
        if rows is None:
            return fit_shift_calibration(self.clean, self.shifted, self.reference, plan=plan, folds=folds, seed=seed)
        clean = self.clean.take(rows)
        reference = self.reference
        if clean.extras is not None:
            reference = reference.with_clean(clean.extras.pca_error, clean.extras.label, clean.confidences)
        shifted = [s.take(rows) for s in self.shifted]
        return fit_shift_calibration(clean, shifted, reference, plan=plan, folds=folds, seed=seed)

    def fit_with_refits(self, seed: int, *, plan: CalibrationPlan = CalibrationPlan()) -> ShiftFit:
        """``shift_aware``'s calibration from every row, and the refits behind its interval, each without one
        group of related corruptions (what the flag "this number may be wrong" is calibrated with)."""
        return fit_shift(self.clean, self.shifted, self.reference, plan=plan, seed=seed)


def _reference(
    model: OnnxClassifier, oracle: Oracle, train_features: np.ndarray, clean: Viewed, *, per_feature_scale: bool
) -> InputReference:
    """The PCA of the training view, the TDI leaf table and the clean per-class confidences ``shift_aware``
    compares live windows with."""
    tdi = oracle.tdi
    return InputReference.fit(
        train_features,
        clean.features,
        per_feature_scale=per_feature_scale,
        rule_label=[r.label for r in tdi.rules] if tdi is not None else (),
        rule_selected=[r.selected for r in tdi.rules] if tdi is not None else (),
        train_rules=tdi.rule_index(train_features) if tdi is not None else None,
        clean_labels=clean.prediction.predicted,
        clean_confidences=clean.prediction.confidences,
        n_classes=model.n_classes,
    )


def _judged_sets(
    oracle: Oracle,
    clean: Viewed,
    copies: Iterable[tuple[str, Viewed]],
    y_cal: np.ndarray,
    reference: InputReference,
    metadata: Mapping[str, np.ndarray] | None,
    feature_names: Sequence[str] | None,
    held_out: Iterable[tuple[str, Viewed]] = (),
) -> CalibrationSets:
    """The clean split, its corrupted ``copies`` and the copies of the ``held_out`` kinds (judged as they are
    made: one exists at a time)."""
    judge = partial(
        judge_set, y=y_cal, oracle=oracle, reference=reference, metadata=metadata, feature_names=feature_names
    )
    shifted = [judge(name, viewed) for name, viewed in copies]
    return CalibrationSets(judge("clean", clean), shifted, reference, [judge(n, v) for n, v in held_out])


def calibration_sets(
    model: OnnxClassifier,
    oracle: Oracle,
    x_cal: np.ndarray,
    y_cal: np.ndarray,
    *,
    train_x: np.ndarray,
    metadata: Mapping[str, np.ndarray] | None = None,
    feature_names: Sequence[str] | None = None,
    n_sets: int | None,
    seed: int,
    families: Sequence[str] = FAMILIES,
    exclude: Collection[str] = (),
    train_features: np.ndarray | None = None,
    clean: Viewed | None = None,
    plan: CalibrationPlan = CalibrationPlan(),
) -> CalibrationSets:
    """The judged clean and corrupted calibration sets of a model of one numeric tensor and its oracle, and
    their reference. ``x_cal``/``train_x`` are the prepared tensor's arrays, ``y_cal`` class indices;
    ``n_sets`` and ``seed`` are the fit's (:attr:`~invariants.fit_params.FitParams.shift_sets`,
    :attr:`~invariants.fit_params.FitParams.seed`). ``train_features`` (the view of ``train_x``) and
    ``clean`` (the model's pass over ``x_cal``), where ``fit`` has them already, spare the model a pass
    over each. The model runs in the offline batches of its signature
    (:meth:`~agent.model.inputs.Signature.batch_rows`). Beside the copies, ``plan``'s
    :attr:`~invariants.fit_params.CalibrationPlan.flag_held_out_sets` copies of each held-out kind
    (:mod:`agent.offline.calibration.held_out_kinds`; ``exclude`` applies to them too)."""

    def viewed(x: np.ndarray) -> Viewed:
        return predict_and_view(model, model.prepare_file(x))

    clean = clean if clean is not None else viewed(x_cal)
    per_feature_scale = not is_image_input(model.input_shape) or model.view.kind != "raw"
    train_f = train_features if train_features is not None else viewed(train_x).features
    reference = _reference(model, oracle, train_f, clean, per_feature_scale=per_feature_scale)
    sets = iter_shifted_sets(
        x_cal, model.input_shape, train_x=train_x, n_sets=n_sets, seed=seed, families=families, exclude=exclude
    )
    copies = ((s.name, viewed(s.x.astype(x_cal.dtype, copy=False))) for s in sets)
    unseen = iter_held_out_sets(
        x_cal, model.input_shape, train_x=train_x, per_kind=plan.flag_held_out_sets, seed=seed, exclude=exclude
    )
    held_out = ((s.name, viewed(s.x.astype(x_cal.dtype, copy=False))) for s in unseen)
    return _judged_sets(oracle, clean, copies, y_cal, reference, metadata, feature_names, held_out)


def _at(corrupt: InputCorruption, strength: float, rng: np.random.Generator) -> Transform:
    """``corrupt`` at one strength, as a change of each batch (drawing from the fit's ``rng``)."""
    return lambda batch: corrupt(batch, strength, rng)


def input_calibration_sets(
    model: OnnxClassifier,
    oracle: Oracle,
    x_cal: Inputs,
    y_cal: np.ndarray,
    *,
    train_x: Inputs,
    train_features: np.ndarray | None = None,
    metadata: Mapping[str, np.ndarray] | None = None,
    rule_inputs: frozenset[str] = frozenset(),
    feature_names: Sequence[str] | None = None,
    n_sets: int | None,
    seed: int,
) -> CalibrationSets | None:
    """The judged clean and corrupted calibration sets of a model of named inputs, and their reference
    (None when no corruption applies); each copy is corrupted a batch at a time, so that a corrupted copy of
    large inputs (hundreds of 224×224 images, in float64 while they are transformed) never exists whole.

    ``train_x`` sets the corruptions' parameters (pixel range, column spreads, vocabulary) and may be a
    sample; ``train_features``, the view of the whole training split when ``fit`` has it, is the reference
    the window statistics compare with (without it: the view of ``train_x``)."""
    corruptions = input_corruptions(model, train_x)
    if not corruptions:
        return None
    rng = np.random.default_rng(seed)
    train_f = train_features if train_features is not None else predict_and_view(model, train_x).features
    clean = predict_and_view(model, x_cal, rule_inputs=rule_inputs)
    reference = _reference(model, oracle, train_f, clean, per_feature_scale=True)
    planned = schedule(sorted(corruptions), n_sets, rng)
    expect_rows(len(planned) * x_cal.n)
    copies = (
        (name, predict_and_view(model, x_cal, transform=_at(corruptions[name], s, rng), rule_inputs=rule_inputs))
        for name, s in planned
    )
    return _judged_sets(oracle, clean, copies, y_cal, reference, metadata, feature_names)
