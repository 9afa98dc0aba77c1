"""``predicted`` at ``fit``: the predicted class (:mod:`agent.estimation.segments.kinds.predicted` reads it)."""

from __future__ import annotations

import numpy as np

from agent.estimation.segments.kinds import predicted as serving
from agent.estimation.segments.segmentation import Dimension
from agent.offline.calibration.segments.data import SegmentData, ViewShape
from agent.offline.calibration.segments.kinds.base import SegmentKindFit
from invariants.fit_params import CalibrationPlan


class Predicted(SegmentKindFit):
    """The predicted classes, the most frequent on the validation set first, as many as
    :attr:`~invariants.fit_params.CalibrationPlan.segment_classes` and the budget allow (the rest together)."""

    kind = serving.Predicted

    def define(
        self, data: SegmentData, shape: ViewShape, plan: CalibrationPlan, budget: int, seed: int
    ) -> list[Dimension]:
        return [_predicted(data, plan, budget)]


def _predicted(data: SegmentData, plan: CalibrationPlan, budget: int) -> Dimension:
    k = len(data.classes)
    counts = np.bincount(np.asarray(data.val_predicted, dtype=np.int64), minlength=k)[:k]
    cap = min(plan.segment_classes, budget)
    if k <= cap:
        return Dimension(
            serving.Predicted.name,
            "predicted class",
            "predicted",
            tuple(f"predicted={c}" for c in data.classes),
            lookup=tuple(range(k)),
        )
    top = [int(i) for i in np.argsort(-counts, kind="stable")[: cap - 1]]
    lookup = [top.index(i) if i in top else cap - 1 for i in range(k)]
    names = (*(f"predicted={data.classes[i]}" for i in top), "predicted=other classes")
    return Dimension(serving.Predicted.name, "predicted class", "predicted", names, lookup=tuple(lookup))
