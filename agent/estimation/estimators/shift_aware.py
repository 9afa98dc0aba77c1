"""The ``shift_aware`` estimate of a window: its feature vector and the calibrated regressions.

See :mod:`agent.estimation.estimators.registry` for the method and
:mod:`agent.offline.calibration.estimators.shift_fitting` for how the regressions and their interval tables are fitted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.estimation.estimators.shift_calibration import ShiftCalibration
from agent.estimation.estimators.trust import Trust, blend, confidence_base
from agent.estimation.intervals import Z95, Estimate, clip01
from agent.estimation.layout import (
    FULL_FEATURES,
    INPUTS_FEATURES,
    MEAN_CONFIDENCE,
    N_CONF_BINS,
    N_VERDICTS,
    REDUCED_FEATURES,
)
from agent.estimation.statistics.reference import InputReference
from agent.estimation.statistics.window import WindowStats
from invariants.oracle import FAMILIES


@dataclass(frozen=True)
class ShiftAwareParts:
    """The pieces of a ``shift_aware`` estimate (for reports and the benchmark)."""

    estimate: Estimate
    model: str  # "full", "inputs" or "reduced"
    features: dict[str, float]
    #: where the window lies relative to the calibration windows (None: a bundle without a trust model)
    trust: Trust | None = None


def class_features(stats: WindowStats, reference: InputReference) -> np.ndarray:
    """:data:`CLASS_FEATURES` of a window whose samples all carry their predicted label."""
    k = reference.n_classes
    counts = np.asarray(stats.class_counts, dtype=np.float64)
    n = float(counts.sum())
    share = counts / max(n, 1.0)
    nz = share[share > 0]
    entropy = float(-(nz * np.log(nz)).sum() / math.log(k)) if k > 1 else 0.0
    ref = np.asarray(reference.class_conf, dtype=np.float64)
    mean_conf = np.divide(np.asarray(stats.class_conf, dtype=np.float64), counts, out=ref.copy(), where=counts > 0)
    drop = float(np.max(share * (ref - mean_conf))) if k else 0.0
    return np.array([entropy, float(share.max()) if k else 0.0, drop])


def window_features(stats: WindowStats, reference: InputReference) -> tuple[np.ndarray, str]:
    """The feature vector of a window and the model it is for: ``full`` (:data:`FULL_FEATURES`) when
    every sample carries the optional per-sample inputs and its predicted label, ``inputs``
    (:data:`INPUTS_FEATURES`) when the labels are missing, else ``reduced`` (:data:`REDUCED_FEATURES`)."""
    n = stats.n
    if n <= 0:
        return np.zeros(len(REDUCED_FEATURES)), "reduced"
    cells = np.asarray(stats.cells, dtype=np.float64).reshape(N_VERDICTS, N_CONF_BINS)
    fam = stats.fails_by_family
    reduced = np.r_[
        cells.sum(axis=0) / n,
        stats.conf_sum / n,
        [fam.get(family, 0) / n for family in FAMILIES],
    ]
    if stats.n_ext != n:
        return reduced, "reduced"
    if reference.n_rules and len(stats.leaves) == reference.n_leaf_bins:
        ref_share = reference.leaf_bin_ref  # type: ignore[attr-defined]
        leaf_tv = 0.5 * float(np.abs(np.asarray(stats.leaves) / n - ref_share).sum())
    else:
        leaf_tv = 0.0
    full = np.r_[
        reduced,
        stats.tdi_agree / n,
        stats.tdi_covered / n,
        leaf_tv,
        np.asarray(stats.pca_bins, dtype=np.float64) / n,
        stats.pca_sum / n,
        stats.margin_sum / n,
    ]
    k = reference.n_classes
    if k and stats.n_cls == n and len(stats.class_counts) == k and len(stats.class_conf) == k:
        return np.r_[full, class_features(stats, reference)], "full"
    return full, "inputs"


def _half_width(q_edges: Sequence[float], q: Sequence[float], value: float) -> float:
    return float(q[int(np.searchsorted(np.asarray(q_edges), value, side="right"))])


def shift_aware(stats: WindowStats, cal: ShiftCalibration, offsets: Sequence[float] = ()) -> ShiftAwareParts:
    """The ``shift_aware`` estimate of a window (see the module docstring).

    With a trust model in the calibration, the learnt estimate is shrunk toward the confidence
    estimate (mean confidence plus the calibration split's per-bin ``offsets``) where the window
    looks like the clean split or leaves the calibration windows' support, and the interval widens
    there (:func:`agent.estimation.estimators.trust.blend`)."""
    n = stats.n
    if n <= 0:
        return ShiftAwareParts(Estimate(0.0, 0.0, 1.0, 0), "reduced", {})
    x, kind = window_features(stats, cal.reference)
    q, names = {
        "full": (cal.q_full, FULL_FEATURES),
        "inputs": (cal.q_inputs, INPUTS_FEATURES),
        "reduced": (cal.q_reduced, REDUCED_FEATURES),
    }[kind]
    value = clip01(float(cal.predict(kind, x)[0]))
    model_err = _half_width(cal.q_edges, q, value)
    trust = None
    if cal.trust is not None and kind in cal.trust.kinds:
        trust = cal.trust.trust(kind, x, n)
        base = clip01(confidence_base(x[:N_CONF_BINS].tolist(), float(x[MEAN_CONFIDENCE]), offsets))
        blended, model_err = blend(value, base, model_err, trust, cal.trust)
        value = clip01(blended)
    sampling = Z95 * math.sqrt(value * (1 - value) / n)
    half = math.hypot(model_err, sampling)
    est = Estimate(value, clip01(value - half), clip01(value + half), n)
    return ShiftAwareParts(est, kind, dict(zip(names, (float(v) for v in x), strict=True)), trust)
