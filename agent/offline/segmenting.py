"""The segments of a bundle, defined at ``fit`` from what the fit already has: the feature view and its
column names, the training view and labels, the TDI tree, and the labeled validation data with its
calibration split (:mod:`agent.estimation.segments.segmentation` computes them per batch afterwards).

Which kinds a bundle gets follows from its view (:func:`column_groups`): a table view (named columns:
one-hot groups of categories, numeric columns) is cut by its columns; images, text, token ids and any
embedding, pooled, hashed or projected view by regions of the view; every bundle by the predicted class and
by its selected TDI rules. The sizes are :class:`~invariants.fit_params.CalibrationPlan`'s and the bound on
the total is ``fit --max-segments``: the predicted class first, then the rules, the regions, and the table
columns (the most class-informative first) while the bound allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.segments.segmentation import (
    COLUMN,
    PREDICTED,
    REGION,
    RULE,
    Dimension,
    Segmentation,
    dimension_ids,
    reference_of,
)
from agent.model.classifier import label_confidences
from agent.model.inputs import Signature
from agent.model.views import FeatureView, input_width, is_image
from invariants.fit_params import CalibrationPlan
from invariants.tdi import TdiRule, TrainingInvariants, format_threshold

#: Widest raw numeric input read as table columns (wider ones are images or vectors: cut by regions).
MAX_TABLE_INPUT = 64
#: k-means: Lloyd iterations and restarts of the seeding.
KMEANS_ITERATIONS = 30
KMEANS_RESTARTS = 3
#: Dimensions of the view the regions are clustered in (its leading principal components).
REGION_COMPONENTS = 16


@dataclass(frozen=True)
class ColumnGroup:
    """A table column of the view: a one-hot group of a categorical input (``columns``, ``values`` the
    categories, the last ``(other)``: unseen at fit) or one numeric column."""

    name: str
    columns: tuple[int, ...]
    values: tuple[str, ...] = ()

    @property
    def onehot(self) -> bool:
        return bool(self.values)


@dataclass(frozen=True)
class ViewShape:
    """What the view's columns are: table columns, and whether part of it is cut by regions instead."""

    columns: tuple[ColumnGroup, ...]
    regions: bool


def column_groups(view: FeatureView | None, signature: Signature | None, names: Sequence[str] | None) -> ViewShape:
    """The table columns of a view (``view`` None: a reference table, every feature a numeric column named
    by ``names``), and whether it needs regions (images, text, tokens, embedding/pooled/hashed/projected)."""
    if view is None or signature is None:
        cols = names or ()
        return ViewShape(tuple(ColumnGroup(str(n), (j,)) for j, n in enumerate(cols)), regions=not cols)
    if view.kind != "raw" or view.projected or view.embedding is not None:
        return ViewShape((), regions=True)
    groups: list[ColumnGroup] = []
    regions = False
    offset = 0
    view_names = list(view.names) if len(view.names) == view.width else [f"x[{j}]" for j in range(view.width)]
    for v in view.inputs:
        spec = signature.get(v.name)
        if v.encoding == "skip" or spec is None:
            continue
        width = input_width(v, spec)
        if v.encoding == "onehot":
            values = (*v.categories, "(other)")
            groups.append(ColumnGroup(v.name, tuple(range(offset, offset + width)), values))
        elif v.encoding == "raw" and not is_image(spec) and width <= MAX_TABLE_INPUT:
            groups += [ColumnGroup(view_names[offset + j], (offset + j,)) for j in range(width)]
        else:
            regions = True
        offset += width
    return ViewShape(tuple(groups), regions=regions or not groups)


@dataclass(frozen=True)
class SegmentData:
    """What segments are defined from: the training view and labels, the validation view, labels,
    probabilities and predicted classes, the calibration split (indices into the validation rows) with its
    oracle verdicts, the TDI tree and the class names."""

    train_features: np.ndarray
    train_y: np.ndarray
    val_features: np.ndarray
    val_y: np.ndarray
    val_probabilities: np.ndarray
    val_predicted: np.ndarray
    calibration_index: np.ndarray
    calibration_verdicts: np.ndarray
    tdi: TrainingInvariants | None
    classes: Sequence[str]


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
    for make in (_predicted, _rules, _regions):
        if budget < 2:
            break
        dim = make(data, shape, plan, budget, seed)
        if dim is not None:
            dims.append(dim)
            budget -= len(dim.segments)
    for dim in _columns(data, shape, plan):
        if len(dim.segments) <= budget:
            dims.append(dim)
            budget -= len(dim.segments)
    if not dims:
        return None
    order = {k: i for i, k in enumerate((PREDICTED, COLUMN, RULE, REGION))}
    dims.sort(key=lambda d: order[d.kind])  # stable: columns keep their rank
    rules = data.tdi.rule_index(data.val_features) if data.tdi is not None else None
    ids = dimension_ids(dims, data.val_features, data.val_predicted, rules, len(data.val_y))
    shift = calibration.shift
    novel = None
    if shift is not None and shift.reference.pca_edges:  # as novel_inputs reads a live prediction
        novel = shift.reference.pca_error(data.val_features) > shift.reference.pca_edges[-1]
    reference = reference_of(
        ids,
        sum(len(d.segments) for d in dims),
        data.val_predicted == data.val_y,
        label_confidences(data.val_probabilities, data.val_predicted),
        calibration_rows=data.calibration_index,
        failed=np.asarray(data.calibration_verdicts) != 0,
        novel=novel,
    )
    return Segmentation(tuple(dims), reference)


def _predicted(data: SegmentData, shape: ViewShape, plan: CalibrationPlan, budget: int, seed: int) -> Dimension:
    k = len(data.classes)
    counts = np.bincount(np.asarray(data.val_predicted, dtype=np.int64), minlength=k)[:k]
    cap = min(plan.segment_classes, budget)
    if k <= cap:
        return Dimension(
            PREDICTED,
            "predicted class",
            "predicted",
            tuple(f"predicted={c}" for c in data.classes),
            lookup=tuple(range(k)),
        )
    top = [int(i) for i in np.argsort(-counts, kind="stable")[: cap - 1]]
    lookup = [top.index(i) if i in top else cap - 1 for i in range(k)]
    names = (*(f"predicted={data.classes[i]}" for i in top), "predicted=other classes")
    return Dimension(PREDICTED, "predicted class", "predicted", names, lookup=tuple(lookup))


def rule_name(
    index: int, rule: TdiRule, names: Sequence[str] | None, onehot: frozenset[int], classes: Sequence[str]
) -> str:
    """``TDI rule 12: x[3] > 0.5 & city!=paris => 7``: the rule's path read as conditions on the view's columns
    (a one-hot column's test as ``column=value`` or ``column!=value``) and the class its leaf predicts."""

    def condition(j: int, op: str, threshold: float) -> str:
        name = names[j] if names is not None and j < len(names) else f"x[{j}]"
        if j in onehot and "=" in name:
            return name if op == ">" else name.replace("=", "!=", 1)
        return f"{name} {op} {format_threshold(threshold)}"

    body = " & ".join(condition(j, op, t) for j, op, t in rule.conditions)
    cls = classes[rule.label] if 0 <= rule.label < len(classes) else str(rule.label)
    return f"TDI rule {index}: {body} => {cls}" if body else f"TDI rule {index}: => {cls}"


def _rules(data: SegmentData, shape: ViewShape, plan: CalibrationPlan, budget: int, seed: int) -> Dimension | None:
    tdi = data.tdi
    if tdi is None:
        return None
    selected = [i for i, r in enumerate(tdi.rules) if r.selected]
    if not selected:
        return None
    selected.sort(key=lambda i: -tdi.rules[i].support)
    cap = min(plan.segment_rules, budget - 1 - (len(selected) > plan.segment_rules))
    if cap < 1:
        return None
    own = selected[:cap]
    onehot = frozenset(j for g in shape.columns if g.onehot for j in g.columns)
    names = [rule_name(i, tdi.rules[i], tdi.feature_names, onehot, data.classes) for i in own]
    rest = len(selected) > len(own)
    if rest:
        names.append("other selected TDI rules")
    names.append("no selected TDI rule")
    none_id = len(names) - 1
    lookup = [none_id] * len(tdi.rules)
    for j, i in enumerate(own):
        lookup[i] = j
    for i in selected[len(own) :]:
        lookup[i] = len(own)
    return Dimension(RULE, "TDI rule", "rule", tuple(names), lookup=tuple(lookup))


def _regions(data: SegmentData, shape: ViewShape, plan: CalibrationPlan, budget: int, seed: int) -> Dimension | None:
    if not shape.regions:
        return None
    x = np.asarray(data.train_features, dtype=np.float64).reshape(len(data.train_features), -1)
    y = np.asarray(data.train_y, dtype=np.int64)
    rng = np.random.default_rng([seed, 37])
    if len(x) > plan.segment_region_rows:
        keep = np.sort(rng.choice(len(x), plan.segment_region_rows, replace=False))
        x, y = x[keep], y[keep]
    k = min(plan.segment_regions, budget, len(x) // max(plan.segment_min_rows, 1))
    if k < 2 or x.shape[1] == 0:
        return None
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    floor = max(float(np.median(scale[scale > 0])) * 1e-3 if (scale > 0).any() else 1.0, 1e-12)
    scale = np.maximum(scale, floor)
    z = (x - mean) / scale
    _, _, vt = np.linalg.svd(z - z.mean(axis=0), full_matrices=False)
    basis = vt[: min(REGION_COMPONENTS, len(vt))]  # [r, D]
    centres, assigned = kmeans(z @ basis.T, k, rng)
    k = len(centres)
    if k < 2:
        return None
    # nearest centre in the reduced space: argmax_k (2 z·c_k − |c_k|²), z = ((x − mean)/scale) Bᵀ
    w = 2.0 * (basis.T @ centres.T) / scale[:, None]  # [D, k]
    b = -(mean @ w) - (centres * centres).sum(axis=1)
    names = tuple(f"region {i}: {_class_mix(y[assigned == i], data.classes)}" for i in range(k))
    return Dimension(
        REGION,
        "region",
        "nearest",
        names,
        weights=tuple(tuple(_short(v) for v in row) for row in w),
        bias=tuple(_short(v) for v in b),
    )


def _short(value: float) -> float:
    """A centre's coefficient to 6 significant digits (the bundle's JSON stays small; assignments do not move)."""
    return float(f"{float(value):.6g}")


def _class_mix(y: np.ndarray, classes: Sequence[str]) -> str:
    """The training class mix of a region: its largest classes with their shares."""
    if len(y) == 0:
        return "empty at fit"
    counts = np.bincount(y, minlength=len(classes))
    order = np.argsort(-counts, kind="stable")
    parts = [f"{classes[i]} {counts[i] / len(y):.0%}" for i in order[:3] if counts[i] / len(y) >= 0.15]
    return ", ".join(parts) if parts else f"mixed ({len(np.flatnonzero(counts))} classes)"


def kmeans(x: np.ndarray, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means with k-means++ seeding (the best of :data:`KMEANS_RESTARTS` seedings): the centres
    ``[k', D]`` (empty clusters dropped, so ``k' ≤ k``) and every row's cluster."""
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for _ in range(KMEANS_RESTARTS):
        centres = _seed(x, k, rng)
        assigned = np.zeros(len(x), dtype=np.int64)
        for _ in range(KMEANS_ITERATIONS):
            d2 = (x * x).sum(axis=1)[:, None] - 2 * x @ centres.T + (centres * centres).sum(axis=1)[None, :]
            new = np.argmin(d2, axis=1)
            if np.array_equal(new, assigned) and _ > 0:
                break
            assigned = new
            for j in range(len(centres)):
                members = x[assigned == j]
                if len(members):
                    centres[j] = members.mean(axis=0)
        inertia = float(np.min(d2, axis=1).sum())
        if best is None or inertia < best[0]:
            best = (inertia, centres.copy(), assigned.copy())
    assert best is not None
    _, centres, assigned = best
    used = np.unique(assigned)
    remap = np.full(len(centres), -1)
    remap[used] = np.arange(len(used))
    return centres[used], remap[assigned]


def _seed(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++: each next centre drawn with probability proportional to its squared distance."""
    centres = [x[rng.integers(len(x))]]
    d2 = ((x - centres[0]) ** 2).sum(axis=1)
    for _ in range(1, k):
        total = d2.sum()
        if total <= 0:
            break
        centres.append(x[rng.choice(len(x), p=d2 / total)])
        d2 = np.minimum(d2, ((x - centres[-1]) ** 2).sum(axis=1))
    return np.array(centres, dtype=np.float64)


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
        scored.append((-_information(local, data.train_y), i, dim))
    scored.sort(key=lambda t: (t[0], t[1]))
    return [dim for _, _, dim in scored[: plan.segment_columns]]


def _information(ids: np.ndarray, y: np.ndarray) -> float:
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
    return Dimension(COLUMN, group.name, "onehot", tuple(names), columns=group.columns, lookup=tuple(lookup))


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
            COLUMN,
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
    return Dimension(COLUMN, group.name, "bins", tuple(names), columns=(j,), edges=tuple(edges))
