"""``column`` at ``fit``: the table columns of the view (:mod:`agent.estimation.segments.kinds.column` reads
them)."""

from __future__ import annotations

import numpy as np

from agent.estimation.segments.kinds import column as serving
from agent.estimation.segments.segmentation import Dimension
from agent.offline.calibration.segments.data import ColumnGroup, SegmentData, ViewShape
from agent.offline.calibration.segments.kinds.base import SegmentKindFit
from invariants.fit_params import CalibrationPlan
from invariants.tdi import format_threshold


class Column(SegmentKindFit):
    """The table columns of the view, each taken whole while the budget allows."""

    kind = serving.Column
    whole = True

    def define(
        self, data: SegmentData, shape: ViewShape, plan: CalibrationPlan, budget: int, seed: int
    ) -> list[Dimension]:
        return _columns(data, shape, plan)


def _columns(data: SegmentData, shape: ViewShape, plan: CalibrationPlan) -> list[Dimension]:
    """One dimension per table column, the most class-informative (mutual information with the training
    labels) first, at most :attr:`CalibrationPlan.segment_columns`."""
    x = np.asarray(data.train_features).reshape(len(data.train_features), -1)
    scored: list[tuple[float, int, Dimension]] = []
    for i, group in enumerate(shape.columns):
        dim = _onehot(group, x, plan) if group.onehot else _numeric(group, x, plan)
        if dim is None or len(dim.segments) < 2:
            continue
        local = dim.local_ids(x, None, None)
        assert local is not None
        scored.append((-information(local, data.train_y), i, dim))
    scored.sort(key=lambda t: (t[0], t[1]))
    return [dim for _, _, dim in scored[: plan.segment_columns]]


def information(ids: np.ndarray, y: np.ndarray) -> float:
    """Mutual information (nats) between the segment and the class, from their joint counts."""
    joint = np.zeros((int(ids.max()) + 1, int(y.max()) + 1))
    np.add.at(joint, (ids, y), 1.0)
    p = joint / joint.sum()
    outer = p.sum(axis=1, keepdims=True) @ p.sum(axis=0, keepdims=True)
    nz = p > 0
    return float((p[nz] * np.log(p[nz] / outer[nz])).sum())


def _onehot(group: ColumnGroup, x: np.ndarray, plan: CalibrationPlan) -> Dimension:
    """A categorical column: its most frequent values, the rarer ones together, the unseen ones together."""
    counts = x[:, list(group.columns)].sum(axis=0)
    known = len(group.values) - 1  # the last column is "(other)": values not seen at fit
    order = [int(i) for i in np.argsort(-counts[:known], kind="stable")]
    own_cap = plan.segment_values - 1 - (known > plan.segment_values - 1)
    own = order[: max(own_cap, 1)] if known > plan.segment_values - 1 else order
    names = [f"{group.name}={group.values[i]}" for i in own]
    lookup = [0] * len(group.values)
    for j, i in enumerate(own):
        lookup[i] = j
    if len(own) < known:
        names.append(f"{group.name}=other values")
        for i in order[len(own) :]:
            lookup[i] = len(names) - 1
    names.append(f"{group.name} unseen at fit")
    lookup[known] = len(names) - 1
    return Dimension(
        serving.Column.name, group.name, "onehot", tuple(names), columns=group.columns, lookup=tuple(lookup)
    )


def _numeric(group: ColumnGroup, x: np.ndarray, plan: CalibrationPlan) -> Dimension | None:
    """A numeric column: its values when few (codes, counts, flags), else its quantile bins."""
    j = group.columns[0]
    col = np.asarray(x[:, j], dtype=np.float64)
    col = col[np.isfinite(col)]
    if len(col) == 0:
        return None
    values, counts = np.unique(col, return_counts=True)
    if len(values) <= plan.segment_discrete:
        order = np.argsort(-counts, kind="stable")
        cap = plan.segment_values - 1
        own = sorted(int(i) for i in order[:cap])
        names = [f"{group.name}={format_threshold(values[i])}" for i in own]
        lookup = list(range(len(own)))
        names.append(f"{group.name}=other values")
        return Dimension(
            serving.Column.name,
            group.name,
            "values",
            tuple(names),
            columns=(j,),
            lookup=tuple(lookup),
            edges=tuple(float(values[i]) for i in own),
        )
    qs = np.arange(1, plan.segment_bins) / plan.segment_bins
    edges = [float(e) for e in np.unique(np.quantile(col, qs))]
    if not edges:
        return None
    names = [f"{group.name} < {format_threshold(edges[0])}"]
    names += [
        f"{group.name} in [{format_threshold(a)}, {format_threshold(b)})"
        for a, b in zip(edges, edges[1:], strict=False)
    ]
    names.append(f"{group.name} >= {format_threshold(edges[-1])}")
    return Dimension(serving.Column.name, group.name, "bins", tuple(names), columns=(j,), edges=tuple(edges))
