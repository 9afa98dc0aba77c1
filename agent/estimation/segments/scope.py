"""Whether a window's change lives in a few segments or across the traffic (docs/diagnosis.md, "A change across
the traffic").

Each dimension cuts the whole traffic, so the share of a dimension's predictions that fall in segments whose inputs
changed (:func:`changed_shares`) says how much of the traffic moved, as that dimension sees it. A fault in one
segment leaves most of the traffic unchanged in at least one dimension, the one that isolates it (a city's column
broken: the other cities; a class darkened: the other regions), even when it moves rows across the bins of the
broken column or the predicted classes. A change of the whole traffic (every image blurred, a unit changed for
every row) leaves no such dimension. A window is :func:`widespread` when, in every dimension, the segments whose
inputs changed hold at least :data:`WIDESPREAD_SHARE` of its predictions: then no segment is where the drop is,
and the top segments only say where the change is largest.

The dimension that isolates a fault keeps its rows where they were; the dimension of a broken column (its bins) or of
the predicted class sees rows move between its segments. A dimension whose shares moved beyond noise and by at least
:data:`MOVED_SHARE` (:func:`shares_moved`) holds, in the segments that gained rows, rows changed elsewhere beside its
own: their change says where the rows went, which the table weighs less than where they broke
(:func:`agent.estimation.segments.table.rank_evidence`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

#: The share of every dimension's predictions in changed segments from which a change is across the traffic: a
#: majority in every cut of it.
WIDESPREAD_SHARE = 0.5


def changed_shares(rows: Iterable[tuple[str, float, bool]]) -> dict[str, float]:
    """Per dimension of ``rows`` (each a segment's dimension, its share of that dimension's predictions and whether
    its inputs changed), the share of its predictions in segments whose inputs changed."""
    out: dict[str, float] = {}
    for dimension, share, changed in rows:
        out[dimension] = out.get(dimension, 0.0) + (share if changed else 0.0)
    return out


def widespread(shares: Mapping[str, float]) -> bool:
    """Whether, in every dimension, segments whose inputs changed hold at least :data:`WIDESPREAD_SHARE` of the
    predictions (never without a dimension)."""
    return bool(shares) and min(shares.values()) >= WIDESPREAD_SHARE


def least_changed(shares: Mapping[str, float]) -> tuple[str, float] | None:
    """The dimension whose predictions are least in changed segments, and that share (None: no dimension)."""
    if not shares:
        return None
    dim = min(shares, key=lambda d: (shares[d], d))
    return dim, shares[dim]


#: The total variation between a dimension's shares now and at reference from which its rows moved (a segment of a
#: tenth of the traffic emptied into another moves it by 0.1): below it a mix drifts as traffic does.
MOVED_SHARE = 0.05
#: Familywise false-alarm rate of the window's share tests (Bonferroni over its dimensions).
MOVED_ALPHA = 0.001


def shares_moved(counts: Sequence[float], reference: Sequence[float], dimensions: int = 1) -> bool:
    """Whether a dimension's predictions per segment (``counts``) are spread unlike its validation rows
    (``reference``): a two-sample χ² test of homogeneity (Wilson–Hilferty's normal approximation of its tail),
    significant at :data:`MOVED_ALPHA` over ``dimensions`` tests, and a total variation of the shares of at least
    :data:`MOVED_SHARE`."""
    n, m = float(sum(counts)), float(sum(reference))
    if n <= 0 or m <= 0 or len(counts) != len(reference):
        return False
    pooled = [(a + b) / (n + m) for a, b in zip(counts, reference, strict=True)]
    used = [(a, b, p) for a, b, p in zip(counts, reference, pooled, strict=True) if p > 0]
    df = len(used) - 1
    if df < 1:
        return False
    tv = 0.5 * sum(abs(a / n - b / m) for a, b, _ in used)
    if tv < MOVED_SHARE:
        return False
    x2 = sum((a - n * p) ** 2 / (n * p) + (b - m * p) ** 2 / (m * p) for a, b, p in used)
    k = 2.0 / (9.0 * df)
    z = ((x2 / df) ** (1.0 / 3.0) - (1.0 - k)) / math.sqrt(k)
    return 0.5 * math.erfc(z / math.sqrt(2.0)) * max(dimensions, 1) <= MOVED_ALPHA
