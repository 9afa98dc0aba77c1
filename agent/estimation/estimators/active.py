"""Active labeling: draw probabilities that grow with the predicted uncertainty, and the
inverse-probability-weighted prediction-powered accuracy of a window.

Zrnic & Candès, "Active Statistical Inference" (ICML 2024), §2–3: every prediction ``i`` of a window
of ``N`` is drawn into the labeling sample independently with probability ``π_i > 0`` (``ξ_i ∈ {0,1}``),
and with ``f_i`` a label-free predictor of ``Y_i = 1{correct}`` known for all ``N``,

    θ̂_λ = (1/N) Σ_N [λ f_i + ξ_i (Y_i − λ f_i) / π_i]

is unbiased for the window's accuracy for any ``π`` and any fixed ``λ`` (``E ξ_i = π_i``); so is it with
``λ f`` replaced by any fixed ``g = a + b f``. Its variance over the draws (the window's predictions
fixed: the target is *this* window's accuracy, a Horvitz–Thompson total under Poisson sampling) is
``(1/N²) Σ_N (1 − π_i)/π_i · (Y_i − g_i)²``, estimated without bias by ``(1/N²) Σ_labeled v_i
(Y_i − g_i)²`` with ``v_i = (1 − π_i)/π_i²``. Power tuning (the λ of PPI++ and of §3's power-tuned
active estimator, widened to an intercept as the difference estimator of survey sampling does:
Särndal, Swensson & Wretman 1992, §6.3) takes the ``(a, b)`` minimising that estimate, ``b`` clipped to
[0, 1]: under a shift the predictor's errors are rarely a pure scale, and an uncentred residual
``Y − λ f`` of a miscalibrated ``f`` is large wherever ``π`` is small. Estimating ``(a, b)`` on the same
sample biases the estimate by O(1/m) only, as λ does in PPI++.

The variance is smallest when ``π_i ∝ sqrt(E[(Y − f)² | x_i])``, which for a
calibrated ``f`` is ``sqrt(f_i (1 − f_i))`` (§3, the optimal sampling rule for mean estimation);
:func:`draw_probabilities` mixes that rule with a uniform floor so that every prediction can be drawn
and no weight ``1/π`` is huge where ``f`` is wrong (a shifted window).

Small samples: with few labels and rare errors the plug-in variance can be near zero. As the uniform
form does (:func:`~agent.estimation.estimators.prediction_powered.rectifier_variance`, Agresti & Coull 1998),
``z²/2`` pseudo-labels right and ``z²/2`` wrong join the sample, with residuals ``1 − ḡ`` and ``−ḡ``
(``ḡ`` the weighted mean of ``g`` on the sample), a right one weighted by the mean ``v`` of the labeled
predictions weighted by their predicted probability of being right (``Σvf / Σf``), a wrong one by
their predicted probability of being wrong (``Σv(1 − f) / Σ(1 − f)``): the weight an error of this
design is expected to carry. Under uniform draws both are the uniform weight and the correction is
the uniform form's; under active draws errors are expected where ``π`` is high, so the correction does
not charge the design for the rarely drawn predictions it was right to skip. The point estimate is
unchanged and the term vanishes as the sample grows.

Everything is additive (:class:`~agent.estimation.statistics.window.WindowStats`): the window's ``N`` and
Σf of the predictor (``pcorrect_n``, ``pcorrect_sum``), and on the labeled sample ``Σf``, ``Σ1/π``,
``ΣY/π``, ``Σf/π``, ``Σv``, ``Σvf``, ``ΣvY``, ``ΣvYf``, ``Σvf²`` (its ``lab_ipw_*`` fields).
"""

from __future__ import annotations

import math

import numpy as np

from agent.estimation.estimators.prediction_powered import LabeledEstimate
from agent.estimation.intervals import Z95, clip01
from agent.estimation.statistics.window import WindowStats, weighted_sums

#: Share of the budget drawn uniformly (the floor of :func:`draw_probabilities`): every prediction is
#: drawn with probability at least this share of the mean rate, so no weight ``1/π`` exceeds twice the
#: uniform one. A defensive mixture (Hesterberg 1995): where a shift makes the predictor wrong, the
#: interval rests on a few labels of predictions it thought safe, and bounded weights keep its variance
#: estimate steady; the savings come from confident traffic, which a floor of a half hardly touches
#: (``python -m bench.labels --floor F`` compares floors).
DEFAULT_FLOOR = 0.5


def uncertainty(predicted_correct: np.ndarray) -> np.ndarray:
    """``sqrt(f (1 − f))``: the standard deviation of ``Y`` under a calibrated ``f`` (the optimal
    draw probability is proportional to it)."""
    f = np.clip(np.asarray(predicted_correct, dtype=np.float64), 0.0, 1.0)
    return np.sqrt(f * (1.0 - f))


def draw_probabilities(
    predicted_correct: np.ndarray, rate: float, mean_uncertainty: float, floor: float = DEFAULT_FLOOR
) -> np.ndarray:
    """Per prediction, ``π = rate · ((1 − floor) · u / ū + floor)`` clipped to at most 1, with ``u`` its
    :func:`uncertainty` and ``ū`` the mean uncertainty of the traffic (``mean_uncertainty``, a smoothed
    figure the caller keeps): the expected number drawn is ``rate`` per prediction on average (less
    where some are clipped, see :func:`rate_for`). ``floor`` in (0, 1]: every prediction is drawn with
    probability at least ``rate · floor``."""
    return spread_probabilities(uncertainty(predicted_correct), rate, mean_uncertainty, floor)


def spread_probabilities(
    spread: np.ndarray,
    rate: float,
    mean_spread: float,
    floor: float = DEFAULT_FLOOR,
    focus: np.ndarray | None = None,
    mean_focus: float = 1.0,
) -> np.ndarray:
    """:func:`draw_probabilities` of predictions whose residual standard deviation is ``spread`` (any
    Neyman allocation: :mod:`agent.estimation.estimators.strata` learns it from the labels), ``mean_spread`` the
    traffic's mean. ``focus``: a factor ``g ≥ 1`` per prediction (the predictions of segments whose inputs
    changed, :mod:`agent.labels.change_focus`) multiplying its whole probability, floor included, over the
    traffic's mean factor ``mean_focus`` (so the budget stays the same: the floor is then ``rate · floor /
    mean_focus``)."""
    if not 0.0 < floor <= 1.0:
        raise ValueError(f"the floor of the draw probabilities must lie in (0, 1], not {floor}")
    u = np.asarray(spread, dtype=np.float64)
    mean_u = float(mean_spread)
    shape = u / mean_u if mean_u > 1e-12 else np.ones_like(u)
    pi = max(float(rate), 0.0) * ((1.0 - floor) * shape + floor)
    if focus is not None:
        pi = pi * np.asarray(focus, dtype=np.float64) / max(float(mean_focus), 1e-12)
    return np.asarray(np.clip(pi, 0.0, 1.0), dtype=np.float64)


def rate_for(
    predicted_correct: np.ndarray,
    target_rate: float,
    mean_uncertainty: float,
    floor: float = DEFAULT_FLOOR,
    *,
    spread: np.ndarray | None = None,
    focus: np.ndarray | None = None,
) -> float:
    """The ``rate`` of :func:`draw_probabilities` whose mean probability over ``predicted_correct`` is
    ``target_rate`` (higher than it where some probabilities are clipped at 1; bisection, 50 steps;
    ``1 / floor`` draws every prediction). ``spread``, ``focus``: of :func:`spread_probabilities` instead (the
    focus over its mean over ``predicted_correct``)."""
    goal = min(max(float(target_rate), 0.0), 1.0)
    top = 1.0 / floor
    if goal <= 0.0 or len(predicted_correct) == 0:
        return goal
    if goal >= 1.0:
        return top
    u = uncertainty(predicted_correct) if spread is None else np.asarray(spread, dtype=np.float64)
    mean_focus = float(np.mean(focus)) if focus is not None else 1.0
    lo, hi = (goal if focus is None else 0.0), top * mean_focus  # a focus may draw more than its mean
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if float(spread_probabilities(u, mid, mean_uncertainty, floor, focus, mean_focus).mean()) < goal:
            lo = mid
        else:
            hi = mid
    return hi


def _tuned(m: int, v_sum: float, vf_sum: float, vy_sum: float, vyf_sum: float, vff_sum: float) -> tuple[float, float]:
    """``(a, b)`` minimising ``Σ v (Y − a − b f)²`` (weighted least squares, ``b`` clipped to [0, 1]);
    ``(0, 1)`` (plain active PPI) when the sample cannot determine them."""
    if m < 3 or v_sum <= 1e-12:
        return 0.0, 1.0
    f_bar = vf_sum / v_sum
    sxx = vff_sum - v_sum * f_bar * f_bar
    sxy = vyf_sum - f_bar * vy_sum
    b = min(max(sxy / sxx, 0.0), 1.0) if sxx > 1e-12 * max(v_sum, 1.0) else 0.0
    return (vy_sum - b * vf_sum) / v_sum, b


def active_of_sums(
    n: int,
    f_sum: float,
    m: int,
    f_sum_lab: float,
    w_sum: float,
    wy_sum: float,
    wf_sum: float,
    v_sum: float,
    vf_sum: float,
    vy_sum: float,
    vyf_sum: float,
    vff_sum: float,
    *,
    tuned: bool = True,
    z: float = Z95,
) -> LabeledEstimate | None:
    """The inverse-probability-weighted (power-tuned) prediction-powered accuracy of a window of ``n``
    predictions whose predictor values sum to ``f_sum``, from the :func:`weighted_sums` of its labeled
    sample (see the module docstring). ``tuned=False``: ``g = f``. ``None`` without labels or predictions."""
    if m <= 0 or n <= 0:
        return None
    a, b = _tuned(m, v_sum, vf_sum, vy_sum, vyf_sum, vff_sum) if tuned else (0.0, 1.0)
    raw = (a * n + b * f_sum + wy_sum - a * w_sum - b * wf_sum) / n
    # Σ v (Y − a − b f)² with Y² = Y
    ss = vy_sum * (1.0 - 2.0 * a) - 2.0 * b * vyf_sum + a * a * v_sum + 2.0 * a * b * vf_sum + b * b * vff_sum
    g_bar = a + b * (wf_sum / w_sum if w_sum > 0 else 0.0)
    # the mean v of a wrong and of a right labeled prediction, as the predictor expects them
    v_wrong = (v_sum - vf_sum) / (m - f_sum_lab) if m - f_sum_lab > 1e-12 else v_sum / m
    v_right = vf_sum / f_sum_lab if f_sum_lab > 1e-12 else v_sum / m
    pseudo = z * z / 2.0 * (v_right * (1.0 - g_bar) ** 2 + v_wrong * g_bar**2)
    half = z * math.sqrt(max(ss, 0.0) + pseudo) / n
    value = clip01(raw)
    return LabeledEstimate(value, clip01(raw - half), clip01(raw + half), int(n), m, b)


def active_accuracy(
    f_all: np.ndarray,
    labeled: np.ndarray,
    correct: np.ndarray,
    draw_probability: np.ndarray,
    *,
    tuned: bool = True,
    z: float = Z95,
) -> LabeledEstimate | None:
    """:func:`active_of_sums` of a window whose predictor values are ``f_all`` [N], from the indices
    ``labeled`` of its labeled predictions, their correctness and their draw probabilities."""
    f = np.asarray(f_all, dtype=np.float64).reshape(-1)
    idx = np.asarray(labeled, dtype=np.int64).reshape(-1)
    sums = weighted_sums(f[idx], correct, draw_probability)
    return active_of_sums(len(f), float(f.sum()), *sums, tuned=tuned, z=z)


def active_of_stats(stats: WindowStats) -> LabeledEstimate | None:
    """:func:`active_of_sums` of a window's statistics: its calibrated predictor's sum (``pcorrect_*``) and its
    labeling sample's weighted sums (``lab_ipw_*``)."""
    return active_of_sums(
        stats.n,
        stats.pcorrect_sum,
        stats.lab_ipw_n,
        stats.lab_ipw_f_sum,
        stats.lab_ipw_w_sum,
        stats.lab_ipw_wy_sum,
        stats.lab_ipw_wf_sum,
        stats.lab_ipw_v_sum,
        stats.lab_ipw_vf_sum,
        stats.lab_ipw_vy_sum,
        stats.lab_ipw_vyf_sum,
        stats.lab_ipw_vff_sum,
    )
