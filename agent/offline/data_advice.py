"""How much labeled validation data a fit needs for its calibration split to hold enough errors.

The estimators calibrated on the calibration split (TPR/FPR, confidence offsets, the ATC threshold, the
correction near clean data, the headline's choice) need at least
:data:`~agent.estimation.estimators.trust.MIN_CALIBRATION_ERRORS` wrong predictions in it. ``fit`` splits the
validation data stratified by right and wrong, so the split receives the fraction ``f``
(``--calibration-fraction``) of the validation set's errors. A very accurate model makes few: with ``k``
wrong among ``n`` validation predictions its error rate is taken as the :data:`RATE_QUANTILE` quantile
``ε`` of its Jeffreys posterior ``Beta(k + ½, n − k + ½)`` (never 0: no error seen is not an error rate of
0; below the median, since a rate from few errors that is too high asks for too little), and a validation
set of

    N = λ / (f · ε),   λ = the :data:`PROBABILITY` quantile of Gamma(k_min, 1) (≈ 14.2 for 10 errors)

inputs gives the split ``k_min`` errors with that probability (``P(Poisson(λ) ≥ k) = P(Gamma(k, 1) ≤ λ)``).
Simulated, the split then holds 10 errors or more in 88–99% of fits (the posterior median instead: 56–85%).
Without any error seen ``N`` is unbounded (an error rate of 0.001 seen as 0 of 500 asks for 740,000): the
advice is capped at :data:`CAP` times the data given, and says that a fit on it will tell more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agent.estimation.estimators.trust import MIN_CALIBRATION_ERRORS

#: Probability that the calibration split of the advised validation set holds the errors it needs.
PROBABILITY = 0.9
#: Quantile of the error rate's posterior the advice is computed at.
RATE_QUANTILE = 0.2
#: The advice never asks for more than this many times the validation data given.
CAP = 10


@dataclass(frozen=True)
class ValidationAdvice:
    """How many labeled validation inputs a fit needs (``needed``) for its calibration split to hold
    ``errors_wanted`` wrong predictions with probability :data:`PROBABILITY`, given ``errors_seen`` among
    the ``validation`` inputs it had; ``capped``: the need was larger than :data:`CAP` times the data."""

    validation: int
    errors_seen: int
    errors_wanted: int
    needed: int
    capped: bool

    @property
    def more(self) -> int:
        """Labeled validation inputs to add (0: the data is enough)."""
        return max(self.needed - self.validation, 0)

    def message(self) -> str | None:
        """The advice in one sentence (None when the data is enough)."""
        if not self.more:
            return None
        if self.errors_seen == 0:
            return (
                f"no wrong prediction among the {self.validation} validation inputs: the model's error rate is "
                f"unknown and the calibration split holds no error to calibrate on; give fit at least "
                f"{self.needed} labeled validation inputs ({self.more} more) and fit again: it will tell you more"
            )
        text = (
            f"{self.errors_seen} wrong prediction(s) among the {self.validation} validation inputs: for the "
            f"calibration split to hold {self.errors_wanted} errors (with probability {PROBABILITY:.0%}), give fit "
            f"about {self.needed} labeled validation inputs ({self.more} more)"
        )
        return text + (" at least, then fit again: it will tell you more" if self.capped else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "validation": self.validation,
            "errors_seen": self.errors_seen,
            "errors_wanted": self.errors_wanted,
            "needed": self.needed,
            "more": self.more,
            "capped": self.capped,
        }


def validation_advice(
    n: int, wrong: int, fraction: float, *, errors_wanted: int = MIN_CALIBRATION_ERRORS
) -> ValidationAdvice:
    """The advice for ``wrong`` errors among ``n`` validation predictions and a calibration split of
    ``fraction`` of them (see the module docstring)."""
    from scipy.stats import beta, gamma

    n, wrong = max(int(n), 1), max(int(wrong), 0)
    rate = float(beta.ppf(RATE_QUANTILE, wrong + 0.5, max(n - wrong, 0) + 0.5))
    lam = float(gamma.ppf(PROBABILITY, errors_wanted))
    raw = lam / (fraction * rate) if rate > 0 else math.inf
    cap = CAP * n
    needed = cap if not math.isfinite(raw) or raw > cap else math.ceil(raw)
    return ValidationAdvice(n, wrong, errors_wanted, int(needed), bool(needed == cap and raw > cap))
