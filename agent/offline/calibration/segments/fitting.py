"""The segments of a bundle, defined at ``fit`` from what the fit already has: the feature view and its
column names, the training view and labels, the TDI tree, and the labeled validation data with its
calibration split (:mod:`agent.estimation.segments.segmentation` computes them per batch afterwards).

Which kinds a bundle gets follows from its view
(:func:`~agent.offline.calibration.segments.data.column_groups`): a table view (named columns: one-hot groups
of categories, numeric columns) is cut by its columns; images, text, token ids and any
embedding, pooled, hashed or projected view by regions of the view; every bundle by the predicted class and
by its selected TDI rules. The sizes are :class:`~invariants.fit_params.CalibrationPlan`'s and the bound on
the total is ``fit --max-segments``: the predicted class first, then the rules, the regions, and the table
columns (the most class-informative first) while the bound allows. Each kind is one module of
:mod:`agent.offline.calibration.segments.kinds`, listed in its registry in that order.
"""

from __future__ import annotations

import numpy as np

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.segments.kinds.registry import KINDS
from agent.estimation.segments.segmentation import (
    Dimension,
    Segmentation,
    bounded_dimensions,
    dimension_ids,
    reference_of,
)
from agent.model.classifier import label_confidences
from agent.offline.calibration.segments.change import define_change
from agent.offline.calibration.segments.data import SegmentData, ViewShape
from agent.offline.calibration.segments.kinds.registry import FITS
from invariants.fit_params import CalibrationPlan


def define_segments(
    data: SegmentData,
    shape: ViewShape,
    calibration: EstimatorCalibration,
    *,
    max_segments: int,
    plan: CalibrationPlan = CalibrationPlan(),
    seed: int = 0,
) -> Segmentation | None:
    """The bundle's segments (None: ``max_segments`` below 2, or nothing to cut by) with their reference on
    the labeled validation data (see the module docstring)."""
    budget = max_segments
    dims: list[Dimension] = []
    for fit in FITS.values():  # in the order they take from the budget
        if budget < 2 and not fit.whole:  # a dimension of one segment cuts nothing
            continue
        for dim in fit.define(data, shape, plan, budget, seed):
            if fit.whole and len(dim.segments) > budget:
                continue
            dims.append(dim)
            budget -= len(dim.segments)
    if not dims:
        return None
    order = {k: i for i, k in enumerate(KINDS)}
    dims = list(bounded_dimensions(sorted(dims, key=lambda d: order[d.kind])))  # stable: columns keep their rank
    rules = data.tdi.rule_index(data.val_features) if data.tdi is not None else None
    ids = dimension_ids(dims, data.val_features, data.val_predicted, rules, len(data.val_y))
    size = sum(len(d.segments) for d in dims)
    shift = calibration.shift
    novel = None
    if shift is not None and shift.reference.pca_edges:  # as novel_inputs reads a live prediction
        novel = shift.reference.pca_error(data.val_features) > shift.reference.pca_edges[-1]
    reference = reference_of(
        ids,
        size,
        data.val_predicted == data.val_y,
        label_confidences(data.val_probabilities, data.val_predicted),
        calibration_rows=data.calibration_index,
        failed=np.asarray(data.calibration_verdicts) != 0,
        novel=novel,
    )
    return Segmentation(tuple(dims), reference, define_change(data, shape, ids, size, seed))
