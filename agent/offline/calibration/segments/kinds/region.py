"""``region`` at ``fit``: k-means regions of the view (:mod:`agent.estimation.segments.kinds.region` reads them)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent.estimation.segments.kinds import region as serving
from agent.estimation.segments.segmentation import Dimension
from agent.offline.calibration.segments.data import SegmentData, ViewShape
from agent.offline.calibration.segments.kinds.base import SegmentKindFit
from invariants.fit_params import CalibrationPlan

#: k-means: Lloyd iterations and restarts of the seeding.
KMEANS_ITERATIONS = 30
KMEANS_RESTARTS = 3
#: Dimensions of the view the regions are clustered in (its leading principal components).
REGION_COMPONENTS = 16


class Region(SegmentKindFit):
    """Regions of a view that has no table columns to cut (or part of one): k-means centres of its leading
    principal components on the training rows, as many as
    :attr:`~invariants.fit_params.CalibrationPlan.segment_regions` and the budget allow."""

    kind = serving.Region

    def define(
        self, data: SegmentData, shape: ViewShape, plan: CalibrationPlan, budget: int, seed: int
    ) -> list[Dimension]:
        dim = _regions(data, shape, plan, budget, seed)
        return [] if dim is None else [dim]


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
        serving.Region.name,
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
