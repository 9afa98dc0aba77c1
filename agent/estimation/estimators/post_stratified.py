"""``with_labels`` post-stratified on a segment dimension: the window's prediction-powered accuracy as the
traffic-weighted sum of its segments' own, so that a segment drawn far more often than the rest (a changed
segment the labels follow, :mod:`agent.labels.change_focus`) tightens the window's estimate instead of
widening it with unequal weights.

Within each stratum ``g`` of one dimension (its segments; those with fewer than :data:`MIN_LABELS` labels
pooled into one), with ``N_g`` predictions whose top-class probabilities ``f`` sum to ``F_g`` and labels of
weights ``w = 1/π`` (``π`` the draw probability) and rectifiers ``r = Y − f``:

    θ̂ = Σ_g (N_g / N) · (F_g / N_g + R̂_g),     R̂_g = Σ_g w r / Σ_g w        (the Hájek rectifier)

the difference estimator of prediction-powered inference (Angelopoulos et al., "Prediction-powered
inference", Science 382, 2023, the mean's rectified estimate with λ = 1) inside every stratum, combined by
the strata's known shares: post-stratification (Särndal, Swensson, Wretman, *Model Assisted Survey
Sampling*, 1992, §7.6). Its variance is ``σ_f² / N + Σ_g (N_g/N)² V_g``, ``V_g`` the larger of the Hájek
ratio's linearized variance under independent draws ``Σ v (r − R̂_g)² / (Σ w)²`` (``v = (1 − π)/π²``, times
``m/(m−1)``) and the Agresti-Coull-corrected rectifier variance at the Kish effective number of labels
(:func:`~agent.estimation.estimators.prediction_powered.rectifier_variance_of_sums`, times the stratum's
unsampled share ``1 − m/N_g``): a stratum whose few labels all agree never gets a zero-width interval.

Which dimension. Every dimension where every stratum with traffic has :data:`MIN_LABELS` labels is a
candidate; ``with_labels`` is the narrowest of them and of the whole window's inverse-probability-weighted
estimate (:mod:`agent.estimation.estimators.active`), the choice of least estimated variance among a handful,
as PPI++ chooses its λ. Where no dimension qualifies (labels stored before their segments were, draws whose
probabilities were not kept, too few labels), ``with_labels`` is the whole window's estimate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.estimation.estimators.prediction_powered import LabeledEstimate, rectifier_variance_of_sums
from agent.estimation.intervals import Z95, clip01
from agent.estimation.statistics.window import WindowStats

#: Labels a stratum needs to stand alone; strata with fewer are pooled (and the pool needs as many).
MIN_LABELS = 5

#: ``(dimension name, first segment number, end)`` of every dimension of the bundle's segmentation
Strata = Sequence[tuple[str, int, int]]


@dataclass(frozen=True)
class PostStratifiedEstimate(LabeledEstimate):
    """``with_labels`` post-stratified: :class:`LabeledEstimate` plus the dimension and its strata."""

    dimension: str = ""
    strata: int = 0

    def to_dict(self) -> dict[str, float | int | str]:
        return {**super().to_dict(), "post_stratified": self.dimension, "strata": self.strata}


def _groups(stats: WindowStats, a: int, b: int) -> np.ndarray | None:
    """The strata of segments ``a … b − 1`` as rows ``[N, F, m, Σw, Σw², Σwr, Σwr², Σw²r, Σw²r², Σwf]``, the
    segments with fewer than :data:`MIN_LABELS` labels pooled into one row; None where the dimension cannot be
    post-stratified (a prediction outside its segments, a stratum with traffic and too few labels)."""
    if len(stats.seg_n) < b or len(stats.seg_lab_n) < b or sum(stats.seg_n[a:b]) != stats.n:
        return None
    cols: list[Sequence[float]] = [
        stats.seg_n,
        stats.seg_conf,
        stats.seg_lab_n,
        stats.seg_lab_w,
        stats.seg_lab_w2,
        stats.seg_lab_wr,
        stats.seg_lab_wr2,
        stats.seg_lab_w2r,
        stats.seg_lab_w2r2,
        stats.seg_lab_wf,
    ]
    rows = np.array([c[a:b] for c in cols], dtype=np.float64).T
    rows = rows[rows[:, 0] > 0]
    alone = rows[:, 2] >= MIN_LABELS
    pooled = rows[~alone].sum(axis=0)
    if pooled[0] > 0 and pooled[2] < MIN_LABELS:
        return None
    out = rows[alone] if pooled[0] <= 0 else np.vstack([rows[alone], pooled])
    return out if len(out) >= 2 else None


def _stratum_variance(row: np.ndarray, z: float) -> float:
    """The variance of one stratum's Hájek rectifier (see the module docstring)."""
    n, _, m, w, w2, wr, wr2, w2r, w2r2, wf = row
    r_hat = wr / w
    # Σ v (r − R̂)² with v = (1 − π)/π² = w² − w: independent draws, each kept with its own probability
    ss = (w2r2 - 2 * r_hat * w2r + r_hat * r_hat * w2) - (wr2 - 2 * r_hat * wr + r_hat * r_hat * w)
    linear = max(ss, 0.0) / (w * w) * m / max(m - 1.0, 1.0)
    m_eff = w * w / w2
    spread = max(wr2 / w - r_hat * r_hat, 0.0)
    floor = rectifier_variance_of_sums(
        max(int(round(m_eff)), 2), m_eff * r_hat, m_eff * (spread + r_hat * r_hat), wf / w, z
    ) / max(m_eff, 1.0)
    return max(linear, floor * max(1.0 - m / n, 0.0))


def post_stratified(stats: WindowStats, strata: Strata, z: float = Z95) -> PostStratifiedEstimate | None:
    """``with_labels`` post-stratified on the candidate dimension of narrowest interval (module docstring),
    or None where no dimension qualifies."""
    if stats.n <= 0 or not stats.lab_ipw_n or not stats.seg_lab_n:
        return None
    best: PostStratifiedEstimate | None = None
    for name, a, b in strata:
        g = _groups(stats, a, b)
        if g is None or int(round(g[:, 2].sum())) != stats.lab_ipw_n:
            continue
        est = _estimate(stats, name, g, z)
        if best is None or est.upper - est.lower < best.upper - best.lower:
            best = est
    return best


def _estimate(stats: WindowStats, name: str, g: np.ndarray, z: float) -> PostStratifiedEstimate:
    n = float(stats.n)
    shares = g[:, 0] / n
    value = float(stats.conf_sum / n + np.sum(shares * g[:, 5] / g[:, 3]))
    f_var = max(stats.conf_sq_sum / n - (stats.conf_sum / n) ** 2, 0.0) / n
    var = f_var + sum(float(s) ** 2 * _stratum_variance(row, z) for s, row in zip(shares, g, strict=True))
    half = z * math.sqrt(var)
    return PostStratifiedEstimate(
        clip01(value),
        clip01(value - half),
        clip01(value + half),
        stats.n,
        n_labels=stats.lab_ipw_n,
        power=1.0,
        predictor="confidence",
        weighted=True,
        dimension=name,
        strata=len(g),
    )
