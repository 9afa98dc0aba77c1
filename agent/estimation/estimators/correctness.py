"""A calibrated per-prediction probability that a prediction is correct, fitted on the labeled
calibration split and stored in the bundle (JSON: five coefficients).

Active labeling (:mod:`agent.estimation.estimators.active`) needs, for every live prediction, a predictor
``f(x) ≈ P(correct | x)`` that is *calibrated*: the draw probability grows with the predicted
uncertainty ``sqrt(f(1 − f))`` and the estimator's residuals ``Y − f`` are small where ``f`` is
right. The raw top-class confidence is not calibrated (over-confident networks) and ignores the
oracle's verdict, which is the agent's strongest per-prediction evidence of an error. The predictor
is Platt scaling (Platt 1999) extended by the verdict: a logistic regression of correctness on
``[1, logit(c), failed, failed · logit(c), logit(c)²]`` (``c`` the top-class probability,
``failed`` whether the oracle flagged the prediction), fitted by a few Newton steps with a small ridge
penalty so that a split with few errors still gives finite coefficients. Only what judging already
has per prediction is needed, so the sampler can evaluate it on every prediction.

Bundles fitted before it have none: the agent then uses the raw confidence as ``f`` and says so in
``/v1/estimates`` (``predictor``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

#: Format tag of the bundle entry; entries of another format are ignored (the raw confidence is used).
CORRECTNESS_FORMAT = "platt_verdict_v1"
#: Confidence is clipped to [EPS, 1 − EPS] before its logit (float32 probabilities reach 1.0).
EPS = 1e-6
_RIDGE = 1e-3
_NEWTON_STEPS = 50


def _design(confidence: np.ndarray, failed: np.ndarray) -> np.ndarray:
    c = np.clip(np.asarray(confidence, dtype=np.float64).reshape(-1), EPS, 1.0 - EPS)
    z = np.log(c / (1.0 - c)) / 10.0  # scaled so that every column is of order one
    fl = np.asarray(failed, dtype=np.float64).reshape(-1)
    return np.column_stack([np.ones_like(z), z, fl, fl * z, z * z])


def _sigmoid(t: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * t))


@dataclass(frozen=True)
class CorrectnessModel:
    """``P(correct | confidence, failed)`` as a logistic regression (see the module docstring)."""

    coef: tuple[float, ...]

    def predict(self, confidence: np.ndarray, failed: np.ndarray) -> np.ndarray:
        """The probability that each prediction is correct (float64, in (0, 1))."""
        return np.asarray(_sigmoid(_design(confidence, failed) @ np.asarray(self.coef)), dtype=np.float64)

    def to_dict(self) -> dict[str, object]:
        return {"kind": CORRECTNESS_FORMAT, "coef": list(self.coef)}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> CorrectnessModel:
        if d.get("kind") != CORRECTNESS_FORMAT:
            raise ValueError("correctness model of another format")
        coef = tuple(float(v) for v in d["coef"])  # type: ignore[attr-defined]
        if len(coef) != 5 or not all(np.isfinite(coef)):
            raise ValueError("correctness model needs five finite coefficients")
        return cls(coef)

    @classmethod
    def fit(
        cls, confidence: np.ndarray, correct: np.ndarray, failed: np.ndarray, weights: np.ndarray | None = None
    ) -> CorrectnessModel:
        """Fit on the calibration split (penalised maximum likelihood, Newton–Raphson); ``weights`` (one per
        prediction, e.g. the inverse of its draw probability) weight each one's likelihood, scaled to sum to
        the number of predictions so that the penalty means the same."""
        x = _design(confidence, failed)
        y = np.asarray(correct, dtype=np.float64).reshape(-1)
        if len(y) != len(x) or len(y) == 0:
            raise ValueError("correctness model needs one correctness per confidence")
        w = normalized_weights(weights, len(y))
        penalty = _RIDGE * len(y) * np.diag([0.0, 1.0, 1.0, 1.0, 1.0])
        share = float(np.clip(np.average(y, weights=w), 0.5 / len(y), 1.0 - 0.5 / len(y)))
        beta = np.zeros(x.shape[1])
        beta[0] = np.log(share / (1.0 - share))
        for _ in range(_NEWTON_STEPS):
            p = _sigmoid(x @ beta)
            grad = x.T @ (w * (y - p)) - penalty @ beta
            hess = (x * (w * p * (1.0 - p))[:, None]).T @ x + penalty + 1e-9 * np.eye(x.shape[1])
            step = np.linalg.solve(hess, grad)
            beta = beta + step
            if float(np.abs(step).max()) < 1e-8:
                break
        return cls(tuple(float(b) for b in beta))


def normalized_weights(weights: np.ndarray | None, n: int) -> np.ndarray:
    """``weights`` (positive, one per prediction) scaled to sum to ``n``; all ones when None."""
    if weights is None:
        return np.ones(n)
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if len(w) != n or not bool((w > 0).all()) or not bool(np.isfinite(w).all()):
        raise ValueError("weights must be one finite positive number per prediction")
    return w * (n / float(w.sum()))


def correctness_or_none(d: object) -> CorrectnessModel | None:
    """The stored model, or None when absent (older bundles) or unreadable."""
    if not isinstance(d, Mapping) or not d:
        return None
    try:
        return CorrectnessModel.from_dict(d)
    except (KeyError, ValueError, TypeError):
        return None
