"""A reference table's fit source (:mod:`agent.offline.tables`): its rows split, stratified by label, into the
TDIs' part and validation; no model to pass corrupted inputs through, so the classic estimators' calibration
is the whole; the bundle recording the table's columns instead of a model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.data.files import label_indices
from agent.data.tables import TableBatch, TableColumns
from agent.errors import UserError
from agent.estimation.pairs.calibration import PairCalibration
from agent.model.classifier import predicted_classes_of
from agent.offline.calibration.segments.data import ViewShape, column_groups
from agent.offline.fit_pair import pair_of_table
from agent.offline.fit_source import (
    Calibrated,
    FitSource,
    FittedParts,
    OracleData,
    OracleFit,
    Progress,
    threshold_applies,
)
from invariants.bundle import Bundle, TableSource
from invariants.fit_params import TABLE, CalibrationPlan, FitParams
from invariants.fitting import stratified_split
from invariants.idi import IdiRuleSet


@dataclass(frozen=True)
class TableData:
    """Stage 1 of a table's fit: the reference rows split into the TDIs' part and validation, every row's
    class index and predicted class (with the fit's decision threshold), and the oracle's data."""

    y: np.ndarray
    predicted: np.ndarray
    train_index: np.ndarray
    val_index: np.ndarray
    oracle_data: OracleData


@dataclass(frozen=True)
class TableFitSource(FitSource[TableData]):
    """A table's fit as asked: the reference rows, their columns and classes, the IDI rules' file, the fit's
    parameters and calibration plan, and a champion's probabilities of the same rows (None: no champion)."""

    ref: TableBatch
    columns: TableColumns
    classes: Sequence[str]
    idi_path: str | Path | None = None
    params: FitParams = FitParams()
    plan: CalibrationPlan = CalibrationPlan()
    champion_probabilities: np.ndarray | None = None

    def read(self, say: Progress) -> TableData:
        """The rows split, stratified by label, into a training part (the TDIs) and a validation part (the
        ADIs and the calibration split), and the IDI rules."""
        ref, classes, params = self.ref, self.classes, self.params
        if ref.y is None:
            raise UserError("fit needs labels: name the reference table's label column (--label-column)")
        threshold_applies(params.decision_threshold, len(classes))
        if ref.probabilities.shape[1] != len(classes):
            raise UserError(f"{ref.probabilities.shape[1]} probability columns but {len(classes)} classes")
        y = label_indices(ref.y, classes)
        predicted = predicted_classes_of(ref.probabilities, params.decision_threshold)
        val_idx, train_idx = stratified_split(y, params.train_fraction, params.seed)
        if len(train_idx) == 0 or len(val_idx) < 4:
            raise UserError(f"{len(y)} reference rows are too few to split into training and validation parts")
        say(f"reference: {len(y)} rows, {len(train_idx)} for the TDIs, {len(val_idx)} for the ADIs and calibration")
        idi = IdiRuleSet.load(self.idi_path, list(classes)) if self.idi_path else None
        data = OracleData(
            train_features=ref.x[train_idx],
            train_y=y[train_idx],
            val_features=ref.x[val_idx],
            val_y=y[val_idx],
            val_probabilities=ref.probabilities[val_idx],
            val_predicted=predicted[val_idx],
            val_metadata={k: v[val_idx] for k, v in ref.metadata.items()},
            feature_names=list(self.columns.features),
            classes=list(classes),
            idi=idi,
        )
        return TableData(y, predicted, train_idx, val_idx, data)

    def calibrate(self, data: TableData, fit: OracleFit, say: Progress) -> Calibrated:
        """The classic estimators' calibration is the whole; the headline is chosen on the calibration split's
        rows."""
        return Calibrated(fit.classic, None, data.oracle_data.val_features[fit.calibration_index])

    def view_shape(self, data: TableData) -> ViewShape:
        """The table's feature columns."""
        return column_groups(None, None, data.oracle_data.feature_names)

    def bundle(self, data: TableData, parts: FittedParts) -> Bundle:
        """The bundle with the table's columns instead of a model."""
        columns = self.columns
        return Bundle(
            model_sha256=None,
            input_shape=[len(columns.features)],
            classes=data.oracle_data.classes,
            feature_names=list(columns.features),
            fit_params={**parts.fit_params, **self.params.recorded(TABLE), "source": TABLE},
            idi=parts.idi,
            tdi=parts.tdi,
            adi=parts.adi,
            calibration=parts.calibration,
            estimator_calibration=parts.estimator_calibration,
            table=TableSource(columns.proba, columns.features, columns.label),
            decision_threshold=self.params.decision_threshold,
            headline=parts.headline,
        )

    def correct(self, data: TableData) -> tuple[np.ndarray, np.ndarray]:
        correct = data.predicted == data.y
        return correct[data.train_index], correct[data.val_index]

    @property
    def pairs(self) -> bool:
        return self.champion_probabilities is not None

    def pair(self, data: TableData, say: Progress) -> PairCalibration:
        """The pair known by the table's two sets of probability columns
        (:func:`~agent.offline.fit_pair.pair_of_table`)."""
        assert self.champion_probabilities is not None
        return pair_of_table(self.ref, self.champion_probabilities, data.y, self.params, self.plan)
