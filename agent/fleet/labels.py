"""The fleet's labels: the labeled predictions of every replica, read from the shared prediction store
(``labels.store_url``), for the fleet's ``with_labels`` and its realized figures.

A replica's own ``with_labels`` adds the fleet's labeled sample to *its own* window counts: right only
when every replica serves the same mix of traffic. The fleet evaluator adds the same labeled sample to
the sum of every replica's window statistics instead, which is what one agent serving all the traffic
would have: its ``with_labels`` is the fleet's, whatever each replica serves.

Every refresh reads, once, the labeled predictions of the evaluator's model identity (its model and
bundle) made within its longest time window (:meth:`PostgresBackend.labeled_between`: one range scan
of the ``(identity, ts)`` index, at most ``labels.max_predictions`` rows, under the store's statement
timeout). They go through :class:`~agent.labels.realized.RealizedWindows`, the very code an agent's
realized windows run, so each window's ``lab_*`` sums come from the same function
(:meth:`RealizedWindows.labeled_sums`) and the same weighting of the labeling sample as an agent's.
The labels of the labeling sample keep their segment numbers, so the fleet's segments get their realized
accuracy from every replica's labels (:meth:`RealizedWindows.segment_labels`).
When the cap cut the read short, windows reaching back before the oldest row read get no labels:
the rows kept are the newest, not a random share of the window, so they would bias the estimate.

A store that fails (unreachable, slow, refusing) raises :class:`StoreUnavailable`; the evaluator
counts it and serves the label-free estimates alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.segments.realized import SegmentLabels
from agent.estimation.statistics.window import WindowStats
from agent.labels.backend import StoreUnavailable, StoreUnreachable
from agent.labels.realized import RealizedWindow, RealizedWindows
from agent.labels.rows import LabeledRows

__all__ = ["FleetLabels", "LabelSource", "LabelsRead", "StoreUnavailable", "StoreUnreachable", "error_reason"]

#: Why a read of the store failed (``icos_fleet_label_errors_total{reason}``; every one exported from 0).
LABEL_ERROR_REASONS = ("unreachable", "failed")


class LabelSource(Protocol):
    """What the fleet reads of the shared store (:class:`agent.labels.postgres_backend.PostgresBackend`)."""

    def labeled_between(self, identity: str, since: float, until: float, limit: int) -> LabeledRows: ...


@dataclass(frozen=True)
class LabelsRead:
    """One read of the fleet's labels: per time window, the labeling sample's ``lab_*`` sums and the
    realized figures of every labeled prediction in it (None: none)."""

    sums: Mapping[str, WindowStats] = field(default_factory=dict)
    realized: Mapping[str, RealizedWindow | None] = field(default_factory=dict)
    #: labeled predictions read (at most the cap)
    rows: int = 0
    #: windows left without labels because the cap cut the read short
    truncated: tuple[str, ...] = ()
    #: per time window, the labeling sample's labels per segment (every segment's realized accuracy)
    segments: Mapping[str, SegmentLabels] = field(default_factory=dict)


def error_reason(exc: StoreUnavailable) -> str:
    """The counted reason of a failed read."""
    return "unreachable" if isinstance(exc, StoreUnreachable) else "failed"


class FleetLabels:
    """Reads the labels of one model identity for the evaluator's time windows."""

    def __init__(
        self,
        source: LabelSource,
        identity: str,
        windows: Mapping[str, float],
        cap: int,
        classes: Sequence[str] | None = None,
        per_class_cap: int = 0,
        max_source_share: float = 1.0,
    ) -> None:
        self.source = source
        #: ``labels.max_source_share``: one label source weighs at most this share of a window's realized figures
        self.max_source_share = float(max_source_share)
        self.identity = identity
        self.windows = dict(windows)
        self.cap = int(cap)
        self.classes = list(classes) if classes else None
        self.per_class = self.classes is not None and len(self.classes) <= per_class_cap

    def read(self, at: float, calibration: EstimatorCalibration) -> LabelsRead:
        """The labels of the predictions made in each window ending at ``at``; raises
        :class:`StoreUnavailable`."""
        if not self.windows:
            return LabelsRead()
        longest = max(self.windows.values())
        rows = self.source.labeled_between(self.identity, at - longest, at, self.cap)
        kept = dict(self.windows)
        truncated: tuple[str, ...] = ()
        if rows.n >= self.cap and rows.n:
            oldest = float(rows.timestamp.min())
            truncated = tuple(name for name, seconds in self.windows.items() if at - seconds < oldest)
            kept = {name: s for name, s in self.windows.items() if name not in truncated}
        windows = RealizedWindows(kept, None, max(self.cap, 1), self.max_source_share)
        windows.reset(rows)
        realized = windows.compute(calibration, at, self.classes, per_class=self.per_class)
        sums = windows.labeled_sums(calibration, at, self.classes, per_class=self.per_class)
        segments = windows.segment_labels(calibration, at, self.classes, per_class=self.per_class)
        return LabelsRead(sums, realized, rows.n, truncated, segments)
