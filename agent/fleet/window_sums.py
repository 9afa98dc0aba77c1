"""The window statistics of all replicas of a model, from their ``icos_window_stat_total`` counters.

Why not ``increase()``: it extrapolates to the window's edges and returns fractions of predictions,
so a fleet estimate built on it would not equal the estimate of one agent that saw the same
predictions. Instead the evaluator reads raw counter values and differences them itself. Every value
is read within one span ``(t−W−L, t]`` (``W`` the longest window, ``L`` the lookback,
``fleet.lookback_seconds``), so that every window reads the same samples:

* for every series, ``increment = last value in the span`` minus ``last value in the span up to the
  window's start t−w`` (0 when there is none: a replica that joined), evaluated by the store as exact
  sums over all replicas (``last_over_time`` reads raw samples, no extrapolation). Why it is exact: a
  series with samples on both sides of ``t−w`` adds its last value minus its last before ``t−w``; one
  born after ``t−w`` adds its last value; one whose last sample came before ``t−w`` (a replica that
  left) has that sample as both ends and adds 0, its predictions having counted while they were in the
  window; one that left before the span is in neither sum. A replica missed by the scrapes across
  ``t−w`` (but not restarted) adds its counter's growth over the gap, never its whole life;
* the end sum and every window's start sum come from one range query (``/api/v1/query_range``) of
  ``last_over_time(S[W+L])`` on a grid through ``t`` and every ``t−w`` (:func:`range_plan`): one search
  of every series for all windows (one per window when their grid would be too fine), where instant
  queries would search them once per window and once for the end. Its lookback at ``t−w`` reaches
  ``w`` before the span, so it also reads there the series with no sample from the span's start to
  ``t−w``: those of replicas gone just before the span, and those a restarted process no longer
  exports. Such a series is in no start sum of the span, so the value read is added back. Both kinds
  are found from ``n`` alone, one series per replica, since a process exports every series it has at
  every scrape, ``n`` first: a replica whose ``n`` has a sample in that reach and none from the span's
  start to ``t−w``, or whose ``n`` fell in that reach or at its first sample in the span. Only their
  series are read, replica by replica;
* a restarted replica (its ``n`` fell: ``resets()`` over the ``n`` series only, one per replica,
  not every series) adds, per series and per restart within the window, the value it held just
  before the restart: the sample-by-sample sum of its increments, a reset counting from zero as one
  agent would have counted, equals its last value minus its baseline plus those values. Its restart times are read
  from its ``n`` samples (one series), then its series' values just before each restart with one
  instant query (one value per series, not every sample), for the series with a sample between that
  restart and the next: a series the new process exports only later counts from zero too, one it no
  longer exports keeps its last value.

A restart at which ``n`` did not fall (the new process judged, before its first scrape, at least as
many predictions as the old one in its whole life) is not seen: the window then loses at most those
few predictions, or is refused if another series fell (its increment would be negative). The figures
are exact up to the scrape interval: predictions a replica judged after its last scrape before a crash
are lost (the process is gone), and the window's edges fall on scrapes, not on the predictions' own
times.

Nothing of an answer is believed unchecked (:class:`_Reader`): the ``model`` label must be this
evaluator's, versions and bundles must be label values a replica can have (at most
``fleet.max_versions`` versions), label names must be PromQL identifiers (they are written back into
queries), and the statistics of this evaluator's bundle must be names of its :class:`StatSchema`
with counter values; other bundles' series are read for their ``n`` only (to tell a mixed version).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.fleet.prometheus_api import LabelSet, PrometheusAPI, QueryError, Sample, Series, concurrently, printable
from agent.fleet.stat_schema import MAX_EXACT, RefusedAnswer, StatSchema

#: The replicas' counter of additive window statistics (``exporters.prometheus.AgentMetrics``).
STAT_METRIC = "icos_window_stat_total"
#: What a fleet sum is grouped by; every other label (instance, pod, job …) tells replicas apart.
GROUP_LABELS = ("model", "version", "bundle")
#: (model, version, bundle)
GroupKey = tuple[str, str, str]
#: A version or bundle label a replica can export (``model.version``'s characters, bounded).
LABEL_VALUE = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
#: A label name as PromQL writes it (names are written back into the queries of restarted replicas).
LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: Unknown statistic names kept for the log (the rest are only counted).
UNKNOWN_NAMES_KEPT = 5
#: Points one range query of the sums may have (:func:`range_plan`): 61 holds windows on a minute's grid
#: up to an hour; an answer holds a value per statistic and point.
MAX_POINTS = 61


@dataclass(frozen=True)
class FleetScope:
    """What one evaluator reads: its model's series (narrowed by ``fleet.selector``), and what it
    believes of them (the statistics of its bundle, at most ``max_versions`` versions)."""

    model: str
    bundle: str
    schema: StatSchema
    extra: str = ""
    max_versions: int = 16
    #: the counter family read (a challenger's pair sums are ``icos_challenger_stat_total``)
    metric: str = STAT_METRIC


@dataclass
class WindowSums:
    """One window of the fleet: per (model, version, bundle), the increment of every stat (only ``n``
    for other bundles than the evaluator's), and the replicas that exported in the window."""

    stats: dict[GroupKey, dict[str, float]] = field(default_factory=dict)
    replicas: dict[GroupKey, int] = field(default_factory=dict)
    #: per group, the largest counter total read (the float rounding its sums may carry)
    scale: dict[GroupKey, float] = field(default_factory=dict)
    restarted_replicas: int = 0
    queries: int = 0
    #: (version, stat) of the series with a statistic the bundle does not define (ignored)
    unknown: set[tuple[str, str]] = field(default_factory=set)


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(model: str, extra: str = "", metric: str = STAT_METRIC, **labels: str) -> str:
    """``icos_window_stat_total{model="…", <extra>, <labels>}`` (or another ``metric``)."""
    parts = [f"model={quote(model)}", *(f"{k}={quote(v)}" for k, v in labels.items())]
    if extra:
        parts.append(extra)
    return f"{metric}{{{','.join(parts)}}}"


def _ms(seconds: float) -> int:
    """Seconds in whole milliseconds (the store's resolution: every range and time is written in them)."""
    return max(1, round(seconds * 1000))


def restart_times(series: Series) -> list[float]:
    """The sample times at which a counter fell below its predecessor (its process restarted)."""
    v, t = series.values, series.times
    return [t[i] for i in range(1, len(v)) if v[i] < v[i - 1]]


class _Reader:
    """Checks and adds up the series of one window's answers (see the module docstring)."""

    def __init__(self, scope: FleetScope, out: WindowSums) -> None:
        self.scope = scope
        self.out = out
        self.sums: dict[GroupKey, dict[str, float]] = {}
        self.versions: set[str] = set()

    def group(self, labels: Mapping[str, str]) -> GroupKey:
        model, version, bundle = (labels.get(k, "") for k in GROUP_LABELS)
        if model != self.scope.model:
            raise RefusedAnswer("bad_label", f"a series of model {printable(model, 40)!r}, not {self.scope.model!r}")
        for name, value in (("version", version), ("bundle", bundle)):
            if not LABEL_VALUE.fullmatch(value):
                raise RefusedAnswer(
                    "bad_label", f"{name} label {printable(value, 40)!r}: not 1 to 128 of A-Z a-z 0-9 . _ -"
                )
        if version not in self.versions:
            self.versions.add(version)
            if len(self.versions) > self.scope.max_versions:
                raise RefusedAnswer(
                    "too_many_versions", f"more than fleet.max_versions ({self.scope.max_versions}) model versions"
                )
        return model, version, bundle

    def accept(self, labels: LabelSet) -> tuple[GroupKey, str] | None:
        """The group and stat of a statistic series to add up, or None for one to ignore."""
        d = dict(labels)
        group, stat = self.group(d), d.get("stat", "")
        if group[2] == self.scope.bundle:
            if not self.scope.schema.known(stat):
                self.out.unknown.add((group[1], printable(stat, 80)))
                return None
        elif stat != "n":  # another bundle's: only whether it judged anything (a mixed version)
            return None
        return group, stat

    def check(self, group: GroupKey, stat: str, value: float) -> None:
        """A counter value of the statistic (of another bundle's ``n``: a count)."""
        if group[2] == self.scope.bundle:
            self.scope.schema.check_value(stat, value)
        else:
            _count(stat, value)
        self.out.scale[group] = max(self.out.scale.get(group, 0.0), value)

    def add(self, group: GroupKey, stat: str, value: float, sign: float) -> None:
        self.check(group, stat, value)
        stats = self.sums.setdefault(group, {})
        stats[stat] = stats.get(stat, 0.0) + sign * value


def _count(what: str, value: float) -> None:
    if not (0 <= value <= MAX_EXACT and value == int(value)):
        raise RefusedAnswer("bad_value", f"{printable(what, 40)} is {value!r}, not a count")


def replica_labels(labels: LabelSet) -> LabelSet:
    """A restarted replica's labels (``stat`` dropped), their names checked: they are written back
    into a query."""
    for k, _ in labels:
        if not LABEL_NAME.fullmatch(k):
            raise RefusedAnswer("bad_label", f"label name {printable(k, 40)!r} is not a PromQL identifier")
    return tuple((k, v) for k, v in labels if k != "stat")


def range_plan(at_ms: int, widths_ms: Collection[int]) -> list[tuple[int, int, int]]:
    """``(start, end, step)`` in milliseconds of the range queries that read the end sum at ``at_ms`` and
    the sum at every window's start: one on the grid of the windows' greatest common divisor when it has
    at most :data:`MAX_POINTS` points (one search of every series for every window), else one per window
    (its start and the end)."""
    longest, step = max(widths_ms), math.gcd(*widths_ms)
    if longest // step + 1 <= MAX_POINTS:
        return [(at_ms - longest, at_ms, step)]
    return [(at_ms - w, at_ms, w) for w in sorted(set(widths_ms), reverse=True)]


async def window_sums(
    api: PrometheusAPI, scope: FleetScope, at: float, windows: Mapping[str, float], lookback_s: float
) -> dict[str, WindowSums]:
    """The fleet's statistic of every window ``name → seconds`` over ``(at − seconds, at]`` (see the
    module docstring); raises :class:`~agent.fleet.prometheus_api.RefreshError`.

    Every aggregating query runs at once (``api.max_concurrent`` in flight): the range query of the sums
    (one search of every series for all windows, see :func:`range_plan`), and over the ``n`` series only
    (one per replica) each window's replica count and replicas gone before the span, and the restarted
    replicas; each of those replicas is then read alone while the store still searches every series.
    What they add is summed in one order whatever order they answer in."""
    if not windows:
        return {}
    at = round(at, 3)  # the time the store is asked for (milliseconds): the client's edges are its edges
    at_ms = round(at * 1000)
    sel = selector(scope.model, scope.extra, scope.metric)
    by = ", ".join((*GROUP_LABELS, "stat"))
    n_sel = selector(scope.model, scope.extra, scope.metric, stat="n")
    widths = {name: _ms(s) for name, s in windows.items()}
    span = _ms(max(windows.values()) + lookback_s)  # every window's start is at least the lookback inside it
    plan = range_plan(at_ms, widths.values())
    total = f"sum by ({by}) (last_over_time({sel}[{span}ms]))"
    wanted = {at_ms, *(at_ms - w for w in widths.values())}
    outs = {name: WindowSums() for name in windows}
    readers = {name: _Reader(scope, outs[name]) for name in windows}
    fixes = _Replicas(api, readers, widths, at, span, (sel, n_sel))
    both: list[Any] = await concurrently(  # the replicas are read while the store searches every series
        concurrently(*(api.range_points(total, grid, wanted) for grid in plan)),
        _replicas(api, fixes, outs, at, span, n_sel),
    )
    ranges: list[dict[int, list[Sample]]] = both[0]
    todo: list[LabelSet] = both[1]
    sums_at: dict[int, list[Sample]] = {}
    for points in ranges:
        for ms, samples in points.items():
            sums_at.setdefault(ms, samples)
    for name, reader in readers.items():
        for sign, samples in ((1.0, sums_at[at_ms]), (-1.0, sums_at[at_ms - widths[name]])):
            for s in samples:
                key = reader.accept(s.labels)
                if key is not None:
                    reader.add(*key, s.value, sign)
    for name in windows:
        reader = readers[name]
        for replica in todo:
            for group, stat, value in fixes.shares[name].get(replica, ()):
                stats = reader.sums.setdefault(group, {})
                stats[stat] = stats.get(stat, 0.0) + value
        outs[name].restarted_replicas = len(fixes.restarted[name])
        outs[name].stats = reader.sums
    # the range queries and the restarts' are counted once, under the longest window
    outs[max(windows, key=lambda name: windows[name])].queries += len(plan) + 1 + fixes.queries
    return outs


async def _replicas(
    api: PrometheusAPI, fixes: _Replicas, outs: Mapping[str, WindowSums], at: float, span: int, n_sel: str
) -> list[LabelSet]:
    """Over the ``n`` series only (one per replica): each window's replica count (into ``outs``) and the
    replicas gone just before the span, and the restarted replicas; then each of those replicas read
    alone by ``fixes``. Returns them, sorted (the order their shares are added in)."""
    widths = fixes.widths_ms
    asked = []
    for w in widths.values():
        asked += [
            api.vector(f"count by ({', '.join(GROUP_LABELS)}) (last_over_time({n_sel}[{w}ms]))", at),
            api.vector(
                f"count without (stat) (last_over_time({n_sel}[{w}ms] offset {span}ms)"
                f" unless last_over_time({n_sel}[{span - w}ms] offset {w}ms))",
                at,
            ),
        ]
    asked.append(api.vector(f"count without (stat) (resets({n_sel}[{span + max(widths.values())}ms]) > 0)", at))
    answers = await concurrently(*asked)
    left: dict[LabelSet, set[str]] = {}
    for i, name in enumerate(widths):
        counted, gone = answers[2 * i : 2 * i + 2]
        for s in counted:
            group = fixes.readers[name].group(dict(s.labels))
            _count("a replica count", s.value)
            outs[name].replicas[group] = int(s.value)
        for s in gone:
            left.setdefault(replica_labels(s.labels), set()).add(name)
        outs[name].queries = 2
    restarted = {replica_labels(s.labels) for s in answers[-1]}
    todo = sorted(restarted | set(left))
    shared = iter(todo)  # one iterator for every reader: each replica is read once
    await concurrently(*(fixes.read(shared, restarted, left) for _ in range(min(api.max_concurrent, len(todo)))))
    return todo


class _Replicas:
    """What the restarted replicas and the replicas gone before a window's start add to each window, read
    replica by replica (see the module docstring): per series and restart within the window, the value the
    series held just before the restart; per series the range query read at a window's start but not since
    the span's start, that value back (it was no baseline of that window)."""

    def __init__(
        self,
        api: PrometheusAPI,
        readers: Mapping[str, _Reader],
        widths_ms: Mapping[str, int],
        at: float,
        span_ms: int,
        selectors: tuple[str, str],
    ) -> None:
        self.api, self.readers, self.selectors = api, readers, selectors
        self.at = at
        self.at_ms = round(at * 1000)
        self.span_ms = span_ms
        self.widths_ms = widths_ms
        self.starts_ms = {name: self.at_ms - w for name, w in widths_ms.items()}
        self.shares: dict[str, dict[LabelSet, list[tuple[GroupKey, str, float]]]] = {name: {} for name in widths_ms}
        #: per window, the replicas with a restart within it
        self.restarted: dict[str, set[LabelSet]] = {name: set() for name in widths_ms}
        self.queries = 0

    async def read(
        self, todo: Iterator[LabelSet], restarted: Collection[LabelSet], left: Mapping[LabelSet, set[str]]
    ) -> None:
        """Reads the replicas of ``todo`` one by one: the ``restarted`` replicas' restarts, and for each
        window that ``left`` names for a replica or that a restart's hidden series may concern, what
        :meth:`_gone` adds."""
        for replica in todo:  # shared with the other readers: each replica is read once
            for reader in self.readers.values():  # its labels checked before they go into a query
                reader.group(dict(replica))
            matchers = ",".join(f"{k}={quote(v)}" for k, v in replica if k != "model")
            sel, n_sel = (f"{s[:-1]},{matchers}}}" for s in self.selectors)
            gaps = set(left.get(replica, ()))
            if replica in restarted:
                gaps |= await self._restarts(replica, sel, n_sel)
            for name in self.widths_ms:
                if name in gaps:
                    await self._gone(replica, sel, name)

    async def _restarts(self, replica: LabelSet, sel: str, n_sel: str) -> set[str]:
        """Reads the restarts of ``replica`` (its ``n`` samples over the span and the longest window before
        it) and what those within a window add; returns the windows whose start a restart may have hidden
        series from (a restart after their baseline, before any sample of the span or at its first)."""
        self.queries += 1
        times: set[int] = set()
        sampled: list[int] = []
        for series in await self.api.matrix(f"{n_sel}[{self.span_ms + max(self.widths_ms.values())}ms]", self.at):
            _own(series.labels, replica)
            times.update(round(t * 1000) for t in restart_times(series))
            sampled += (round(t * 1000) for t in series.times)
        span_start = self.at_ms - self.span_ms
        after = min((t for t in sampled if t > span_start), default=self.at_ms + 1)
        first = min(self.starts_ms.values())
        restarts = sorted(times)
        for r, until in zip(restarts, [*restarts[1:], self.at_ms + 1], strict=True):
            if r <= first:
                continue
            within = [name for name, start in self.starts_ms.items() if r > start]
            for name in within:
                self.restarted[name].add(replica)
            await self._before(replica, sel, (r, until), within)
        return {
            name
            for name, start in self.starts_ms.items()
            if any(start - self.span_ms < r <= min(start, after) for r in restarts)
        }

    async def _before(self, replica: LabelSet, sel: str, lifetime: tuple[int, int], within: list[str]) -> None:
        """Each series' last value before the restart at ``lifetime[0]`` (ms) within the span, for the
        series with a sample in the process's ``lifetime`` (up to the next restart: a series the new
        process exports only later, and that then fell, counts from zero too), added to the windows
        ``within``."""
        r, until = lifetime
        reach = max(1, r - 1 - (self.at_ms - self.span_ms))  # from the span's start, as the sums read
        expr = (
            f"last_over_time({sel}[{reach}ms] @ {(r - 1) / 1000:.3f})"
            f" and last_over_time({sel}[{until - r}ms] @ {(until - 1) / 1000:.3f})"
        )
        await self._add(replica, expr, within)

    async def _gone(self, replica: LabelSet, sel: str, name: str) -> None:
        """The series of ``replica`` that the range query read at window ``name``'s start from before the
        span (a sample within the window's width before the span, none from the span's start to the
        window's): their values, added back to the window."""
        w = self.widths_ms[name]
        expr = (
            f"last_over_time({sel}[{w}ms] offset {self.span_ms}ms)"
            f" unless last_over_time({sel}[{self.span_ms - w}ms] offset {w}ms)"
        )
        await self._add(replica, expr, (name,))

    async def _add(self, replica: LabelSet, expr: str, windows: Collection[str]) -> None:
        """The values of ``expr``, a query about ``replica`` alone, added to each of ``windows``."""
        self.queries += 1
        for s in await self.api.vector(expr, self.at):
            _own(s.labels, replica)
            for name in windows:
                reader = self.readers[name]
                key = reader.accept(s.labels)
                if key is not None:
                    reader.check(*key, s.value)
                    self.shares[name].setdefault(replica, []).append((*key, s.value))


def _own(labels: LabelSet, replica: LabelSet) -> None:
    """Refuses a series of another replica in an answer about ``replica``."""
    if tuple((k, v) for k, v in labels if k != "stat") != replica:
        raise QueryError("malformed", "an answer about one replica holds a series of another replica")
