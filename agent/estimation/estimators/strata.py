"""Stratified label draws: where the labels received so far say the errors are, more labels go.

A prediction's *strata* are its bin of predicted correctness ``f`` (:data:`BIN_EDGES`) and its segment in
every dimension fixed at ``fit`` (:mod:`agent.estimation.segments.segmentation`). The draw probability that
minimises the variance of the inverse-probability-weighted estimate (:mod:`agent.estimation.estimators.active`)
is proportional to the standard deviation of the residual ``Y − f`` (Neyman allocation; for a calibrated ``f`` it is
``sqrt(f (1 − f))``, active sampling's rule). Under a shift the bundle's ``f`` no longer knows where the errors
are; the labels as they arrive do. :class:`StrataLearner` keeps, per stratum, the labeled predictions and
their *excess* squared residual ``(Y − f)² − f (1 − f)`` (zero in expectation where ``f`` is calibrated), as
exponentially decayed sums (time constant ``tau``). A stratum's excess is shrunk toward the bundle's prior (no
excess: ``f`` calibrated) by :data:`PRIOR_LABELS` pseudo-labels, so that a stratum with a handful of labels
moves its draws little.

The allocation follows one row of strata: the bins, or one dimension of segments, whichever's strata differ
most in their excess (picked again whenever labels are learnt). A prediction's expected squared residual is
``f (1 − f)`` plus the shrunk excess of its stratum in that row (at least :data:`MIN_SPREAD` squared), and its
*spread* the square root; :func:`~agent.estimation.estimators.active.spread_probabilities` allocates the budget by it,
mixed with the uniform floor, as active draws allocate it by the calibrated uncertainty.

Design-unbiasedness: every prediction's probability is fixed before it is drawn, from labels of earlier
predictions only, and kept with it; the estimate weights each label by its inverse (a Horvitz–Thompson
difference estimate), so it is unbiased whatever the allocation learnt (the draws, taken in the order they
are made, are a martingale), and its variance estimate ``Σ (1 − π)/π² (Y − g)²`` is the one of Poisson
sampling with these probabilities: within a stratum the probabilities are equal, so it is the stratified
design's. Nothing changes in the estimate's sums, so they add up across replicas as before.

The uniform floor bounds the loss: with every ``π`` at least ``floor`` times the mean rate, each label's
share of the variance is at most about ``1 / floor`` times what it is under uniform draws of the same
expected size, whatever the allocation learnt.

Per batch the work is a few numpy operations: one ``searchsorted`` for the bins and one ``np.take`` of the
shrunk excess of the row followed.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

#: Inner edges of the bins of predicted correctness ``f`` (five bins).
BIN_EDGES = np.array([0.5, 0.7, 0.85, 0.95])
N_BINS = len(BIN_EDGES) + 1
#: Pseudo-labels of the bundle's prior (no excess) every stratum's excess is shrunk toward.
PRIOR_LABELS = 10.0
#: Smallest spread a prediction is given (its squared residual's root): a prediction ``f`` says is
#: certain still carries the floor's share, and this keeps the allocation finite.
MIN_SPREAD = 0.02


def strata_of(predicted_correct: np.ndarray, segments: np.ndarray | None) -> np.ndarray:
    """Every prediction's strata, int64 ``[1 + D, n]``: its bin of ``f`` (``0 … N_BINS − 1``), then its segment
    in each of the ``D`` dimensions of ``segments`` (``[D, n]`` global numbers, offset by :data:`N_BINS`; a
    segment number beyond the segmentation stays beyond every table and is read as no excess)."""
    f = np.asarray(predicted_correct, dtype=np.float64).reshape(-1)
    bins = np.searchsorted(BIN_EDGES, f, side="right")[None, :]
    if segments is None or not len(segments):
        return bins
    return np.concatenate([bins, np.asarray(segments, dtype=np.int64).reshape(-1, len(f)) + N_BINS])


class StrataLearner:
    """Per stratum, the decayed count of labeled predictions and of their excess squared residual (see the
    module docstring); ``n_segments`` segments besides the bins of ``f``. Not thread-safe by itself."""

    def __init__(
        self,
        n_segments: int,
        tau: float,
        prior_labels: float = PRIOR_LABELS,
        dimensions: tuple[int, ...] | None = None,
    ) -> None:
        self.size = N_BINS + int(n_segments)
        sizes = (int(n_segments),) if dimensions is None else tuple(int(k) for k in dimensions)
        if sum(sizes) != int(n_segments):
            raise ValueError(f"dimensions of {sum(sizes)} segments for {n_segments}")
        #: each row of :func:`strata_of`'s strata as a span of stratum numbers: the bins, then every dimension
        bounds = np.cumsum([0, N_BINS, *sizes])
        self._spans = [(int(a), int(b)) for a, b in itertools.pairwise(bounds) if b > a]
        self.row = 0  # the row of the strata the allocation follows
        self.tau = max(float(tau), 1e-9)
        self.prior = float(prior_labels)
        # one slot beyond the strata: what a dimension that could not read its input points at
        self._n = np.zeros(self.size + 1)
        self._excess = np.zeros(self.size + 1)
        self._shrunk = np.zeros(self.size + 1)

        self._last: float | None = None

    def _decay(self, now: float) -> None:
        if self._last is not None:
            k = math.exp(-max(now - self._last, 0.0) / self.tau)
            self._n *= k
            self._excess *= k
        self._last = now if self._last is None else max(now, self._last)

    def learn(self, strata: np.ndarray, predicted_correct: np.ndarray, correct: np.ndarray, now: float) -> None:
        """Add labeled predictions (their :func:`strata_of`, ``f`` and whether each was right)."""
        f = np.asarray(predicted_correct, dtype=np.float64).reshape(-1)
        if not len(f):
            return
        y = np.asarray(correct, dtype=np.float64).reshape(-1)
        keys = np.minimum(np.asarray(strata, dtype=np.int64), self.size)
        excess = (y - f) ** 2 - f * (1.0 - f)
        self._decay(now)
        self._n += np.bincount(keys.ravel(), minlength=self.size + 1)[: self.size + 1]
        self._excess += np.bincount(keys.ravel(), weights=np.tile(excess, len(keys)), minlength=self.size + 1)[
            : self.size + 1
        ]
        self._shrunk = self._excess / (self._n + self.prior)
        self._shrunk[self.size] = 0.0
        self.row = self._separating_row()

    def _separating_row(self) -> int:
        """The row of strata (the bins, or one dimension of segments) whose shrunk excesses differ most
        between its strata, weighted by their labels: the cut along which the labels so far say the errors
        lie. A dimension's segments each see a share of a drop that lives in another dimension's segment,
        so taking every row at once would spread the drop's excess over the whole traffic."""
        best, best_row = 0.0, 0
        for row, (a, b) in enumerate(self._spans):
            n, x = self._n[a:b], self._shrunk[a:b]
            total = float(n.sum())
            if total <= 0:
                continue
            mean = float((n * x).sum()) / total
            spread = float((n * (x - mean) ** 2).sum()) / total
            if spread > best:
                best, best_row = spread, row
        return best_row

    def labels(self) -> np.ndarray:
        """The decayed count of labeled predictions per stratum (bins first, then segments)."""
        return self._n[: self.size].copy()

    def shrunk_excess(self) -> np.ndarray:
        """Per stratum, the excess squared residual shrunk toward the prior (bins first, then segments)."""
        return self._shrunk[: self.size].copy()

    def spread(self, strata: np.ndarray, predicted_correct: np.ndarray) -> np.ndarray:
        """Every prediction's expected residual standard deviation: ``sqrt(f (1 − f) + max excess)``."""
        f = np.clip(np.asarray(predicted_correct, dtype=np.float64).reshape(-1), 0.0, 1.0)
        keys = np.asarray(strata, dtype=np.int64)
        row = self.row if self.row < len(keys) else 0
        extra = np.take(self._shrunk, np.minimum(keys[row], self.size))
        return np.sqrt(np.maximum(f * (1.0 - f) + extra, MIN_SPREAD * MIN_SPREAD))

    def wanted(self, strata: np.ndarray, predicted_correct: np.ndarray) -> np.ndarray:
        """How much a label of each prediction is worth to the allocation: its :meth:`spread` over the
        square root of one more than the labels its stratum (in the row followed) already has (a stratum
        that still wants labels ranks first)."""
        keys = np.asarray(strata, dtype=np.int64)
        row = self.row if self.row < len(keys) else 0
        have = np.take(self._n, np.minimum(keys[row], self.size))
        return np.asarray(self.spread(strata, predicted_correct) / np.sqrt(1.0 + have), dtype=np.float64)
