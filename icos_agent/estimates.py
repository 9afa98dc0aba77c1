"""What ``Bundle.estimate`` gives: every window estimated once (as a running agent estimates its windows) and read
as data frames (NannyML's shape: one row per window), figures and one self-contained HTML page."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.api import (
    Backfill,
    SegmentTable,
    Tally,
    UserError,
    Windowed,
    WindowedPair,
    WindowEntry,
    alert_of,
    estimate_row,
    realized_accuracy,
    write_openmetrics,
)

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

#: How far below the reference accuracy a headline must lie to alert: the default ``margin`` of the
#: ``IcosEstimatedAccuracyLow`` rule (``deploy/alerts/source.yaml``).
ALERT_MARGIN = 0.05

#: The kinds of :meth:`Estimates.plot`.
PLOT_KINDS = ("accuracy", "segments", "challenger")


class Estimates:
    """The windows of one estimate: :meth:`to_df`, :meth:`segments_df`, :meth:`challenger_df`, :meth:`plot`,
    :meth:`save_html`, :meth:`to_openmetrics` (time windows as the agent's metrics history); ``report()`` is
    ``check``'s report of every row (``--json``'s object)."""

    def __init__(
        self, windowed: Windowed, *, alert_margin: float = ALERT_MARGIN, paired: WindowedPair | None = None
    ) -> None:
        self.windowed = windowed
        self.alert_margin = alert_margin
        self.paired = paired

    @property
    def headline(self) -> str:
        """The estimator the bundle reports first (chosen at fit)."""
        return self.windowed.headline

    @property
    def reference_accuracy(self) -> float:
        """The model's accuracy on the bundle's calibration split: what the alert compares the headline with."""
        return float(self.windowed.calibration.accuracy)

    @property
    def alert_threshold(self) -> float:
        """The headline below which a window may alert: the reference accuracy less the margin."""
        return self.reference_accuracy - self.alert_margin

    @property
    def by_time(self) -> bool:
        return self.windowed.windowing.by_time

    @cached_property
    def windows(self) -> list[tuple[int, Tally, WindowEntry]]:
        """Every window's key, tally and entry, in order."""
        return [(k, t, self.windowed.entry(str(k), t)) for k, t in self.windowed.ordered()]

    @cached_property
    def total(self) -> WindowEntry:
        """Every row as one window."""
        return self.windowed.entry("all", self.windowed.total)

    def report(self) -> dict[str, Any]:
        """``icos-agent check --json``'s report of every row, and ``windows`` when the rows were cut."""
        return self.windowed.report()

    def bounds(self, key: int) -> tuple[Any, Any]:
        """Window ``key``'s start and end: UTC timestamps for time windows, else row numbers (end excluded)."""
        start, end = self.windowed.windowing.bounds(key)
        if self.by_time:
            import pandas as pd

            return pd.Timestamp(start, unit="ns", tz="UTC"), pd.Timestamp(end, unit="ns", tz="UTC")
        if self.windowed.windowing.rows is None:
            return 0, self.windowed.total.n
        return start, min(end, self.windowed.seen)

    def _window_row(self, key: int, tally: Tally, entry: WindowEntry) -> dict[str, Any]:
        start, end = self.bounds(key)
        row = entry.to_row(realized_accuracy(tally))
        for dropped in ("window", "alert", "reasons"):
            row.pop(dropped)
        a = entry.assessment
        return {
            "window_start": start,
            "window_end": end,
            **row,
            "reference_accuracy": self.reference_accuracy,
            "alert_threshold": self.alert_threshold,
            "flag_raised": None if a is None else a.raised,
            "flag_reasons": None if a is None else ";".join(a.reasons),
            "alert": alert_of(entry, self.reference_accuracy, self.alert_margin),
        }

    def to_df(self) -> pd.DataFrame:
        """One row per window: ``window_start``, ``window_end``, ``n``, ``fails``, ``n_labels``, the headline's
        ``estimator``, ``value``, ``lower`` and ``upper`` (its interval widened where the flag is raised), every
        estimator's ``<name>_value``/``_lower``/``_upper``, ``realized`` (the accuracy on the labels, where every
        row is labeled), ``reference_accuracy``, ``alert_threshold``, ``flag_raised`` and ``flag_reasons`` (the
        flag "this number may be wrong") and ``alert`` (``IcosEstimatedAccuracyLow`` on the window)."""
        import pandas as pd

        return pd.DataFrame([self._window_row(k, t, e) for k, t, e in self.windows])

    def segment_tables(self) -> list[tuple[int, SegmentTable]]:
        """Every window's segment table (none without segments in the bundle)."""
        out = []
        for key, tally, entry in self.windows:
            table = self.windowed.segments(entry, tally)
            if table is not None:
                out.append((key, table))
        return out

    def segments_df(self, every_row: bool = False) -> pd.DataFrame:
        """One row per segment of each window (``every_row``: of one window of every row), ranked within the
        window by evidence of a drop (segments whose inputs changed first, then by what the segment lost: its
        ``contribution`` to the window's drop): its ``dimension``, ``kind`` and ``segment`` name, ``n`` and
        ``share`` beside its ``reference_share`` and ``reference_accuracy``, the segment estimate's ``value``,
        ``lower`` and ``upper``, ``z``, what changed without labels (``changed``, ``change_score`` and
        ``changed_columns``, the inputs that moved most, ``", "``-joined), ``status`` (as in ``/v1/estimates``:
        ``dropping``, ``changed_cost_unknown``, ``changed`` or ``ok``), ``shares_moved`` (rows moved between the
        segments of its dimension, so a change in a segment that gained rows may be of rows changed elsewhere: the
        same on every row of a dimension), ``widespread`` (the window's change is across the traffic, in no one
        segment: the same on every row of a window) and ``truth_accuracy`` where every row is labeled."""
        import pandas as pd

        tables: list[tuple[Any, Any, SegmentTable | None]] = [
            (*self.bounds(key), table) for key, table in self.segment_tables()
        ]
        if every_row:
            seen = self.windowed.seen
            tables = [(None, None, self.windowed.segments(self.total, self.windowed.total))] if seen else []
        rows = []
        for start, end, table in tables:
            if table is None:
                continue
            widespread = table.widespread
            for rank, s in enumerate(table.rows, start=1):
                rows.append(
                    {
                        "window_start": start,
                        "window_end": end,
                        "rank": rank,
                        "dimension": s.dimension,
                        "kind": s.kind,
                        "segment": s.name,
                        "n": s.n,
                        "share": s.share,
                        "reference_share": s.reference_share,
                        "reference_accuracy": s.reference_accuracy,
                        **{k.removeprefix("estimate_"): v for k, v in estimate_row("estimate", s.estimate).items()},
                        "adjusted": s.adjusted,
                        "contribution": s.contribution,
                        "z": s.z,
                        "changed": s.change.changed,
                        "change_score": s.change.score,
                        "changed_columns": ", ".join(s.change.names),
                        "status": s.status,
                        "shares_moved": s.moved,
                        "widespread": widespread,
                        "truth_accuracy": s.truth_accuracy,
                        "truth_n": s.truth_n,
                    }
                )
        return pd.DataFrame(rows)

    def challenger_df(self) -> pd.DataFrame:
        """One row per window of the challenger against the model: ``n``, ``disagreements``, ``agreement``, the
        difference reported first (challenger minus model: ``estimator``, ``value``, ``lower``, ``upper``;
        ``alert``: its interval excludes zero), every difference's ``<name>_value``/``_lower``/``_upper``, each
        version's headline and, where every row is labeled, the ``realized`` difference."""
        import pandas as pd

        if self.paired is None:
            raise UserError("no challenger: give estimate(..., challenger=<the challenger's Bundle>)")
        rows = []
        for key, _, _ in self.windows:
            start, end = self.bounds(key)
            row = self.paired.entry(str(key), key).to_row()
            row.pop("window")
            tally = self.paired.windows[key]
            realized = None
            if tally.labeled and tally.labeled == tally.sums.n:
                realized = float(tally.right[1] - tally.right[0]) / tally.labeled
            rows.append({"window_start": start, "window_end": end, **row, "realized": realized})
        return pd.DataFrame(rows)

    def plot(self, kind: str = "accuracy") -> Figure:
        """A figure: ``accuracy`` (the headline with its interval band per window, the realized accuracy beside
        it, the reference accuracy and the alert threshold, flagged windows marked), ``segments`` (the segments
        that carry the drop over every row) or ``challenger`` (the difference with its interval per window)."""
        from icos_agent import figures

        if kind not in PLOT_KINDS:
            raise UserError(f"plot kind {kind!r}: choose one of {', '.join(PLOT_KINDS)}")
        if kind == "accuracy":
            return figures.accuracy_figure(self.to_df(), self.headline, self.by_time)
        if kind == "segments":
            return figures.segments_figure(self.segments_df(every_row=True))
        return figures.challenger_figure(self.challenger_df(), self.by_time)

    def save_html(self, path: str | Path) -> Path:
        """One self-contained page (the figures embedded as PNG, no script, nothing fetched when it is viewed)
        with the figures and the tables."""
        from icos_agent.figures import html_page

        out = Path(path)
        out.write_text(html_page(self), encoding="utf-8")
        return out

    def to_openmetrics(self, path: str | Path, *, model_name: str | None = None, model_version: str = "1") -> Backfill:
        """Every time window written to ``path`` as the agent's metrics history (OpenMetrics text, each sample
        stamped with its window's end: the families, names and labels the live agent exports), for ``promtool
        tsdb create-blocks-from openmetrics``; ``model_name`` and ``model_version`` are the agent's ``model.name``
        and ``model.version`` (the name defaults to the ONNX model's). Windows of rows have no time: refused."""
        entries = [(k, e) for k, _, e in self.windows] if self.by_time else None
        return write_openmetrics(path, self.windowed, entries, model_name=model_name, model_version=model_version)

    def _repr_html_(self) -> str:
        """A notebook shows the windows' table."""
        return str(self.to_df().to_html(index=False, max_rows=50))
