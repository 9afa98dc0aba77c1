"""The time windows of a champion and its challenger on the same requests: per window, the champion's
statistics on the paired predictions, the challenger's on the same inputs and the pair's sums
(:class:`~agent.estimation.pairs.paired.PairSums`), in the :class:`~agent.judging.windows.TimeBuckets` of the
champion's own windows (about 60 buckets of ``W/60`` s, at least 1 s).

They start empty when the agent starts (they are not saved in the state directory) and when the champion's
model or bundle changes.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.estimation.pairs.paired import PairSums
from agent.estimation.statistics.window import WindowStats
from agent.judging.windows import TimeBuckets


@dataclass
class PairedStats:
    """The paired predictions of a window: both models' statistics on them and the pair's sums."""

    champion: WindowStats = field(default_factory=WindowStats)
    challenger: WindowStats = field(default_factory=WindowStats)
    pair: PairSums = field(default_factory=PairSums)

    def copy(self) -> PairedStats:
        return PairedStats(self.champion.copy(), self.challenger.copy(), self.pair.copy())

    def add_in_place(self, other: PairedStats) -> None:
        self.champion.add_in_place(other.champion)
        self.challenger.add_in_place(other.challenger)
        self.pair.add_in_place(other.pair)


def _total(window: TimeBuckets[PairedStats], now: float) -> PairedStats:
    out = PairedStats()
    for s in window.current(now):
        out.add_in_place(s)
    return out


class PairedWindows:
    """Every time window of the paired predictions (thread-safe)."""

    def __init__(self, time_windows: Mapping[str, float]) -> None:
        self._lock = threading.Lock()
        self.seconds = dict(time_windows)
        self._windows: dict[str, TimeBuckets[PairedStats]] = {
            name: TimeBuckets(sec) for name, sec in time_windows.items()
        }
        self.total = 0

    def record(self, stats: PairedStats, now: float) -> None:
        with self._lock:
            for w in self._windows.values():
                w.add(stats, now)
            self.total += stats.pair.n

    def stats(self, now: float) -> dict[str, PairedStats]:
        with self._lock:
            return {name: _total(w, now) for name, w in self._windows.items()}

    def reset(self) -> None:
        with self._lock:
            for w in self._windows.values():
                w.buckets.clear()
            self.total = 0
