"""A point estimate of accuracy with its 95% interval, and the interval formulas shared by estimators."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Two-sided 95% quantile of the standard normal distribution.
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A point estimate of accuracy with its 95% interval and the number of samples behind it."""

    value: float
    lower: float
    upper: float
    n: int

    def to_dict(self) -> dict[str, float | int | str]:
        return {"value": self.value, "lower": self.lower, "upper": self.upper, "n": self.n}


def clip01(v: float) -> float:
    """``v`` clipped to [0, 1] (accuracies and their interval bounds)."""
    return float(min(1.0, max(0.0, v)))


def wilson(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (``n`` may be an effective sample size)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / denom
    return clip01(centre - half), clip01(centre + half)
