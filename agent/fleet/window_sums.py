"""The window statistics of all replicas of a model, from their ``icos_window_stat_total`` counters.

Why not ``increase()``: it extrapolates to the window's edges and returns fractions of predictions,
so a fleet estimate built on it would not equal the estimate of one agent that saw the same
predictions. Instead the evaluator reads raw counter values and differences them itself:

* for every series, ``increment = last value in [t−w−L, t]`` minus ``last value in [t−w−L, t−w]``
  (0 when the series was born in the window: a replica that joined), evaluated by Prometheus as two
  exact sums over all replicas (``last_over_time`` reads raw samples, no extrapolation; a replica that
  left keeps its last value, so it counts until its data leaves the window);
* the few replicas with a reset (``resets() > 0`` on any of their series: the process restarted) are
  then read sample by sample: their share of the two sums is replaced by their increments summed with
  a reset restarting from zero, like one agent would have counted. A scrape at which any series of
  the replica fell is a restart for all its series (one that grew past its old value before that
  scrape started from zero too).

``L`` is the lookback (``fleet.lookback_seconds``). The figures are exact up to the scrape interval:
predictions a replica judged after its last scrape before a crash are lost (the process is gone),
and the window's edges fall on scrapes, not on the predictions' own times.

Nothing of an answer is believed unchecked (:class:`_Reader`): the ``model`` label must be this
evaluator's, versions and bundles must be label values a replica can have (at most
``fleet.max_versions`` versions), label names must be PromQL identifiers (they are written back into
queries), and the statistics of this evaluator's bundle must be names of its :class:`StatSchema`
with counter values; other bundles' series are read for their ``n`` only (to tell a mixed version).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.fleet.prometheus_api import LabelSet, PrometheusAPI, QueryError, Series, concurrently, printable
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


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def series_increment(
    points: Iterable[tuple[float, float]], start: float, resets: frozenset[float] = frozenset()
) -> float:
    """The increase of one counter over the samples after ``start`` (unix time), a reset (a value
    below its predecessor, or a sample at one of the times ``resets``: the process restarted)
    counting from zero; the last sample at or before ``start`` is the baseline (0 when there is none:
    the series was born in the window)."""
    prev = 0.0
    total = 0.0
    for t, v in points:
        if t <= start:
            prev = v
            continue
        total += v if v < prev or t in resets else v - prev
        prev = v
    return total


def reset_times(series: Iterable[Series]) -> frozenset[float]:
    """The sample times at which any of one replica's series fell (its restarts)."""
    out: set[float] = set()
    for s in series:
        for i in range(1, len(s.values)):
            if s.values[i] < s.values[i - 1]:
                out.add(s.times[i])
    return frozenset(out)


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


async def window_sums(
    api: PrometheusAPI, scope: FleetScope, at: float, windows: Mapping[str, float], lookback_s: float
) -> dict[str, WindowSums]:
    """The fleet's statistic of every window ``name → seconds`` over ``(at − seconds, at]`` (see the
    module docstring); raises :class:`~agent.fleet.prometheus_api.RefreshError`.

    Every aggregating query runs at once (``api.max_concurrent`` in flight). The restarts are read
    once, over the longest window: a replica that restarted within a shorter window restarted within
    the longest, and its raw samples over the longest hold those of every shorter one, so each window
    takes its share of them (samples from ``at − seconds − lookback_s`` on, as the store's range
    selectors do) instead of asking the store again; a store scans every series for each ``resets``.
    What the restarted replicas add is summed in one order whatever order they answer in."""
    if not windows:
        return {}
    at = round(at, 3)  # the time the store is asked for (milliseconds): the client's edges are its edges
    sel = selector(scope.model, scope.extra, scope.metric)
    by = ", ".join((*GROUP_LABELS, "stat"))
    n_sel = selector(scope.model, scope.extra, scope.metric, stat="n")
    longest = _ms(max(windows.values()) + lookback_s)
    asked = []
    for window_s in windows.values():
        asked += [
            api.vector(f"sum by ({by}) (last_over_time({sel}[{_ms(window_s + lookback_s)}]))", at),
            api.vector(f"sum by ({by}) (last_over_time({sel}[{_ms(lookback_s)}] offset {_ms(window_s)}))", at),
            api.vector(f"count by ({', '.join(GROUP_LABELS)}) (last_over_time({n_sel}[{_ms(window_s)}]))", at),
        ]
    asked.append(api.vector(f"count without (stat) (resets({sel}[{longest}]) > 0)", at))
    answers = await concurrently(*asked)
    outs = {name: WindowSums() for name in windows}
    readers = {name: _Reader(scope, outs[name]) for name in windows}
    for i, name in enumerate(windows):
        reader, (plus, minus, counted) = readers[name], answers[3 * i : 3 * i + 3]
        for sign, answer in ((1.0, plus), (-1.0, minus)):
            for s in answer:
                key = reader.accept(s.labels)
                if key is not None:
                    reader.add(*key, s.value, sign)
        for s in counted:
            group = reader.group(dict(s.labels))
            _count("a replica count", s.value)
            outs[name].replicas[group] = int(s.value)
        outs[name].queries = 3
    replicas = sorted({replica_labels(s.labels) for s in answers[-1]})
    shares: dict[str, dict[LabelSet, list[tuple[GroupKey, str, float]]]] = {name: {} for name in windows}
    todo = iter(replicas)

    async def read_restarted() -> None:
        for replica in todo:  # one iterator shared by the readers: each replica is read once
            for reader in readers.values():  # its labels checked before they go into a query
                reader.group(dict(replica))
            matchers = ",".join(f"{k}={quote(v)}" for k, v in replica if k != "model")
            raw = await api.matrix(f"{sel[:-1]},{matchers}}}[{longest}]", at)
            for name, window_s in windows.items():
                start = at - window_s
                share = _restarted_share(readers[name], replica, raw, start, start - lookback_s)
                if share is not None:
                    shares[name][replica] = share

    await concurrently(*(read_restarted() for _ in range(min(api.max_concurrent, len(replicas)))))
    for name in windows:
        reader = readers[name]
        for replica in replicas:
            for group, stat, delta in shares[name].get(replica, ()):
                stats = reader.sums.setdefault(group, {})
                stats[stat] = stats.get(stat, 0.0) + delta
        outs[name].restarted_replicas = len(shares[name])
        outs[name].stats = reader.sums
    # the restarts' queries are the longest window's
    outs[max(windows, key=lambda name: windows[name])].queries += 1 + len(replicas)
    return outs


def _restarted_share(
    reader: _Reader, replica: LabelSet, raw: list[Series], start: float, first: float
) -> list[tuple[GroupKey, str, float]] | None:
    """What a restarted replica's raw samples from ``first`` on change in one window's two sums: per
    statistic, its increments read sample by sample (a reset counting from zero) minus its share of
    them (last value minus the baseline); None when it did not restart within them (its share of the
    sums is then exact)."""
    within = [_from(series, first) for series in raw]
    resets = reset_times(within)
    if not resets:
        return None
    out = []
    for series in within:
        if tuple((k, v) for k, v in series.labels if k != "stat") != replica:
            raise QueryError("malformed", "a restarted replica's samples hold a series of another replica")
        key = reader.accept(series.labels)
        if key is None or not series.values:
            continue
        group, stat = key
        for v in (min(series.values), max(series.values)):
            reader.check(group, stat, v)
        if stat in reader.scope.schema.counts and not all(v.is_integer() for v in series.values):
            raise RefusedAnswer("bad_value", f"count {stat} has counter values that are not whole")
        baseline = [v for t, v in series.points if t <= start]
        last = series.values[-1] - (baseline[-1] if baseline else 0.0)
        out.append((group, stat, series_increment(series.points, start, resets) - last))
    return out


def _from(series: Series, first: float) -> Series:
    """``series``'s samples at or after ``first`` (a range selector's samples from its start on)."""
    i = bisect.bisect_left(series.times, first)
    if i == 0:
        return series
    return Series(series.labels, series.times[i:], series.values[i:])
