"""Every segment's realized accuracy from the labels drawn, with its interval, beside the segment table's
estimates (:mod:`agent.estimation.segments.table`).

The labeled predictions of a window are a sample of it: uniform (``check --labels N``, ``labels.sampling:
uniform``) or drawn with probabilities of their own (active or stratified draws). A segment's realized
accuracy is then the inverse-probability-weighted share of right predictions among its labeled ones (the
Hájek ratio ``Σ w Y / Σ w``, ``w = 1/π``; the plain share under uniform draws), and its 95% interval the
Wilson interval at the Kish effective sample size ``(Σ w)² / Σ w²`` (the number of labels under uniform
draws). Summed with one ``np.bincount`` per figure over the ``[D, m]`` segment numbers of the labels.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agent.estimation.intervals import Estimate, wilson
from agent.estimation.segments.table import SegmentTable


@dataclasses.dataclass(frozen=True)
class SegmentLabels:
    """Per segment: its labeled predictions, and the sums ``Σ w``, ``Σ w Y`` and ``Σ w²`` of their weights."""

    n: np.ndarray
    w: np.ndarray
    wy: np.ndarray
    w2: np.ndarray

    @classmethod
    def of(cls, ids: np.ndarray, size: int, correct: np.ndarray, weights: np.ndarray | None = None) -> SegmentLabels:
        """From the labels' segment numbers ``ids`` ``[D, m]`` (a number ≥ ``size``: counted nowhere), whether
        each was right and their weights (None: all 1; ``[m]``: one per label; ``[D, m]``: one per label and
        dimension, e.g. after a cap within each segment)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1, len(correct)) if len(correct) else np.zeros((0, 0), int)
        d = ids.shape[0]
        flat = np.minimum(ids.ravel(), size)
        y = np.asarray(correct, dtype=np.float64).reshape(-1)
        w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
        w = w.reshape(-1) if w.size == flat.size else np.tile(w.reshape(-1), d)
        yy = np.tile(y, d)

        def sums(v: np.ndarray | None) -> np.ndarray:
            return np.bincount(flat, weights=v, minlength=size + 1)[:size].astype(np.float64)

        return cls(sums(None), sums(w), sums(w * yy), sums(w * w))

    def estimate(self, s: int) -> tuple[int, Estimate | None]:
        """Segment ``s``'s labels and realized accuracy with its interval (None without a label)."""
        n = int(round(self.n[s])) if s < len(self.n) else 0
        if n <= 0 or self.w[s] <= 0:
            return 0, None
        value = float(self.wy[s] / self.w[s])
        n_eff = float(self.w[s] ** 2 / self.w2[s]) if self.w2[s] > 0 else float(n)
        lo, hi = wilson(value * n_eff, n_eff)
        return n, Estimate(value, min(lo, value), max(hi, value), n)


def with_realized(table: SegmentTable, labels: SegmentLabels) -> SegmentTable:
    """``table`` with every segment's realized accuracy from ``labels``."""
    rows = []
    for row in table.rows:
        n, est = labels.estimate(row.index)
        rows.append(dataclasses.replace(row, realized=est, realized_n=n))
    return dataclasses.replace(table, rows=tuple(rows))
