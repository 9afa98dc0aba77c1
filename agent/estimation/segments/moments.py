"""The two-sample tests the change test reads a segment's columns with (:mod:`agent.estimation.segments.change`):
a column's first two moments (Hotelling's ``T²`` on the mean's shift and the second moment's, in a yardstick pulled
toward the column's over all segments), a correlation from sums, and the likelihood-ratio test of two proportions."""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np

#: Rows of the column's whole-data covariance a segment's own covariance is pulled toward.
PRIOR_ROWS = 20.0
#: The largest correlation of a column's ``(u, u²)`` the moments' test reads: a column of one value but for rare others
#: (zero-inflated) has ``u²`` almost a line in ``u`` at reference, and a window's few other values, off that line,
#: would read as a change in the near-singular direction.
MAX_MOMENT_CORRELATION = 0.9


def g_statistic(k1: float, n1: float, k2: float, n2: float) -> float:
    """The likelihood-ratio statistic ``G = 2 Σ O ln(O/E)`` of two samples' counts ``k`` of ``n`` at one share."""
    total = n1 + n2
    if total <= 0:
        return 0.0
    pooled = (k1 + k2) / total
    g = 0.0
    for observed, expected in (
        (k1, n1 * pooled),
        (n1 - k1, n1 * (1 - pooled)),
        (k2, n2 * pooled),
        (n2 - k2, n2 * (1 - pooled)),
    ):
        if observed > 0 and expected > 0:
            g += observed * math.log(observed / expected)
    return max(2.0 * g, 0.0)


def correlation(a: float, b: float, aa: float, bb: float, ab: float) -> float | None:
    """The correlation of two columns from their means, mean squares and mean product (clipped inside ±1;
    None when either is constant)."""
    va, vb = aa - a * a, bb - b * b
    if va <= 1e-12 or vb <= 1e-12:
        return None
    return max(min((ab - a * b) / math.sqrt(va * vb), 0.999), -0.999)


#: A moment: one segment's and column's, or an array of them.
_M = TypeVar("_M", float, np.ndarray)


def central(m1: _M, m2: _M, m3: _M, m4: _M) -> tuple[_M, _M, _M]:
    """The second, third and fourth central moments from the first four raw ones."""
    c2 = m2 - m1 * m1
    c3 = m3 - 3 * m1 * m2 + 2 * m1**3
    c4 = m4 - 4 * m1 * m3 + 6 * m1 * m1 * m2 - 3 * m1**4
    return c2, c3, c4


def shape_of(
    own: tuple[float, float, float], whole: tuple[float, float, float], rows: float, floor: float, tails: float
) -> tuple[float, float]:
    """The segment's skewness and kurtosis pulled toward the column's by :data:`PRIOR_ROWS` rows, the kurtosis never
    below ``tails`` (the segments' own kurtosis averaged over their rows) nor the column's where that is lower: a
    segment's own tails are few rows, and too light a yardstick for the spread flags a reference that merely drew few
    of them (a skewed or zero-inflated column's rare values). Not the column's alone: where its segments differ in
    spread, the column over all of them has a mixture's tails, far heavier than any segment's, and a spread halved
    inside the largest segment read as noise."""
    c2, w2 = max(own[0], floor), max(whole[0], floor)
    skew = pulled(own[1] / c2**1.5, whole[1] / w2**1.5, rows)
    kurt = max(pulled(own[2] / (c2 * c2), whole[2] / (w2 * w2), rows), min(tails, whole[2] / (w2 * w2)))
    return skew, kurt


def covariance(mean_var: float, spread: float, skew: float, kurt: float) -> tuple[float, float, float]:
    """The per-row covariance of ``(u, u²)``, ``u`` a value less the reference mean, from the variance the mean's
    shift is read in, the variance the spread's is read in (:func:`moments_test`) and the shape. A possible shape
    (kurtosis ≥ 1 + skewness², a convex set) and ``mean_var ≥ spread`` keep it positive definite."""
    return mean_var, skew * spread**1.5, (max(kurt - 1.0 - skew * skew, 1e-4) + skew * skew) * spread * spread


def quadratic(v: tuple[float, float, float], d1: float, e2: float) -> float:
    """``dᵀ V⁻¹ d`` with the correlation of ``(u, u²)`` at most :data:`MAX_MOMENT_CORRELATION` in size."""
    v11, v12, v22 = v
    bound = MAX_MOMENT_CORRELATION * math.sqrt(v11 * v22)
    v12 = max(min(v12, bound), -bound)
    det = v11 * v22 - v12 * v12
    return max((v22 * d1 * d1 - 2 * v12 * d1 * e2 + v11 * e2 * e2) / det, 0.0)


def moments_test(
    reference: tuple[float, float],
    shape: tuple[float, float],
    var_w: float,
    n: float,
    m: float,
    d1: float,
    e2: float,
) -> tuple[float, float]:
    """The squared per-row distance of ``(d1, e2)`` (the mean's shift, and the second moment's about the reference
    mean) in the reference's deviations, and the two-sample Hotelling ``T²``. ``reference``: the variance the
    mean's shift is read in and the one the spread's is read in, the pulled variance for both, or the mean's pulled
    and the segment's own for the spread (a bin of the column is far narrower than the column, and a spread
    collapsed there, the column stuck or clipped inside its own bin, is the pulled yardstick's noise).

    The window's rows count at their own spread where it is the wider (Welch), with the reference's shape: a
    reference of a few hundred rows that came out narrow by chance, or drew none of a column's rare values, would
    otherwise read every window's ordinary spread as a change. A window's ``u²`` then spreads as its variance
    squared, not linearly."""
    mean_var, spread = reference
    skew, kurt = shape
    e2 = narrowed(e2, spread)
    ref = covariance(mean_var, spread, skew, kurt)
    live = covariance(max(var_w, mean_var), max(var_w, spread), skew, kurt)
    both = tuple(a / m + b / n for a, b in zip(ref, live, strict=True))
    return quadratic(ref, d1, e2), quadratic(both, d1, e2)  # type: ignore[arg-type]


def narrowed(e2: float, spread: float) -> float:
    """The second moment's shift ``e2`` where it fell, read on the scale of the standard deviation: ``2 · spread ·
    (√(1 + e2/spread) − 1)``; unchanged where it rose. Both have the slope 1 at no change, so the covariance of ``(u,
    u²)`` holds for either. A sample's variance is bounded below by 0 and spreads further above its expectation than
    below: read linearly, in the deviations a column's kurtosis sets, a spread collapsed to nothing (a count column
    stuck at a constant inside a segment) was about one of them, and no change. Its square root is about as far below
    as above (Fisher's ``√(2χ²)``; for a column whose spread comes from a few rare values, the count of those in the
    window, whose square root steadies a Poisson count), so a collapse reads twice as far. A log scale would read it
    further still, but a window that merely drew none of a mostly-zero column's rare values collapses too, by chance;
    it would read that as a change. A rise stays linear: there the kurtosis keeps a heavy tail's chance draws
    quiet."""
    if e2 >= 0.0 or spread <= 0.0:
        return e2
    return 2.0 * spread * (math.sqrt(max(1.0 + e2 / spread, 0.0)) - 1.0)


def pulled(own: float, whole: float, rows: float) -> float:
    """A segment's figure over its ``rows`` validation rows (a (co)variance, a shape) pulled toward the column's
    over all segments by :data:`PRIOR_ROWS` rows: a thin segment's few rows do not make their own noise look like a
    change."""
    return (rows * own + PRIOR_ROWS * whole) / (rows + PRIOR_ROWS)
