"""The change columns of a bundle's segments, fixed at ``fit`` (:mod:`agent.estimation.segments.change` reads
them per window): a table view's numeric columns (with their relations to the others, and the value of each that is
mostly at one), or the leading principal components of any other view, each standardized on the training data; and
every segment's reference moments on the labeled validation data."""

from __future__ import annotations

import numpy as np

from agent.estimation.segments.change import PRIOR_ROWS
from agent.estimation.segments.sketch import (
    CLIP,
    MAX_COLUMNS,
    MAX_POINTS,
    MAX_RELATIONS,
    POINT_SHARE,
    ChangeSketch,
    correlation_factors,
    reference_moments,
    sketched_pairs,
)
from agent.estimation.statistics.reference import leading_components
from agent.offline.calibration.segments.data import SegmentData, ViewShape
from agent.offline.calibration.segments.kinds.column import information

#: Principal components sketched for a view without table columns (images, text, embeddings).
COMPONENTS = 8
#: Training rows the standardization and the components are fitted on (a seeded sample beyond it).
MAX_ROWS = 5000
#: Bins of a numeric column when ranking table columns by their information on the class.
RANK_BINS = 8
#: Share of a numeric column's variance the other sketched columns must explain (R² of its least-squares fit on
#: them, training rows) for its relation to them to be sketched: below it, a shuffle barely moves the correlation.
MIN_RELATION = 0.5
#: Ridge of the relation fits, per training row (standardized columns): keeps the fit stable where columns are
#: collinear (one derived from others).
RIDGE = 1e-3


def define_change(
    data: SegmentData, shape: ViewShape, ids: np.ndarray, size: int, seed: int = 0
) -> ChangeSketch | None:
    """The change columns of a view (None when it has no column that varies) with the reference moments of
    the validation rows, whose segment numbers are ``ids`` ``[D, N]``."""
    train = _rows(np.asarray(data.train_features), seed)
    numeric = [g for g in shape.columns if not g.onehot]
    relations: tuple[int, ...] = ()
    points: tuple[tuple[int, float], ...] = ()
    if numeric:
        read = _table_columns(train, [g.columns[0] for g in numeric], [g.name for g in numeric], data, seed)
        if read is not None:
            at = {g.name: g.columns[0] for g in numeric}
            point_names, points = _points(train, [(name, at[name]) for name in read[0]], len(read[1]))
            read, relations = _relations(train, read)
            read = ((*read[0], *point_names), read[1], read[2])
    else:
        read = _components(train)
    if read is None:
        return None
    names, weights, bias = read
    empty = ((0.0,) * (size * len(names)),) * 4
    draft = ChangeSketch(names, weights, bias, (0,) * size, empty, (), relations, (), points)
    val = np.asarray(data.val_features).reshape(len(data.val_features), -1)
    z = draft.values(val)
    if z is None:
        return None
    pairs = sketched_pairs(draft.base, relations)
    counts, moments, cross = reference_moments(ids, size, z, pairs)
    factors = tuple(_pair_factors(ids, size, z, pairs, counts)) if pairs else ()
    return ChangeSketch(
        names, weights, bias, tuple(counts), tuple(tuple(m) for m in moments), tuple(cross), relations, factors, points
    )


def _points(
    train: np.ndarray, columns: list[tuple[str, int]], width: int
) -> tuple[tuple[str, ...], tuple[tuple[int, float], ...]]:
    """The point columns (:attr:`~agent.estimation.segments.sketch.ChangeSketch.points`) of the sketched
    ``columns`` (name, view column, in the sketch's order) that mostly hold one value: its share of the training rows
    within :data:`~agent.estimation.segments.sketch.POINT_SHARE`, and at least three values (a binary column's share
    is its mean, which the moments read). Named ``<column> at <value>``; at most
    :data:`~agent.estimation.segments.sketch.MAX_POINTS`."""
    names: list[str] = []
    points: list[tuple[int, float]] = []
    for name, j in columns:
        if j >= width or len(points) == MAX_POINTS:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            col = train[:, j].astype(np.float32)
        values, counts = np.unique(col[np.isfinite(col)], return_counts=True)
        if len(values) < 3:
            continue
        top = int(np.argmax(counts))
        if POINT_SHARE[0] <= counts[top] / len(col) <= POINT_SHARE[1]:
            names.append(f"{name} at {float(values[top]):g}")
            points.append((j, float(values[top])))
    return tuple(names), tuple(points)


def _pair_factors(
    ids: np.ndarray, size: int, z: np.ndarray, pairs: tuple[tuple[int, int], ...], counts: list[int]
) -> list[float]:
    """Per segment and sketched pair, the variance factor of its correlation
    (:func:`~agent.estimation.segments.sketch.correlation_factors`) from the segment's validation rows, pulled toward
    the column pair's over all rows by :data:`~agent.estimation.segments.change.PRIOR_ROWS` rows and never below it:
    a segment's few rows draw few of its tails, which is what the factor is made of."""
    whole = correlation_factors(z, pairs)
    out = np.tile(whole, (size, 1))
    ids2 = np.asarray(ids, dtype=np.int64).reshape(-1, len(z))
    for row in ids2:
        for s in np.unique(row[row < size]):
            m = float(counts[s])
            own = correlation_factors(z[row == s], pairs)
            out[s] = np.maximum((m * own + PRIOR_ROWS * whole) / (m + PRIOR_ROWS), whole)
    return [float(v) for v in out.ravel()]


def _rows(x: np.ndarray, seed: int) -> np.ndarray:
    x = x.reshape(len(x), -1)
    if len(x) > MAX_ROWS:
        x = x[np.sort(np.random.default_rng(seed).choice(len(x), MAX_ROWS, replace=False))]
    return x.astype(np.float64)


Read = tuple[tuple[str, ...], tuple[tuple[float, ...], ...], tuple[float, ...]]


def _table_columns(
    train: np.ndarray, columns: list[int], names: list[str], data: SegmentData, seed: int
) -> Read | None:
    """The numeric columns that vary, the most informative of the class first (at most :data:`MAX_COLUMNS`),
    each standardized by its training mean and standard deviation."""
    y = _rows(np.asarray(data.train_y).reshape(len(data.train_y), 1), seed)[:, 0].astype(np.int64)
    kept = []
    for j, name in zip(columns, names, strict=True):
        col = train[:, j]
        finite = np.isfinite(col)
        sd = float(np.std(col[finite])) if finite.any() else 0.0
        if sd > 0:
            kept.append((-_information(col, y, finite), j, name, float(np.mean(col[finite])), sd))
    if not kept:
        return None
    kept.sort(key=lambda t: (t[0], t[1]))
    kept = kept[:MAX_COLUMNS]
    width = max(j for _, j, _, _, _ in kept) + 1
    w = np.zeros((width, len(kept)))
    for c, (_, j, _, _, sd) in enumerate(kept):
        w[j, c] = 1.0 / sd
    bias = tuple(-mean / sd for _, _, _, mean, sd in kept)
    return tuple(name for _, _, name, _, _ in kept), tuple(tuple(float(v) for v in r) for r in w), bias


def _relations(train: np.ndarray, read: Read) -> tuple[Read, tuple[int, ...]]:
    """``read`` with the relation of every sketched column the others explain (R² ≥ :data:`MIN_RELATION`, in the
    order of the columns, at most :data:`MAX_RELATIONS`) appended: the others' ridge least-squares fit of it
    (:data:`RIDGE`), standardized on the training rows, named ``<column> from the others``; and for each, the
    column it fits (:attr:`~agent.estimation.segments.sketch.ChangeSketch.relations`). Each is one more linear read
    of the view, so its sums are the sketch's like any column's."""
    names, weights, bias = read
    c = len(names)
    if c < 2:
        return read, ()
    w, b = np.asarray(weights), np.asarray(bias)
    z = np.clip(np.nan_to_num(train[:, : w.shape[0]] @ w + b, nan=0.0, posinf=CLIP, neginf=-CLIP), -CLIP, CLIP)
    mu = z.mean(axis=0)
    z = z - mu
    gram = z.T @ z
    ridge = RIDGE * len(z)
    new_w, new_b, new_names, related = [], [], [], []
    for j in range(c):
        others = [k for k in range(c) if k != j]
        g = gram[np.ix_(others, others)] + ridge * np.eye(c - 1)
        beta = np.linalg.solve(g, gram[others, j])
        fit = z[:, others] @ beta
        var = float(z[:, j].var())
        sd = float(fit.std())
        if var <= 0 or sd <= 0 or 1.0 - float((z[:, j] - fit).var()) / var < MIN_RELATION:
            continue
        # the fit Σ β (x W + b − μ) over the others: one linear read of the view, standardized
        new_w.append(w[:, others] @ beta / sd)
        new_b.append(float((b[others] - mu[others]) @ beta) / sd)
        new_names.append(f"{names[j]} from the others")
        related.append(j)
        if len(related) == MAX_RELATIONS:
            break
    if not related:
        return read, ()
    all_w = np.concatenate([w, np.stack(new_w, axis=1)], axis=1)
    return (
        (
            (*names, *new_names),
            tuple(tuple(float(v) for v in row) for row in all_w),
            (*bias, *new_b),
        ),
        tuple(related),
    )


def _information(col: np.ndarray, y: np.ndarray, finite: np.ndarray) -> float:
    """Mutual information (nats) between a column's quantile bin and the class (:func:`information`)."""
    if len(y) != len(col) or not finite.any():
        return 0.0
    edges = np.unique(np.quantile(col[finite], np.arange(1, RANK_BINS) / RANK_BINS))
    return information(np.searchsorted(edges, np.where(finite, col, edges[0] if len(edges) else 0.0)), y)


def _components(train: np.ndarray) -> Read | None:
    """The leading principal components of the view, each scaled to unit variance on the training rows."""
    finite = np.where(np.isfinite(train), train, 0.0)
    center = finite.mean(axis=0)
    z = finite - center
    k = min(COMPONENTS, z.shape[1], max(len(z) - 1, 0))
    if k <= 0:
        return None
    basis = leading_components(z, k)  # [k, D]
    scores = z @ basis.T
    sd = scores.std(axis=0)
    keep = sd > 1e-9 * max(float(sd.max()), 1e-300)
    if not keep.any():
        return None
    basis, sd = basis[keep], sd[keep]
    w = basis.T / sd  # [D, k]
    bias = -(center @ w)
    names = tuple(f"component {i + 1}" for i in range(len(sd)))
    return names, tuple(tuple(float(v) for v in r) for r in w), tuple(float(v) for v in bias)
