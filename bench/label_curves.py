"""How many labels a design needs for a given interval: interpolated on its measured half-width curve. Shared by
the label benchmark (a window's estimate, :mod:`bench.labels`) and the localization benchmark (a segment's
realized accuracy, :mod:`bench.localization`)."""

from __future__ import annotations

import itertools
import math


def labels_for(curve: list[tuple[int, float]], goal: float) -> float:
    """The labels at which a half-width curve ``[(labels, half-width)]`` reaches ``goal``, interpolated
    linearly in log–log between the two counts around it (``inf`` when even its largest count is too few)."""
    curve = sorted(curve)
    if not curve:
        return math.inf
    if curve[0][1] <= goal:
        return float(curve[0][0])  # at most the smallest count measured
    for (n0, h0), (n1, h1) in itertools.pairwise(curve):
        if h1 <= goal <= h0 and h0 > h1 > 0:
            t = (math.log(h0) - math.log(goal)) / (math.log(h0) - math.log(h1))
            return math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    return math.inf
