"""A lake's time windows as the agent's metrics history: every window's estimates as the live agent exports
them (:class:`exporters.prometheus.EstimatesCollector`: the same families, names and labels) stamped with the
window's end, written in the OpenMetrics text format (:class:`exporters.openmetrics.MetricsHistory`) for
``promtool tsdb create-blocks-from openmetrics``, so that a dashboard shows last month beside today.

A live agent's time window ``1h`` is, at any instant, the hour that ends then; a lake's window of one hour
stamped at its end is the same reading, taken once an hour: the ``window`` label is the window's width as the
agent's config writes it (``windows.time``: ``5m``, ``1h``, ``1d``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import Metric

from agent.core.durations import duration_name
from agent.errors import UserError
from agent.offline.windowed import Windowed, Windowing
from agent.results.bundle import BundleSection
from agent.results.window import WindowEntry, estimates_snapshot
from exporters.label_values import bounded_label
from exporters.openmetrics import MetricsHistory
from exporters.prometheus import EstimatesCollector, Snapshot

#: The ``version`` label when none is given: the agent's default ``model.version``.
DEFAULT_MODEL_VERSION = "1"


@dataclass(frozen=True)
class Backfill:
    """What :func:`write_openmetrics` wrote: the file, its windows, series and samples, and the time of its first
    and last samples (nanoseconds since the epoch)."""

    path: Path
    windows: int
    series: int
    samples: int
    first_ns: int
    last_ns: int

    def to_json(self) -> dict[str, object]:
        import pandas as pd

        def iso(ns: int) -> str:
            return pd.Timestamp(ns, unit="ns", tz="UTC").isoformat()

        return {
            "path": str(self.path),
            "windows": self.windows,
            "series": self.series,
            "samples": self.samples,
            "first": iso(self.first_ns),
            "last": iso(self.last_ns),
        }


def scraped(snap: Snapshot) -> Iterable[Metric]:
    """What the live agent's estimates collector exports of ``snap`` at a scrape (non-finite samples left out)."""
    return EstimatesCollector(lambda: snap).collect()


def window_label(windowing: Windowing) -> str:
    """The ``window`` label of the windows cut by ``windowing``: their width as the agent's config writes it. Raises
    :class:`~agent.errors.UserError` for windows of rows (they have no time) and for widths the agent's windows
    cannot have (under a second, or not a whole number of milliseconds)."""
    width = windowing.width_ns
    if width is None:
        raise UserError(
            "only time windows can be written as metrics history: windows of rows, or one window of every row, "
            "have no time (give a timestamp column and a duration window, e.g. '1h')"
        )
    if width < 1_000_000_000 or width % 1_000_000:
        raise UserError(f"a window of {width} ns cannot be an agent's window (whole milliseconds, at least 1 s)")
    return duration_name(width)


def write_openmetrics(
    path: str | Path,
    windowed: Windowed,
    entries: Sequence[tuple[int, WindowEntry]] | None = None,
    *,
    model_name: str | None = None,
    model_version: str = DEFAULT_MODEL_VERSION,
) -> Backfill:
    """Every window of ``windowed`` (``entries``: their keys and entries where already estimated, else each is
    estimated here) written to ``path`` as OpenMetrics text, each sample stamped with its window's end.
    ``model_name`` and ``model_version`` are the ``model`` and ``version`` labels (the live agent's
    ``model.name`` and ``model.version``; the name defaults to the ONNX model's, as ``check`` reports it), kept to one
    bounded line as every label made of data is (:func:`~exporters.label_values.bounded_label`)."""
    label = window_label(windowed.windowing)
    if entries is None:
        entries = [(k, windowed.entry(label, t)) for k, t in windowed.ordered()]
    if not entries:
        raise UserError("the data has no rows: no window to write")
    bundle = BundleSection(windowed.headline, windowed.calibration)
    if model_name is None and windowed.model is None:
        raise UserError("a bundle fitted from logged predictions has no model file to name: give model_name")
    name = bounded_label(model_name or windowed.model.name)  # type: ignore[union-attr]  # checked above
    version = bounded_label(model_version)
    history = MetricsHistory()
    ends = []
    for key, entry in entries:
        named = dataclasses.replace(entry, name=label)
        snap = estimates_snapshot(name, version, [named], bundle)
        end = windowed.windowing.bounds(key)[1]
        ends.append(end)
        history.add(end, scraped(snap))
    out = Path(path)
    with out.open("w", encoding="utf-8") as f:
        history.write(f)
    return Backfill(out, len(entries), history.series, history.samples, min(ends), max(ends))
