"""The realized windows of the model being served, kept up to date: filled from the store at start and
when a reload changes the model or bundle, fed every accepted label, and, with a shared store
(PostgreSQL), re-read every ``labels.fleet_refresh_seconds`` so that they hold every replica's labels.

They give each window of ``GET /v1/estimates`` its ``realized`` section, Prometheus the realized
metrics of :mod:`exporters.label_metrics`, and each time window the labeled-sample sums behind the
estimator ``with_labels`` (:meth:`RealizedTracker.labeled_sums`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agent.config.settings import AgentSettings
from agent.estimation.segments.realized import SegmentLabels
from agent.estimation.statistics.window import WindowStats
from agent.judging.runtime import Runtime
from agent.labels.intake import CurrentRuntime
from agent.labels.realized import RealizedWindow, RealizedWindows
from agent.labels.rows import LabeledRows, LabelOutcome
from agent.labels.store import PredictionStore, StoreUnavailable
from exporters.label_metrics import RealizedPoint, RealizedSnapshot

log = logging.getLogger("icos_agent.labels")


class RealizedTracker:
    """The realized windows of the current model and bundle (thread-safe)."""

    def __init__(self, settings: AgentSettings, store: PredictionStore, runtimes: CurrentRuntime) -> None:
        self.config = settings.labels
        self.per_class_cap = settings.metrics.per_class_label_cap
        self.store = store
        self.runtimes = runtimes
        self.windows = RealizedWindows(
            settings.window_seconds, settings.windows.count, self.config.max_predictions, self.config.max_source_share
        )
        self.identity = runtimes.current.identity
        self._fleet_read = 0.0  # monotonic time the windows last re-read a shared store
        #: Whether the tracker runs (``labels.enabled`` and started with the agent).
        self.started = False

    def open(self) -> None:
        """Fill the windows from the store (called once the store is open)."""
        self.identity = self.runtimes.current.identity
        self.windows.reset(self._labeled(self.identity))
        self._fleet_read = time.monotonic()
        self.started = True

    def follow(self, rt: Runtime) -> None:
        """A reload to another model or bundle restarts the windows with that one's labels."""
        if rt.identity != self.identity:
            self.identity = rt.identity
            self.windows.reset(self._labeled(rt.identity))

    def add_accepted(self, outcome: LabelOutcome) -> None:
        """Newly labeled predictions of the current model join the windows; a correction re-reads them
        from the store (the corrected label replaces the older one there)."""
        if outcome.corrected:
            self.reload()
            return
        for identity, rows in outcome.accepted:
            if identity == self.identity:
                self.windows.add(rows)

    def reload(self) -> None:
        """Refill the windows from the store (after labels were corrected or dropped)."""
        self.windows.reset(self._window_rows_or_empty(self.identity))

    def fleet_due(self) -> bool:
        """With a shared store: whether the windows are due to re-read the fleet's labels."""
        return self.store.shared and time.monotonic() - self._fleet_read >= self.config.fleet_refresh_seconds

    def read_fleet_labels(self) -> None:
        """Refill the windows from the shared store: the labels every replica received."""
        self._fleet_read = time.monotonic()
        try:
            rows = self._window_rows(self.identity)
        except StoreUnavailable as exc:
            log.warning("re-reading the fleet's labels failed; realized windows wait", extra={"error": str(exc)})
            return
        self.windows.reset(rows)

    def _window_rows_or_empty(self, identity: str) -> LabeledRows:
        try:
            return self._window_rows(identity)
        except StoreUnavailable:
            return LabeledRows.empty()

    def _labeled(self, identity: str) -> LabeledRows:
        try:
            return self.store.labeled_rows(identity, limit=self.config.max_predictions)
        except StoreUnavailable:
            return LabeledRows.empty()

    def _window_rows(self, identity: str) -> LabeledRows:
        """The labeled predictions the windows can hold, and no more: those of the longest time window,
        or the newest ``windows.count`` when these are more (each at most ``max_predictions``)."""
        cap = self.config.max_predictions
        longest = max(self.windows.time.values(), default=None)
        count = self.windows.count or 0
        if longest is not None:
            rows = self.store.labeled_rows(identity, since=time.time() - longest, limit=cap)
            if rows.n >= min(count, cap):
                return rows  # the newest `count` are among them
        return self.store.labeled_rows(identity, limit=min(count, cap) if count else cap)

    # -- read side ----------------------------------------------------------------------------------
    def realized(self, rt: Runtime, now: float) -> dict[str, RealizedWindow | None]:
        """The realized windows of ``rt``, per-class figures included (per class up to the class cap)."""
        per_class = len(rt.classes) <= self.per_class_cap
        return self.windows.compute(rt.calibration, now, rt.classes, per_class=per_class)

    def labeled_sums(self, rt: Runtime, now: float) -> dict[str, WindowStats]:
        """Per time window, the ``lab_*`` sums of its labeled predictions of the labeling sample (what
        the estimator ``with_labels`` adds to the window's statistics)."""
        per_class = len(rt.classes) <= self.per_class_cap
        return self.windows.labeled_sums(rt.calibration, now, rt.classes, per_class=per_class)

    def segment_labels(self, rt: Runtime, now: float) -> dict[str, SegmentLabels]:
        """Per time window, the labels of its labeling sample per segment (every segment's realized accuracy)."""
        per_class = len(rt.classes) <= self.per_class_cap
        return self.windows.segment_labels(rt.calibration, now, rt.classes, per_class=per_class)

    def section(self, rt: Runtime, now: float) -> dict[str, dict[str, Any]]:
        """``/v1/estimates``: the ``realized`` section of every window."""
        return {
            name: {"realized": w.to_dict() if w is not None else {"n": 0}} for name, w in self.realized(rt, now).items()
        }

    def snapshot(self) -> RealizedSnapshot | None:
        """What the realized collector exports at a scrape (nothing before the tracker runs)."""
        if not self.started:
            return None
        rt = self.runtimes.current
        points = []
        for name, w in self.realized(rt, time.time()).items():
            if w is None:
                points.append(RealizedPoint(name, 0, 0.0))
            else:
                points.append(
                    RealizedPoint(
                        name,
                        w.n,
                        w.accuracy.value,
                        w.abs_errors,
                        w.probability_errors.to_dict(),
                        w.classes,
                        w.none_share,
                        w.capped,
                    )
                )
        return RealizedSnapshot(rt.name, rt.version, points)
