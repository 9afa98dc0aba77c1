"""How far a window lies from what ``shift_aware`` was calibrated on, and how much of its learnt
correction to keep there.

``shift_aware`` corrects a confidence-based estimate with regressions learnt on windows of the
calibration split and its corrupted copies. Two situations make that correction worse than the
confidence it corrects:

* the window *looks like the clean calibration split*: confidence calibrated on that split is then
  the right estimate (CBPE-style, Kivimäki et al. 2024 / NannyML), and a correction learnt from
  corrupted windows only adds its own error;
* the window lies *outside the support of the calibration windows*: the regression extrapolates.

:class:`TrustModel` measures both from the window's feature vector (the additive statistics of
:class:`~agent.estimation.statistics.window.WindowStats`, so no new statistic is needed):

``drift``
    the root-mean-square z-score of the window's features against the clean calibration windows,
    each feature's spread scaled by √n so that it means the same for windows of any size;
``distance`` (the *trust distance*, exported)
    the mean standardised distance to the :data:`NEIGHBOURS` nearest calibration windows, divided by
    the 95% quantile of that distance among the calibration windows themselves: ≤ 1 is inside the
    calibrated range, 2 is twice as far as the calibration windows' own spread.

The estimate is ``base + w · (learnt − base)`` with ``w = drift_weight · support_weight``
(:func:`blend`): ``base`` is the CBPE-style confidence estimate (mean top-class probability plus the
calibration split's accuracy offset per confidence bin, :func:`confidence_offsets`). The interval
widens from the learnt model's error to the confidence estimate's error on the calibration windows
as ``w`` falls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.estimation.layout import CONF_EDGES, N_CONF_BINS, conf_bins, floored_scales
from invariants.fit_params import CalibrationPlan

#: Nearest calibration windows the trust distance averages over.
NEIGHBOURS = 5
#: Pseudo-samples pulling a confidence bin's accuracy offset toward 0 (bins with few samples).
OFFSET_PRIOR = 20.0
#: Fewer wrong predictions than this in the calibration split and the confidence offsets (and the
#: correction learnt near clean data) are noise: the calibration falls back to raw confidence.
MIN_CALIBRATION_ERRORS = 10
#: Trust distance up to which the learnt correction is used whole, and from which not at all.
FULL_TRUST = 1.0
NO_TRUST = 2.0
#: Floor of a feature's √n-scaled spread among clean windows (features that never vary there).
MIN_SPREAD = 0.05


def confidence_offsets(
    confidences: np.ndarray, correct: np.ndarray, weights: np.ndarray | None = None
) -> tuple[float, ...]:
    """Per confidence bin (:data:`CONF_EDGES`), the calibration split's accuracy minus its mean
    top-class probability, shrunk by :data:`OFFSET_PRIOR` pseudo-samples toward the split's overall
    offset (itself shrunk toward 0 by as many), and never above ``1 −`` the bin's lowest confidence. All
    zeros when the
    split holds fewer than :data:`MIN_CALIBRATION_ERRORS` wrong predictions (raw confidence is then
    the calibration that still works). ``weights`` (summing to the number of samples, e.g. inverse draw
    probabilities scaled so) weight every sum."""
    c = np.asarray(confidences, dtype=np.float64).reshape(-1)
    ok = np.asarray(correct, dtype=np.float64).reshape(-1)
    if len(c) == 0 or int(len(ok) - ok.sum()) < MIN_CALIBRATION_ERRORS:
        return (0.0,) * N_CONF_BINS
    w = np.ones(len(c)) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    b = conf_bins(c)
    diff = np.bincount(b, weights=w * (ok - c), minlength=N_CONF_BINS)[:N_CONF_BINS]
    count = np.bincount(b, weights=w, minlength=N_CONF_BINS)[:N_CONF_BINS]
    # partial pooling: a bin of few samples borrows the split's overall offset, not 0 (a model that is
    # underconfident everywhere, e.g. a linear text model, is so in its thin bins too), capped where it
    # would claim an accuracy above 1 for the bin's lowest confidence
    pooled = float(diff.sum()) / (len(c) + OFFSET_PRIOR)
    offsets = (diff + OFFSET_PRIOR * pooled) / (count + OFFSET_PRIOR)
    ceiling = 1.0 - np.concatenate([[0.0], np.asarray(CONF_EDGES, dtype=np.float64)])[:N_CONF_BINS]
    return tuple(float(v) for v in np.minimum(offsets, ceiling))


def confidence_base(bin_shares: Sequence[float], mean_confidence: float, offsets: Sequence[float]) -> float:
    """The CBPE-style estimate: mean top-class probability plus the offset of every confidence bin
    weighted by the window's share of samples in it (not clipped)."""
    if not offsets:
        return float(mean_confidence)
    return float(mean_confidence + float(np.dot(np.asarray(bin_shares[: len(offsets)]), np.asarray(offsets))))


def ramp(value: float, start: float, end: float) -> float:
    """0 at or below ``start``, 1 at or above ``end``, linear between."""
    if end <= start:
        return 1.0 if value > start else 0.0
    return float(min(1.0, max(0.0, (value - start) / (end - start))))


@dataclass(frozen=True)
class Trust:
    """Where a window lies relative to the calibration windows (see the module docstring).

    ``distance``: the trust distance; ``calibrated``: ``distance ≤ FULL_TRUST`` (the estimate is
    inside the calibrated range); ``drift``: the drift from the clean calibration split in z-units;
    ``weight``: the share of the learnt correction the estimate keeps (0: the confidence estimate).
    """

    distance: float
    calibrated: bool
    drift: float
    weight: float

    def to_dict(self) -> dict[str, float | bool]:
        return {"distance": self.distance, "calibrated": self.calibrated, "drift": self.drift, "weight": self.weight}


@dataclass(frozen=True)
class KindSupport:
    """The calibration windows of one model kind (``full``/``inputs``/``reduced``), standardised."""

    scale: tuple[float, ...]
    points: tuple[tuple[float, ...], ...]
    radius: float
    clean_mean: tuple[float, ...]
    clean_spread: tuple[float, ...]
    drift_q90: float
    #: samples in the clean calibration split: its own mean is off the population's by ~spread/√n_clean
    n_clean: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "_scale", np.asarray(self.scale, dtype=np.float64))
        object.__setattr__(self, "_points", np.asarray(self.points, dtype=np.float64).reshape(-1, len(self.scale)))
        object.__setattr__(self, "_mean", np.asarray(self.clean_mean, dtype=np.float64))
        object.__setattr__(self, "_spread", np.asarray(self.clean_spread, dtype=np.float64))

    def distance(self, x: np.ndarray) -> float:
        """Mean standardised distance to the nearest calibration windows, over :attr:`radius`."""
        pts = self._points  # type: ignore[attr-defined]
        z = np.asarray(x, dtype=np.float64)[: len(self.scale)] / self._scale  # type: ignore[attr-defined]
        d = np.sqrt(((pts - z) ** 2).sum(axis=1))
        k = min(NEIGHBOURS, len(d))
        return float(np.partition(d, k - 1)[:k].mean() / self.radius) if k else math.inf

    def drift(self, x: np.ndarray, n: int, *, resample: bool = False) -> float:
        """Root-mean-square z-score against the clean calibration windows. A feature's standard error
        is its per-sample spread times √(1/n + 1/n_clean): the window's sampling noise plus that of the
        clean split's own mean (``resample``: without the latter, for windows drawn from the split)."""
        xx = np.asarray(x, dtype=np.float64)[: len(self.scale)]
        var = 1.0 / max(n, 1) + (1.0 / self.n_clean if self.n_clean > 0 and not resample else 0.0)
        z = (xx - self._mean) / (self._spread * math.sqrt(var))  # type: ignore[attr-defined]
        return float(np.sqrt(np.mean(z * z)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "scale": list(self.scale),
            "points": [list(p) for p in self.points],
            "radius": self.radius,
            "clean_mean": list(self.clean_mean),
            "clean_spread": list(self.clean_spread),
            "drift_q90": self.drift_q90,
            "n_clean": self.n_clean,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KindSupport:
        return cls(
            scale=tuple(float(v) for v in d["scale"]),
            points=tuple(tuple(float(v) for v in p) for p in d["points"]),
            radius=float(d["radius"]),
            clean_mean=tuple(float(v) for v in d["clean_mean"]),
            clean_spread=tuple(float(v) for v in d["clean_spread"]),
            drift_q90=float(d["drift_q90"]),
            n_clean=int(d.get("n_clean", 0)),
        )

    @classmethod
    def fit(
        cls,
        windows: np.ndarray,
        clean: np.ndarray,
        clean_n: np.ndarray,
        rng: np.random.Generator,
        n_clean: int = 0,
        *,
        max_points: int = CalibrationPlan.trust_points,
    ) -> KindSupport:
        """From the feature vectors of the calibration windows and of windows resampled from the clean
        split (``clean_n``: their sizes; ``n_clean``: the split's size)."""
        x = np.asarray(windows, dtype=np.float64)
        scale = floored_scales(x.std(axis=0), 1e-6)
        keep = rng.permutation(len(x))[:max_points]
        pts = x[keep] / scale
        d = np.sqrt(((pts[:, None, :] - pts[None, :, :]) ** 2).sum(axis=2))
        np.fill_diagonal(d, np.inf)
        k = min(NEIGHBOURS, max(len(pts) - 1, 1))
        nn = np.sort(d, axis=1)[:, :k].mean(axis=1) if len(pts) > 1 else np.ones(1)
        radius = max(float(np.quantile(nn, 0.95)), 1e-9)
        c = np.asarray(clean, dtype=np.float64)
        mean = c.mean(axis=0)
        spread = np.maximum(((c - mean) * np.sqrt(clean_n)[:, None]).std(axis=0), MIN_SPREAD)
        out = cls(tuple(scale), tuple(tuple(p) for p in pts), radius, tuple(mean), tuple(spread), 1.0, n_clean)
        drifts = np.array([out.drift(row, int(m), resample=True) for row, m in zip(c, clean_n, strict=True)])
        q90 = float(np.quantile(drifts, 0.9))
        return cls(out.scale, out.points, radius, out.clean_mean, out.clean_spread, q90, n_clean)


@dataclass(frozen=True)
class TrustModel:
    """Per model kind, the calibration windows' support and the clean split's statistics; the 95%
    error of the confidence estimate on clean windows (``q_clean``) and on all calibration windows
    (``q_base``), the interval's half-width where the learnt correction is not used."""

    kinds: Mapping[str, KindSupport]
    q_clean: float
    q_base: float
    calibration_errors: int

    def trust(self, kind: str, x: np.ndarray, n: int) -> Trust:
        sup = self.kinds[kind]
        dist = sup.distance(x)
        drift = sup.drift(x, n)
        # near clean data: the confidence estimate; drifted and inside the support: the learnt one
        w_drift = ramp(drift, sup.drift_q90, 2 * sup.drift_q90)
        if self.calibration_errors < MIN_CALIBRATION_ERRORS:
            w_drift = ramp(drift, 2 * sup.drift_q90, 4 * sup.drift_q90)
        w_support = 1.0 - ramp(dist, FULL_TRUST, NO_TRUST)
        return Trust(dist, dist <= FULL_TRUST, drift, w_drift * w_support)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kinds": {k: v.to_dict() for k, v in self.kinds.items()},
            "q_clean": self.q_clean,
            "q_base": self.q_base,
            "calibration_errors": self.calibration_errors,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrustModel:
        return cls(
            kinds={str(k): KindSupport.from_dict(v) for k, v in dict(d["kinds"]).items()},
            q_clean=float(d["q_clean"]),
            q_base=float(d["q_base"]),
            calibration_errors=int(d["calibration_errors"]),
        )


def blend(learnt: float, base: float, q_learnt: float, trust: Trust, model: TrustModel) -> tuple[float, float]:
    """The estimate ``base + w (learnt − base)`` and its model-error half-width: the learnt model's
    where ``w`` = 1, the confidence estimate's on clean windows where the window looks clean, and its
    error on all calibration windows where the window leaves their support, growing in proportion to
    the distance beyond :data:`NO_TRUST` (nothing was calibrated there)."""
    w = trust.weight
    value = base + w * (learnt - base)
    sup = 1.0 - ramp(trust.distance, FULL_TRUST, NO_TRUST)
    beyond = max(trust.distance, NO_TRUST) / NO_TRUST if math.isfinite(trust.distance) else 1.0 / model.q_base
    fallback = sup * model.q_clean + (1.0 - sup) * model.q_base * beyond
    return value, w * q_learnt + (1.0 - w) * max(fallback, model.q_clean)
