"""Whether a window moved beyond what its own mix of predicted classes explains: the class-adjusted test.

Every window statistic that is a mean of a per-sample quantity (:data:`QUANTITIES`: the confidence bins,
the mean confidence, the fail share of each oracle family, TDI agreement and coverage, the PCA-error
bins, the mean PCA error, the margin) has, per *predicted* class ``k``, a mean ``M[k]`` and a variance
``S[k]`` on the clean calibration split (:class:`ClassReference`). Under a pure change of the class mix
(label shift: ``p(x | y)`` unchanged, where confidence-based estimates hold) a window's value is
expected at ``Σ_k share_k M[k]``, ``share`` its own predicted class mix (already in
:class:`~agent.estimation.statistics.window.WindowStats`). What departs from that expectation beyond sampling
noise is a covariate shift; what the mix alone explains is not. :meth:`ClassReference.test` gives:

``z``
    the root-mean-square over the quantities of ``(x − share·M) / √(share·S/n + share²·S/(n_k + prior))``:
    how far the window lies from what its class mix predicts, in units of its sampling noise;
``effect``
    the same departures in units of each quantity's per-sample spread (an effect size, the same for
    windows of any size: what the flag reads);
``class_z``
    the normalised χ² of the window's class mix against the calibration split's (``(χ² − (K − 1)) /
    √(2(K − 1))``): whether the mix itself moved beyond noise;
``groups``
    ``z`` over the quantities of each group (:data:`GROUPS`), which name what moved in ``trust.reasons``.

A window whose class mix moved (``class_z`` > :data:`CLASS_Z`) while every quantity stays within noise
of what that mix predicts (``z`` ≤ :data:`MIX_Z`) is a change of class mix alone (:attr:`MixTest.mix_only`).
No new window statistic is needed: the bundle stores ``M`` and ``S`` of the classes its calibration
split predicted (the others take the overall mean and variance).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from agent.estimation.layout import CONF_EDGES, N_CONF_BINS, N_PCA_BINS, N_VERDICTS
from invariants.oracle import FAMILIES


class WindowSums(Protocol):
    """The additive sums of a window the test reads (:class:`~agent.estimation.statistics.window.WindowStats`
    has them; the calibration it is stored in sits below the statistics, so the test names only these)."""

    @property
    def n(self) -> int: ...
    @property
    def cells(self) -> Sequence[int]: ...
    @property
    def conf_sum(self) -> float: ...
    @property
    def fails_by_family(self) -> Mapping[str, int]: ...
    @property
    def n_ext(self) -> int: ...
    @property
    def tdi_agree(self) -> int: ...
    @property
    def tdi_covered(self) -> int: ...
    @property
    def pca_bins(self) -> Sequence[int]: ...
    @property
    def pca_sum(self) -> float: ...
    @property
    def margin_sum(self) -> float: ...
    @property
    def n_cls(self) -> int: ...
    @property
    def class_counts(self) -> Sequence[int]: ...
    @property
    def cbpe_n(self) -> int: ...
    @property
    def cbpe_predicted(self) -> Sequence[int]: ...


class SampleInputs(Protocol):
    """The per-sample inputs the quantities read (:class:`~agent.estimation.statistics.window.SampleExtras`)."""

    @property
    def agree(self) -> np.ndarray: ...
    @property
    def covered(self) -> np.ndarray: ...
    @property
    def pca_error(self) -> np.ndarray: ...
    @property
    def margin(self) -> np.ndarray: ...


#: The per-sample quantities whose window means the test compares, in order.
QUANTITIES: tuple[str, ...] = (
    *(f"conf_bin_{i}" for i in range(N_CONF_BINS)),
    "confidence",
    *(f"fail_{f}" for f in FAMILIES),
    "tdi_agree",
    "tdi_covered",
    *(f"pca_bin_{i}" for i in range(N_PCA_BINS)),
    "pca_error",
    "margin",
)
#: The first quantities, which every window has (verdicts and confidences alone); the rest need the
#: per-sample inputs (:class:`~agent.estimation.statistics.window.SampleExtras`).
N_REDUCED = N_CONF_BINS + 1 + len(FAMILIES)
#: Groups of quantities, each named as the evidence it is in ``trust.reasons``.
GROUPS: dict[str, tuple[int, ...]] = {
    "confidence_shifted": (*range(N_CONF_BINS + 1), len(QUANTITIES) - 1),
    "oracle_verdicts_shifted": tuple(range(N_CONF_BINS + 1, N_REDUCED)),
    "inputs_unlike_reference": tuple(range(N_REDUCED, len(QUANTITIES) - 1)),
}
#: Pseudo-samples pulling a class's mean toward the overall one (classes the split predicted rarely).
PRIOR = 5.0
#: Floor of a quantity's per-sample standard deviation (one that never moves on clean data).
MIN_STD = 0.05
#: The class mix moved: its normalised χ² above this.
CLASS_Z = 3.0
#: Every quantity within noise of what the class mix predicts: ``z`` at most this.
MIX_Z = 2.0


def per_sample_quantities(
    verdicts: np.ndarray, confidences: np.ndarray, extras: SampleInputs | None, pca_edges: Sequence[float]
) -> np.ndarray:
    """``[N, Q]``: every sample's :data:`QUANTITIES` (one-hot bins, fail flags by family); only the first
    :data:`N_REDUCED` without ``extras``."""
    conf = np.asarray(confidences, dtype=np.float64).reshape(-1)
    n = len(conf)
    cb = np.searchsorted(np.asarray(CONF_EDGES), conf, side="right")
    v = np.asarray(verdicts, dtype=np.int64).reshape(-1)
    reduced = [np.eye(N_CONF_BINS)[cb], conf[:, None], np.eye(N_VERDICTS)[np.clip(v, 0, N_VERDICTS - 1)][:, 1:]]
    if extras is None:
        return np.concatenate(reduced, axis=1).reshape(n, N_REDUCED)
    pb = np.searchsorted(np.asarray(pca_edges, dtype=np.float64), extras.pca_error, side="right")
    full = [
        *reduced,
        np.asarray(extras.agree, dtype=np.float64)[:, None],
        np.asarray(extras.covered, dtype=np.float64)[:, None],
        np.eye(N_PCA_BINS)[np.minimum(pb, N_PCA_BINS - 1)],
        np.asarray(extras.pca_error, dtype=np.float64)[:, None],
        np.asarray(extras.margin, dtype=np.float64)[:, None],
    ]
    return np.concatenate(full, axis=1).reshape(n, len(QUANTITIES))


def window_means(stats: WindowSums) -> np.ndarray:
    """The window's means of :data:`QUANTITIES` from its additive sums (the first :data:`N_REDUCED` only
    when some sample came without its per-sample inputs)."""
    n = stats.n
    cells = np.asarray(stats.cells, dtype=np.float64).reshape(N_VERDICTS, N_CONF_BINS)
    fam = stats.fails_by_family
    reduced = np.r_[cells.sum(axis=0) / n, stats.conf_sum / n, [fam.get(f, 0) / n for f in FAMILIES]]
    if stats.n_ext != n or len(stats.pca_bins) != N_PCA_BINS:
        return reduced
    return np.r_[
        reduced,
        stats.tdi_agree / n,
        stats.tdi_covered / n,
        np.asarray(stats.pca_bins, dtype=np.float64) / n,
        stats.pca_sum / n,
        stats.margin_sum / n,
    ]


def class_shares(stats: WindowSums, k: int) -> np.ndarray | None:
    """The window's mix of predicted classes (counts of every sample's predicted class, from the per-sample
    inputs or from CBPE's per-class sums), or None when the window does not hold it for all ``k`` classes
    (e.g. a fleet's sums above the class cap)."""
    for counts, total in ((stats.class_counts, stats.n_cls), (stats.cbpe_predicted, stats.cbpe_n)):
        if total == stats.n and total > 0 and len(counts) == k:
            return np.asarray(counts, dtype=np.float64) / total
    return None


@dataclass(frozen=True)
class MixTest:
    """The class-adjusted test of one window (see the module docstring); ``classes_known``: the window held
    its class mix (without it, ``z`` and ``effect`` compare with the calibration's mix and ``class_z`` is 0)."""

    z: float
    effect: float
    class_z: float
    groups: Mapping[str, float] = field(default_factory=dict)
    classes_known: bool = True

    @property
    def changed(self) -> bool:
        """The class mix moved beyond noise."""
        return self.classes_known and self.class_z > CLASS_Z

    @property
    def mix_only(self) -> bool:
        """The class mix moved beyond noise and nothing else did: a change of class mix alone."""
        return self.changed and self.z <= MIX_Z

    @property
    def largest_group(self) -> str:
        """The group of quantities that moved most (what ``inputs shifted`` means for this window)."""
        return max(self.groups, key=lambda g: self.groups[g]) if self.groups else "inputs_unlike_reference"

    def to_dict(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "only": self.mix_only,
            "class_z": self.class_z,
            "residual_z": self.z,
        }


def _floats(a: np.ndarray) -> list[Any]:
    return [[float(v) for v in row] for row in a] if a.ndim == 2 else [float(v) for v in a]


@dataclass(frozen=True, eq=False)
class ClassReference:
    """Per predicted class, the clean calibration split's mean and variance of every quantity (``[K, Q]``,
    Q = :data:`N_REDUCED` where the split came without per-sample inputs)."""

    counts: np.ndarray  # [K] calibration samples per predicted class
    mean: np.ndarray  # [K, Q] shrunk toward the overall mean by PRIOR pseudo-samples
    var: np.ndarray  # [K, Q] floored at MIN_STD²
    overall_mean: np.ndarray  # [Q]
    overall_var: np.ndarray  # [Q]

    @property
    def n_classes(self) -> int:
        return len(self.counts)

    @property
    def width(self) -> int:
        return int(self.overall_mean.shape[0])

    @classmethod
    def fit(cls, quantities: np.ndarray, predicted: np.ndarray, k: int) -> ClassReference:
        """From the split's per-sample quantities ``[N, Q]`` (:func:`per_sample_quantities`) and predicted
        classes."""
        q = np.asarray(quantities, dtype=np.float64)
        lab = np.clip(np.asarray(predicted, dtype=np.int64).reshape(-1), 0, max(k - 1, 0))
        counts = np.bincount(lab, minlength=k)[:k].astype(np.float64)
        mu = q.mean(axis=0)
        var = np.maximum(q.var(axis=0), MIN_STD**2)
        s1 = np.zeros((k, q.shape[1]))
        s2 = np.zeros((k, q.shape[1]))
        np.add.at(s1, lab, q)
        np.add.at(s2, lab, q * q)
        m = (s1 + PRIOR * mu) / (counts[:, None] + PRIOR)
        v = (s2 + PRIOR * (var + mu * mu)) / (counts[:, None] + PRIOR) - m * m
        return cls(counts, m, np.maximum(v, MIN_STD**2), mu, var)

    @property
    def prior(self) -> np.ndarray:
        """The calibration split's mix of predicted classes (each class at least half a sample)."""
        return (self.counts + 0.5) / (self.counts.sum() + 0.5 * len(self.counts))

    def test(self, stats: WindowSums) -> MixTest | None:
        """The class-adjusted test of one window (None for an empty one)."""
        n = stats.n
        if n <= 0:
            return None
        x = window_means(stats)
        q = min(len(x), self.width)
        x = x[:q]
        mean, var, overall = self.mean[:, :q], self.var[:, :q], self.overall_var[:q]
        share = class_shares(stats, self.n_classes)
        known = share is not None
        mix = share if share is not None else self.prior
        expected = mix @ mean
        noise = mix @ var / n + (mix * mix) @ (var / (self.counts[:, None] + PRIOR))
        dev = x - expected
        z = dev / np.sqrt(noise)
        effect = dev / np.sqrt(overall)
        k = self.n_classes
        class_z = 0.0
        if known and k > 1:
            p = self.prior
            chi = float((((mix - p) ** 2) / (p * (1.0 / n + 1.0 / self.counts.sum()))).sum())
            class_z = (chi - (k - 1)) / math.sqrt(2 * (k - 1))
        groups = {
            g: float(np.sqrt(np.mean(z[[i for i in idx if i < q]] ** 2)))
            for g, idx in GROUPS.items()
            if any(i < q for i in idx)
        }
        rms = lambda a: float(np.sqrt(np.mean(a * a)))  # noqa: E731
        return MixTest(rms(z), rms(effect), class_z, groups, known)

    def to_dict(self) -> dict[str, Any]:
        """Classes the split predicted are stored with their rows; the others take the overall mean and
        variance (a model of a thousand classes predicts a few hundred of them on a small split)."""
        seen = np.flatnonzero(self.counts > 0)
        return {
            "n_classes": self.n_classes,
            "classes": [int(i) for i in seen],
            "counts": [float(self.counts[i]) for i in seen],
            "mean": _floats(self.mean[seen]),
            "var": _floats(self.var[seen]),
            "overall_mean": _floats(self.overall_mean),
            "overall_var": _floats(self.overall_var),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClassReference:
        k = int(d["n_classes"])
        mu = np.asarray(d["overall_mean"], dtype=np.float64)
        ov = np.asarray(d["overall_var"], dtype=np.float64)
        if mu.ndim != 1 or ov.shape != mu.shape or not 0 < len(mu) <= len(QUANTITIES):
            raise ValueError("class reference: overall mean and variance of the quantities expected")
        seen = np.asarray(d["classes"], dtype=np.int64)
        counts = np.zeros(k)
        mean = np.tile(mu, (k, 1))
        var = np.tile(np.maximum(ov, MIN_STD**2), (k, 1))
        if len(seen):
            if seen.min() < 0 or seen.max() >= k:
                raise ValueError("class reference: class index out of range")
            counts[seen] = np.asarray(d["counts"], dtype=np.float64)
            mean[seen] = np.asarray(d["mean"], dtype=np.float64).reshape(len(seen), len(mu))
            var[seen] = np.asarray(d["var"], dtype=np.float64).reshape(len(seen), len(mu))
        return cls(counts, mean, var, mu, ov)
