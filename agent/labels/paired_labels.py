"""The labels of the paired difference: disagreements of the champion and the challenger drawn into the
labeling sample, and the labeled sums of each time window (:mod:`agent.estimation.pairs.paired`).

Agreements need no label (the two versions are both right or both wrong there), so the challenger asks the
labeling sample to draw every disagreement with at least the probability that meets
``challenger.labels_per_window`` per ``labels.budget_window`` (:meth:`DisagreementDraws.preference`: the
traffic's disagreement rate smoothed as :class:`~agent.labels.active_draws.ActiveBudget` smooths the traffic's).
The sample draws each prediction once, with the larger of that and its own probability, and stores it; the
drawn disagreements are remembered here (their time, both predicted classes, ``g = q_B − q_A`` and the
probability they were drawn with), bounded in count and age. A label that the store accepts for one of them
gives its outcome ``d = 1{challenger right} − 1{champion right}``; each time window adds the labeled sums of
its drawn disagreements to its label-free ones (:meth:`DisagreementDraws.labeled_sums`).

They live in memory: an agent that restarts forgets which disagreements it drew (their labels still count for
``with_labels`` and the realized windows), and a fleet's replicas each keep their own.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from agent.estimation.pairs.paired import PairSums
from agent.labels.active_draws import ActiveBudget
from agent.labels.rows import LabelOutcome


@dataclass
class _Drawn:
    """One drawn disagreement: when it was predicted, both predicted classes, its ``g``, its draw
    probability and, once labeled, its outcome."""

    t: float
    champion: int
    challenger: int
    g: float
    pi: float
    d: float | None = None


class DisagreementDraws:
    """The drawn disagreements and their labels (thread-safe); see the module docstring."""

    def __init__(self, per_window: int, window_seconds: float, max_kept: int, max_age_seconds: float) -> None:
        self.budget = ActiveBudget(per_window, window_seconds, 1.0) if per_window > 0 else None
        self.max_kept = int(max_kept)
        self.max_age = float(max_age_seconds)
        self._drawn: OrderedDict[str, _Drawn] = OrderedDict()
        self._lock = threading.Lock()

    def preference(self, n: int, rows: np.ndarray, now: float | None = None) -> np.ndarray | None:
        """Per prediction of a batch of ``n``, the probability it is drawn with at least: the budget's on the
        disagreements ``rows``, 0 elsewhere (None: no preference)."""
        if self.budget is None:
            return None
        out = np.zeros(n)
        if not len(rows):  # the budget counts disagreements only
            return out
        t = time.monotonic() if now is None else now
        with self._lock:
            pi = self.budget.probabilities(np.full(len(rows), 0.5), t)
        out[rows] = pi
        return out

    def remember(
        self,
        request_id: str,
        t: float,
        drawn: np.ndarray,
        drawn_pi: np.ndarray | None,
        rows: np.ndarray,
        champion: np.ndarray,
        challenger: np.ndarray,
        g: np.ndarray,
    ) -> int:
        """Keep the drawn predictions (``drawn``, with their probabilities ``drawn_pi``) that are disagreements
        (``rows``, with both predicted classes and ``g`` of each); returns how many were kept."""
        if drawn_pi is None or not len(drawn) or not len(rows):
            return 0
        where = {int(r): i for i, r in enumerate(rows)}
        kept = 0
        with self._lock:
            for idx, pi in zip(drawn.tolist(), drawn_pi.tolist(), strict=True):
                i = where.get(int(idx))
                if i is None or not 0.0 < pi <= 1.0:
                    continue
                self._drawn[f"{request_id}:{idx}"] = _Drawn(t, int(champion[i]), int(challenger[i]), float(g[i]), pi)
                kept += 1
            while len(self._drawn) > self.max_kept:
                self._drawn.popitem(last=False)
        return kept

    def on_labels(self, labels: Iterable[tuple[str, int]], outcome: LabelOutcome) -> int:
        """The labels the store accepted (or that corrected earlier ones) give their drawn disagreements an
        outcome; returns how many did."""
        refused = set(outcome.unknown) | set(outcome.duplicate)
        n = 0
        with self._lock:
            for pid, label in labels:
                entry = self._drawn.get(pid)
                if entry is None or pid in refused:
                    continue
                entry.d = float(int(label == entry.challenger) - int(label == entry.champion))
                n += 1
        return n

    def labeled_sums(self, windows: Mapping[str, float], now: float) -> dict[str, PairSums]:
        """Per time window (name → seconds), the labeled sums of its labeled drawn disagreements."""
        with self._lock:
            self._expire(now)
            rows = [(e.t, e.g, e.d, e.pi) for e in self._drawn.values() if e.d is not None]
        out: dict[str, PairSums] = {}
        if not rows:
            return out
        t, g, d, pi = (np.asarray(c, dtype=np.float64) for c in zip(*rows, strict=True))
        for name, seconds in windows.items():
            inside = t > now - seconds
            if inside.any():
                out[name] = PairSums.of_labeled(g[inside], d[inside], pi[inside])
        return out

    def _expire(self, now: float) -> None:
        """Drop the drawn disagreements older than the longest window (called holding the lock)."""
        while self._drawn:
            first = next(iter(self._drawn.values()))
            if first.t >= now - self.max_age:
                break
            self._drawn.popitem(last=False)

    def reset(self) -> None:
        with self._lock:
            self._drawn.clear()

    @property
    def kept(self) -> int:
        with self._lock:
            return len(self._drawn)
