"""The window statistics of all replicas of a model, from their ``icos_window_stat_total`` counters.

Why not ``increase()``: it extrapolates to the window's edges and returns fractions of predictions,
so a fleet estimate built on it would not equal the estimate of one agent that saw the same
predictions. Instead the evaluator reads raw counter values and differences them itself:

* for every series, ``increment = last value in [t−w−L, t]`` minus ``last value in [t−w−L, t−w]``
  (0 when the series was born in the window: a replica that joined), evaluated by Prometheus as two
  exact sums over all replicas (``last_over_time`` reads raw samples, no extrapolation; a replica that
  left keeps its last value, so it counts until its data leaves the window);
* the few series with a reset (``resets() > 0``: a replica restarted) are then read sample by sample:
  their share of the two sums is replaced by their increments summed with a reset restarting from
  zero, like one agent would have counted.

``L`` is the lookback (``fleet.lookback_seconds``). The figures are exact up to the scrape interval:
predictions a replica judged after its last scrape before a crash are lost (the process is gone),
and the window's edges fall on scrapes, not on the predictions' own times.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.fleet.prometheus_api import LabelSet, PrometheusAPI, Series

#: The replicas' counter of additive window statistics (``exporters.prometheus.AgentMetrics``).
STAT_METRIC = "icos_window_stat_total"
#: What a fleet sum is grouped by; every other label (instance, pod, job …) tells replicas apart.
GROUP_LABELS = ("model", "version", "bundle")
#: (model, version, bundle)
GroupKey = tuple[str, str, str]


@dataclass
class WindowSums:
    """One window of the fleet: per (model, version, bundle), the increment of every stat, and the
    replicas that exported in the window."""

    stats: dict[GroupKey, dict[str, float]] = field(default_factory=dict)
    replicas: dict[GroupKey, int] = field(default_factory=dict)
    restarted_replicas: int = 0
    queries: int = 0


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(model: str, extra: str = "", **labels: str) -> str:
    """``icos_window_stat_total{model="…", <extra>, <labels>}``."""
    parts = [f"model={quote(model)}", *(f"{k}={quote(v)}" for k, v in labels.items())]
    if extra:
        parts.append(extra)
    return f"{STAT_METRIC}{{{','.join(parts)}}}"


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _key(labels: LabelSet) -> tuple[GroupKey, str]:
    d = dict(labels)
    return (d.get("model", ""), d.get("version", ""), d.get("bundle", "")), d.get("stat", "")


def series_increment(points: Iterable[tuple[float, float]], start: float) -> float:
    """The increase of one counter over the samples after ``start`` (unix time), a reset (a value
    below its predecessor: the process restarted) counting from zero; the last sample at or before
    ``start`` is the baseline (0 when there is none: the series was born in the window)."""
    prev = 0.0
    total = 0.0
    for t, v in points:
        if t <= start:
            prev = v
            continue
        total += v - prev if v >= prev else v
        prev = v
    return total


def window_sums(
    api: PrometheusAPI, model: str, at: float, window_s: float, lookback_s: float, extra: str = ""
) -> WindowSums:
    """The fleet's window statistic over ``(at − window_s, at]`` (see the module docstring)."""
    sel = selector(model, extra)
    full = _ms(window_s + lookback_s)
    by = ", ".join((*GROUP_LABELS, "stat"))
    reset = f"resets({sel}[{full}]) > 0"
    q0 = api.queries
    end = api.vector(f"sum by ({by}) (last_over_time({sel}[{full}]))", at)
    begin = api.vector(f"sum by ({by}) (last_over_time({sel}[{_ms(lookback_s)}] offset {_ms(window_s)}))", at)
    out = WindowSums()
    sums: dict[GroupKey, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in end:
        group, stat = _key(s.labels)
        sums[group][stat] += s.value
    for s in begin:
        group, stat = _key(s.labels)
        sums[group][stat] -= s.value
    restarted = api.vector(reset, at)
    reset_series = {s.labels for s in restarted}
    replicas_of = {tuple((k, v) for k, v in labels if k != "stat") for labels in reset_series}
    out.restarted_replicas = len(replicas_of)
    for replica in sorted(replicas_of):
        matchers = ",".join(f"{k}={quote(v)}" for k, v in replica if k != "model")
        raw: list[Series] = api.matrix(f"{selector(model, extra)[:-1]},{matchers}}}[{full}]", at)
        for series in raw:
            if series.labels in reset_series and series.points:
                # its share of the two sums above (last value minus the baseline) is replaced by the
                # increments read sample by sample
                group, stat = _key(series.labels)
                baseline = [v for t, v in series.points if t <= at - window_s]
                last = series.points[-1][1] - (baseline[-1] if baseline else 0.0)
                sums[group][stat] += series_increment(series.points, at - window_s) - last
    n_sel = selector(model, extra, stat="n")
    for s in api.vector(f"count by ({', '.join(GROUP_LABELS)}) (last_over_time({n_sel}[{_ms(window_s)}]))", at):
        group, _ = _key(s.labels)
        out.replicas[group] = int(s.value)
    out.stats = {g: dict(v) for g, v in sums.items()}
    out.queries = api.queries - q0
    return out
