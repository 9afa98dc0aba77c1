"""Gauges read at several past times written as one OpenMetrics text file: a metrics history that
``promtool tsdb create-blocks-from openmetrics FILE DATA_DIR`` turns into Prometheus blocks (backfilling).

The families are the live collectors' own (their names, help texts and labels), each sample stamped with
the time it describes. The text follows OpenMetrics as promtool reads it: one ``# HELP``/``# TYPE`` block
per family and its samples after it, the samples of one series together and in increasing time, timestamps
in seconds, label values escaped (by ``prometheus_client``'s OpenMetrics exposition), ``# EOF`` last.
Only gauges are taken: a counter's history is a running total with a start time of its own, which a
past reading does not have."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.samples import Sample, Timestamp

#: The last line of an OpenMetrics exposition.
EOF_LINE = "# EOF\n"
NS_PER_SECOND = 1_000_000_000


def timestamp_of(ns: int) -> Timestamp:
    """Nanoseconds since the epoch as an exposition timestamp (seconds, exact to the nanosecond)."""
    sec, nsec = divmod(int(ns), NS_PER_SECOND)
    return Timestamp(sec, nsec)


@dataclass
class _Family:
    """One family's samples over every reading, by series (in the order the series first came)."""

    metric: Metric
    series: dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, Sample]] = field(default_factory=dict)


class _One:
    """A registry of one family, as :func:`generate_latest` reads a registry."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self.metric]


@dataclass
class MetricsHistory:
    """Readings of gauge families at several times (:meth:`add`), written as one OpenMetrics text
    (:meth:`write`) whatever order the readings came in."""

    families: dict[str, _Family] = field(default_factory=dict)

    def add(self, at_ns: int, families: Iterable[Metric]) -> None:
        """The families as read at ``at_ns`` (nanoseconds since the epoch). Raises ``ValueError`` for a family
        that is not a gauge, or for a second sample of one series at one time."""
        for metric in families:
            if metric.type != "gauge":
                raise ValueError(f"{metric.name} is a {metric.type}: only gauges have a history to backfill")
            fam = self.families.setdefault(metric.name, _Family(metric))
            for s in metric.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                points = fam.series.setdefault(key, {})
                if at_ns in points:
                    raise ValueError(f"two samples of {s.name}{dict(key[1])} at {timestamp_of(at_ns)}")
                points[at_ns] = s._replace(timestamp=timestamp_of(at_ns))

    @property
    def samples(self) -> int:
        return sum(len(p) for fam in self.families.values() for p in fam.series.values())

    @property
    def series(self) -> int:
        return sum(len(fam.series) for fam in self.families.values())

    def write(self, out: TextIO) -> None:
        """Every family, its series one after the other, each series' samples in increasing time; ``# EOF``."""
        for fam in self.families.values():
            merged = Metric(fam.metric.name, fam.metric.documentation, fam.metric.type, fam.metric.unit)
            merged.samples = [points[t] for points in fam.series.values() for t in sorted(points)]
            text = generate_latest(_One(merged)).decode("utf-8")  # type: ignore[arg-type]
            out.write(text.removesuffix(EOF_LINE))
        out.write(EOF_LINE)
