"""Accuracy from a few labels plus the label-free predictor of every prediction: prediction-powered
inference (PPI).

With ``N`` predictions in a window, a label-free predictor ``f(x)`` of "this prediction is correct"
for every one of them (here the top-class probability, whose window sums the judging windows
already keep), and true labels for a *uniform random sample* of ``n`` of them (``Y = 1{correct}``),
the prediction-powered estimate of the window's accuracy is

    θ̂ = (1/N) Σ_N f(x)  +  (1/n) Σ_n (Y − f(x))                       (PPI, "mean estimation")

— the label-free mean, corrected by the *rectifier*: the mean error of ``f`` on the labeled sample
(Angelopoulos, Bates, Fannjiang, Jordan, Zrnic, "Prediction-powered inference", Science 382, 2023;
the prediction-powered point estimate θ̂^PP = θ̃^f − Δ̂^f and its CLT interval for a mean). Its
95% interval is θ̂ ± z · sqrt(σ̂_f² / N + σ̂_Δ² / n), σ̂_f² the variance of ``f`` over the window,
σ̂_Δ² that of ``Y − f`` over the sample. The interval is valid *whatever the shift* — however biased
``f`` is on this window — because the rectifier measures that bias on a random sample of the same
window; a biased ``f`` only makes it wider.

The power-tuned form (PPI++: Angelopoulos, Duchi, Zrnic, "PPI++: Efficient prediction-powered
inference", 2023, §2, the λ-weighted mean estimator and its variance-minimising λ)

    θ̂_λ = (1/n) Σ_n Y + λ · ((1/N) Σ_N f − (1/n) Σ_n f),
    λ̂ = Cov̂_n(Y, f) / ((1 + n/N) · Var̂_N(f)),  clipped to [0, 1],
    interval θ̂_λ ± z · sqrt(λ² σ̂_f² / N + Var̂_n(Y − λ f) / n)

is used by default: λ = 1 is plain PPI, λ = 0 the classical mean of the labels, so a useless
``f`` costs (asymptotically) nothing against labels alone. Var̂_n(Y − λ f) carries a small-sample
correction (:func:`rectifier_variance`) that keeps the interval honest when errors are rare.

The labeled predictions are part of the window's ``N`` here (PPI takes them apart); with ``n ≪ N``
the difference is a covariance term of order 1/N, and counting the ``f`` variance at all is
conservative for the window's own accuracy (its ``N`` values of ``f`` are known exactly).

Everything both sides need is additive (:func:`prediction_powered_of_sums`): the window's ``N``, Σf,
Σf² (:class:`~agent.estimation.statistics.window.WindowStats` keeps them as ``n``, ``conf_sum``,
``conf_sq_sum``) and the labeled sample's size, Σf, Σf², ΣY and ΣYf (its ``lab_*`` fields), so the
estimate is one more registered estimator on a window's statistics (``with_labels``, absent without
labels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agent.estimation.intervals import Z95, Estimate, clip01, wilson

#: The name the label-assisted estimate carries next to the label-free estimators.
WITH_LABELS = "with_labels"


@dataclass(frozen=True)
class LabeledEstimate(Estimate):
    """A prediction-powered estimate: :class:`Estimate` plus the labels behind it and the PPI++ λ."""

    n_labels: int = 0
    power: float = 1.0
    #: the per-prediction predictor ``f``: ``confidence`` (the top-class probability) or ``calibrated``
    #: (the bundle's :mod:`~agent.estimation.estimators.correctness` model)
    predictor: str = "confidence"
    #: whether the labels were weighted by their draw probabilities (:mod:`agent.estimation.estimators.active`)
    weighted: bool = False

    def to_dict(self) -> dict[str, float | int | str]:
        return {
            **super().to_dict(),
            "n_labels": self.n_labels,
            "lambda": self.power,
            "predictor": self.predictor,
            "weighted": self.weighted,
        }


def rectifier_variance(residuals: np.ndarray, shift: float, z: float = Z95) -> float:
    """The variance of the rectifier ``Y − λ f`` over the labeled sample, with ``z²/2`` pseudo-labels
    right and ``z²/2`` wrong (residuals ``1 − shift`` and ``−shift``, ``shift`` = λ · mean f) as
    Agresti & Coull (1998) add to a binomial proportion: the CLT interval of a mean of rare
    errors (accuracy near 1 with a few hundred labels) is too narrow otherwise, and a sample
    without spread would give a zero-width interval. The point estimate is not changed, and the
    correction vanishes as the sample grows (variance scaled to the sample size ``m``)."""
    r = np.asarray(residuals, dtype=np.float64)
    return rectifier_variance_of_sums(len(r), float(r.sum()), float((r * r).sum()), shift, z)


def rectifier_variance_of_sums(m: int, r_sum: float, r_sq_sum: float, shift: float, z: float = Z95) -> float:
    """:func:`rectifier_variance` from the sample's size and the sums of its residuals and their
    squares (what additive window statistics keep)."""
    w = z * z / 2.0
    p_right, p_wrong = 1.0 - shift, -shift
    mean = (r_sum + w * (p_right + p_wrong)) / (m + 2 * w)
    ss = max(r_sq_sum - 2 * mean * r_sum + m * mean * mean, 0.0)
    ss += w * ((p_right - mean) ** 2 + (p_wrong - mean) ** 2)
    return ss / (m + 2 * w - 1)


def prediction_powered_accuracy(
    n: int,
    f_sum: float,
    f_sq_sum: float,
    f_labeled: np.ndarray,
    correct: np.ndarray,
    *,
    tuned: bool = True,
    z: float = Z95,
) -> LabeledEstimate | None:
    """The (power-tuned) prediction-powered accuracy of a window of ``n`` predictions whose predictor
    values sum to ``f_sum`` (squares to ``f_sq_sum``), from the predictor values ``f_labeled`` and
    correctness ``correct`` of a uniform random sample of them. ``None`` without labels or predictions.

    ``tuned=False`` gives plain PPI (λ = 1). The interval is clipped to [0, 1]."""
    f_lab = np.asarray(f_labeled, dtype=np.float64).reshape(-1)
    y = np.asarray(correct, dtype=np.float64).reshape(-1)
    if len(f_lab) != len(y):
        return None
    return prediction_powered_of_sums(
        n,
        f_sum,
        f_sq_sum,
        len(y),
        float(f_lab.sum()),
        float((f_lab * f_lab).sum()),
        float(y.sum()),
        float((y * f_lab).sum()),
        tuned=tuned,
        z=z,
    )


def prediction_powered_of_sums(
    n: int,
    f_sum: float,
    f_sq_sum: float,
    m: int,
    lab_f_sum: float,
    lab_f_sq_sum: float,
    lab_y_sum: float,
    lab_yf_sum: float,
    *,
    tuned: bool = True,
    z: float = Z95,
) -> LabeledEstimate | None:
    """:func:`prediction_powered_accuracy` from additive sums: the window's ``n``, Σf, Σf², and the
    labeled sample's size ``m``, Σf, Σf², ΣY and ΣYf (``Y`` is 0 or 1, so ΣY² = ΣY). Every
    variance and covariance of the estimator is a function of these sums."""
    if m <= 0 or n <= 0:
        return None
    big_n = max(int(n), m)
    f_mean = f_sum / n
    var_f = max(f_sq_sum / n - f_mean * f_mean, 0.0) * n / max(n - 1, 1)
    y_mean, lf_mean = lab_y_sum / m, lab_f_sum / m
    lam = 1.0
    if tuned:
        cov = (lab_yf_sum - m * y_mean * lf_mean) / (m - 1) if m > 1 else 0.0
        denom = (1.0 + m / big_n) * var_f
        lam = min(max(cov / denom, 0.0), 1.0) if denom > 1e-12 else 0.0
    value = clip01(y_mean + lam * (f_mean - lf_mean))
    if m < 2:
        lo, hi = wilson(lab_y_sum, m, z)  # one label: the Wilson interval of the labels alone
        return LabeledEstimate(value, min(lo, value), max(hi, value), int(n), m, lam)
    r_sum = lab_y_sum - lam * lab_f_sum
    r_sq_sum = lab_y_sum - 2 * lam * lab_yf_sum + lam * lam * lab_f_sq_sum
    var = lam * lam * var_f / big_n + rectifier_variance_of_sums(m, r_sum, r_sq_sum, lam * lf_mean, z) / m
    half = z * math.sqrt(var)
    raw = y_mean + lam * (f_mean - lf_mean)
    return LabeledEstimate(value, clip01(raw - half), clip01(raw + half), int(n), m, lam)
