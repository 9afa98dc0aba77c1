"""A model's fit source: the model, its labeled training and validation sets, read through the feature view
chosen for it; ``shift_aware`` calibrated on corrupted copies of the calibration split passed through the
model; the bundle recording the model's digest, inputs, view, threshold and preprocessing.

The model is never changed: the source reads a copy with the fit's decision threshold and view. Every size
the calibration draws is the :class:`~invariants.fit_params.CalibrationPlan`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.data.files import Dataset, label_indices
from agent.errors import UserError
from agent.estimation.pairs.calibration import PairCalibration
from agent.model.classifier import OnnxClassifier
from agent.model.inputs import Inputs, rule_values
from agent.model.view_choice import choose_view
from agent.model.views import FeatureView, ViewError
from agent.offline.calibration.corruptions import calibration_family, is_image_input
from agent.offline.calibration.held_out_kinds import HELD_OUT_KINDS
from agent.offline.calibration.segments.data import ViewShape, column_groups
from agent.offline.calibration.sets import CalibrationSets, calibration_sets, input_calibration_sets
from agent.offline.fit_pair import pair_of_model
from agent.offline.fit_progress import expect_rows
from agent.offline.fit_source import (
    Calibrated,
    FitSource,
    FittedParts,
    OracleData,
    OracleFit,
    Progress,
    threshold_applies,
)
from agent.offline.viewing import LazySource, Viewed, predict_and_view, source_of, subset
from invariants.bundle import Bundle
from invariants.fit_params import MODEL, CalibrationPlan, FitParams
from invariants.idi import IdiRuleSet


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


def _one_numeric_tensor(model: OnnxClassifier) -> bool:
    """Whether the model reads one numeric tensor of a fixed shape (corrupted whole, recorded by its shape)."""
    single = model.signature.single
    return single is not None and not single.is_string and single.fixed


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


@dataclass(frozen=True)
class ModelFitSource(FitSource[ModelData]):
    """A model's fit as asked: the model, its labeled training and validation sets, the IDI rules' file, the
    fit's parameters and calibration plan, how image files become inputs (``preprocess``, recorded in the
    bundle so that ``check`` reads them the same way; None for data in memory) and the champion it is a
    challenger of (None: none)."""

    model: OnnxClassifier
    train: Dataset
    val: Dataset
    idi_path: str | Path | None = None
    params: FitParams = FitParams()
    plan: CalibrationPlan = CalibrationPlan()
    preprocess: Mapping[str, Any] | None = None
    champion: OnnxClassifier | None = None

    def read(self, say: Progress) -> ModelData:
        """The IDI rules, the feature view chosen for the model (``params.features``, else from its inputs;
        categories are read from every training value, a file source's from a sample), and both sets
        predicted and viewed through it."""
        params, train, val = self.params, self.train, self.val
        _labeled(train, val)
        threshold_applies(params.decision_threshold, self.model.n_classes)
        model = self.model.with_decision_threshold(params.decision_threshold)
        idi = IdiRuleSet.load(self.idi_path, model.classes) if self.idi_path else None
        train_x, val_x = source_of(model, train.x), source_of(model, val.x)
        assert train.y is not None and val.y is not None
        train_y, val_y = label_indices(train.y, model.classes), label_indices(val.y, model.classes)
        rng = np.random.default_rng(params.seed)
        view = self._view(model, train_x, rng)
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

    def _view(self, model: OnnxClassifier, train_x: Inputs | LazySource, rng: np.random.Generator) -> FeatureView:
        """The feature view the invariants read, chosen on the training set (a sample of a file source)."""
        params = self.params
        try:
            sample = (
                train_x if isinstance(train_x, Inputs) else train_x.take(subset(train_x.n, self.plan.view_sample, rng))
            )
            return choose_view(model, sample, params.features, feature_names=self.train.feature_names, seed=params.seed)
        except ViewError as exc:
            raise UserError(str(exc)) from None

    def calibrate(self, data: ModelData, fit: OracleFit, say: Progress) -> Calibrated:
        """``shift_aware`` fitted on judged corrupted copies of the calibration split: one numeric tensor
        corrupted whole, else input by input (image files: a sample of the split and of the training set,
        :class:`~invariants.fit_params.CalibrationPlan`)."""
        train_x, val_x = data.train_x, data.val_x
        if isinstance(train_x, Inputs) and isinstance(val_x, Inputs) and _one_numeric_tensor(data.model):
            sets, rows = self._tensor_sets(data, train_x, val_x, fit, say)
        else:
            sets, rows = self._input_sets(data, fit, say)
        if sets is None:
            return Calibrated(fit.classic)
        shift = sets.fit_with_refits(self.params.seed, plan=self.plan)
        return Calibrated(fit.classic.with_shift(shift.calibration), sets, data.oracle_data.val_features[rows], shift)

    def _tensor_sets(
        self, data: ModelData, train_x: Inputs, val_x: Inputs, fit: OracleFit, say: Progress
    ) -> tuple[CalibrationSets | None, np.ndarray]:
        """Corrupted copies of one numeric tensor, corrupted whole (a wide one: bounded in rows)."""
        params, plan, model, od = self.params, self.plan, data.model, data.oracle_data
        single = model.signature.single
        assert single is not None
        rows, n_sets = _tensor_copies(model, plan, params, train_x[single.name], fit.calibration_index, data.rng_state)
        say(
            "calibrating the shift-aware estimator on corrupted copies of the calibration split (generic + audit)"
            + (f": {n_sets} copies of {len(rows)} rows (wide inputs)" if n_sets is not None else "")
        )
        held_out = plan.flag_held_out_sets * max(len(k) for k in HELD_OUT_KINDS.values())
        expect_rows(len(rows) * ((n_sets or plan.min_sets) + held_out))
        sets = calibration_sets(
            model,
            fit.fitted.oracle,
            val_x[single.name][rows],
            od.val_y[rows],
            train_x=train_x[single.name],
            metadata={k: v[rows] for k, v in od.val_metadata.items()} or None,
            feature_names=od.feature_names,
            n_sets=n_sets,
            seed=params.seed,
            train_features=od.train_features,
            clean=data.val.take(rows),
            plan=plan,
        )
        return sets, rows

    def _input_sets(self, data: ModelData, fit: OracleFit, say: Progress) -> tuple[CalibrationSets | None, np.ndarray]:
        """Corrupted copies input by input (image files: a bounded share of the calibration split)."""
        say("calibrating the shift-aware estimator on corrupted copies of the calibration split (per input kind)")
        params, plan, od, cal_idx = self.params, self.plan, data.oracle_data, fit.calibration_index
        train_x, val_x = data.train_x, data.val_x
        rng = _resumed(data.rng_state)
        large = isinstance(train_x, LazySource)
        shift_idx = subset(len(cal_idx), plan.lazy_calibration, rng) if large else np.arange(len(cal_idx))
        rows = cal_idx[np.sort(shift_idx)]
        sets = input_calibration_sets(
            data.model,
            fit.fitted.oracle,
            val_x.take(rows),
            od.val_y[rows],
            train_x=train_x.take(subset(train_x.n, plan.lazy_train_sample, rng) if large else slice(None)),
            train_features=od.train_features,
            metadata={k: v[rows] for k, v in self.val.metadata.items()} or None,
            rule_inputs=od.idi.input_fields if od.idi is not None else frozenset(),
            feature_names=od.feature_names,
            n_sets=params.shift_sets or (plan.lazy_sets if large else None),
            seed=params.seed,
        )
        if sets is None:
            say("shift-aware calibration: no corruption applies to these inputs; the headline is doc")
        return sets, rows

    def view_shape(self, data: ModelData) -> ViewShape:
        """The view's table columns, or regions of it
        (:func:`~agent.offline.calibration.segments.data.column_groups`)."""
        return column_groups(data.view, data.model.signature, data.oracle_data.feature_names)

    def bundle(self, data: ModelData, parts: FittedParts) -> Bundle:
        """The bundle with the model's digest and inputs, the view, the threshold and the image files'
        preprocessing."""
        model, single_numeric = data.model, _one_numeric_tensor(data.model)
        return Bundle(
            model_sha256=model.sha256,
            input_shape=list(model.input_shape) if single_numeric else [],
            classes=model.classes,
            feature_names=data.oracle_data.feature_names,
            fit_params={**parts.fit_params, **self.params.recorded(MODEL)},
            idi=parts.idi,
            tdi=parts.tdi,
            adi=parts.adi,
            calibration=parts.calibration,
            estimator_calibration=parts.estimator_calibration,
            decision_threshold=model.decision_threshold,
            headline=parts.headline,
            inputs=None if single_numeric else model.signature.to_list(),
            feature_view=data.view.to_dict(),
            preprocess=dict(self.preprocess) if self.preprocess is not None else None,
        )

    def correct(self, data: ModelData) -> tuple[np.ndarray, np.ndarray]:
        od = data.oracle_data
        return data.train.prediction.predicted == od.train_y, od.val_predicted == od.val_y

    @property
    def pairs(self) -> bool:
        return self.champion is not None

    def pair(self, data: ModelData, say: Progress) -> PairCalibration:
        """Both models on the validation split and its corrupted copies
        (:func:`~agent.offline.fit_pair.pair_of_model`)."""
        assert self.champion is not None
        return pair_of_model(
            data.model, self.champion, data.val_x, data.train_x, data.oracle_data.val_y, self.params, self.plan, say
        )
