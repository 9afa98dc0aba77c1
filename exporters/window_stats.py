"""``icos_window_stat_total{model,version,bundle,stat}``: the running totals of the judged predictions'
additive window statistics, which the fleet evaluator adds over replicas."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector


def finite_only(fam: Metric) -> Metric:
    """``fam`` without its NaN and infinite samples (a gauge with nothing to say is absent)."""
    fam.samples = [s for s in fam.samples if math.isfinite(s.value)]
    return fam


class Additive(Protocol):
    """A statistic that adds up in place (the agent's window statistic)."""

    def add_in_place(self, other: Any) -> None: ...

    def copy(self) -> Any: ...


#: A statistic's flat ``(stat, value)`` pairs, as exported.
Flatten = Callable[[Any], Iterable[tuple[str, float]]]


class _Totals:
    """The totals of one label set: flat ``(stat, value)`` pairs added as they came, and statistics
    added up as they came, one sum per way of flattening them."""

    __slots__ = ("items", "sums")

    def __init__(self) -> None:
        self.items: dict[str, float] = {}
        self.sums: dict[Flatten, Additive] = {}

    def flat(self) -> dict[str, float]:
        out = dict(self.items)
        get = out.get
        for flatten, total in self.sums.items():
            for stat, value in flatten(total):
                out[stat] = get(stat, 0) + value
        return out


class WindowStatsCollector(Collector):
    """Running totals kept in plain dicts and exported at scrape time (a ``Counter`` child per statistic
    costs a lock per increment: 3-4× the time on a judged batch, and a ``_created`` series each).

    A judged batch adds its statistic itself (:meth:`add_stats`): one in-place sum per batch, flattened
    into its few hundred series only when scraped. Each series is the same sum, in the same order, as if
    every batch's flat pairs had been added (:meth:`add`): a vector entry or count that a batch leaves at
    zero adds nothing either way, and a series appears with the first batch that has it."""

    #: Label sets (model, version, bundle) kept; a reload to a new bundle adds one, the oldest goes.
    MAX_KEYS = 4

    def __init__(self) -> None:
        self._totals: dict[tuple[str, str, str], _Totals] = {}
        self._lock = threading.Lock()

    def _of(self, key: tuple[str, str, str]) -> _Totals:
        """The totals of ``key`` (called holding the lock)."""
        totals = self._totals.get(key)
        if totals is None:
            while len(self._totals) >= self.MAX_KEYS:
                del self._totals[next(iter(self._totals))]
            totals = self._totals[key] = _Totals()
        return totals

    def add(self, key: tuple[str, str, str], items: Iterable[tuple[str, float]]) -> None:
        """Add flat ``(stat, value)`` pairs."""
        with self._lock:
            totals = self._of(key).items
            get = totals.get
            for stat, value in items:
                totals[stat] = get(stat, 0) + value

    def add_stats(self, key: tuple[str, str, str], stats: Additive, flatten: Flatten) -> None:
        """Add a statistic, exported as ``flatten`` of the sum (pass the same ``flatten`` object for the
        same way of flattening: each has its own sum)."""
        with self._lock:
            sums = self._of(key).sums
            total = sums.get(flatten)
            if total is None:
                sums[flatten] = stats.copy()
            else:
                total.add_in_place(stats)

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(
            "icos_window_stat",
            "Additive window statistics of the judged predictions (counts and sums the estimators read), by stat.",
            labels=["model", "version", "bundle", "stat"],
        )
        with self._lock:
            rows = [(key, totals.flat()) for key, totals in self._totals.items()]
        for (model, version, bundle), flat in rows:
            for stat, value in flat.items():
                fam.add_metric([model, version, bundle, stat], value)
        yield finite_only(fam)
