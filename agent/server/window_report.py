"""What an agent reports about its windows: one report per read (:meth:`WindowReport.windows_of`),
rendered twice — as the ``GET /v1/estimates`` document and as the scrape-time snapshot behind
``icos_estimated_*`` (:class:`exporters.prometheus.EstimatesCollector`) — by the one rendering the
fleet evaluator and ``check`` use too (:mod:`agent.results`), so that the JSON and the
metrics never disagree.

Each window's estimates come from one call into :mod:`agent.estimation`
(:func:`~agent.results.window.window_entry`): the window's statistics, plus, for time
windows, the labeled-sample sums of the delayed labels (so ``with_labels`` is one registered
estimator among the others), give every estimator's estimate and the trust signal; the label-free
per-class figures (CBPE) come from the same statistics. Each window's headline (the bundle's headline
estimator, or ``doc`` where it cannot estimate the window:
:func:`~agent.estimation.estimators.registry.headline_of`) is reported under ``headline`` in the JSON and as
``icos_headline_accuracy_ratio`` with the estimator that gave it. Sections (e.g. ``realized`` from
delayed labels) are added to the JSON only, and so are the companions' top-level sections (a challenger's
comparison with the champion, ``challenger``: :mod:`agent.dataplane.challenger`) and every segment's
realized accuracy from the labeling sample's labels, stored with their segment numbers
(:meth:`agent.labels.realized.RealizedWindows.segment_labels`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.estimation.segments.realized import SegmentLabels, with_realized
from agent.estimation.segments.table import SegmentRow
from agent.estimation.statistics.window import WindowStats
from agent.judging.companions import Companion
from agent.judging.runtime import Runtime
from agent.judging.windows import WindowSet
from agent.results.bundle import BundleSection
from agent.results.window import WindowEntry, estimates_snapshot, window_entry
from exporters.prometheus import Snapshot

#: An extra per-window section of ``/v1/estimates``: ``(runtime, now)`` → ``{window: {section: value}}``.
EstimateSection = Callable[[Runtime, float], Mapping[str, Mapping[str, Any]]]
#: Per window, statistics a report adds before estimating (the labeled-sample sums of ``with_labels``).
AddedStats = Callable[[Runtime, float], Mapping[str, WindowStats]]
#: Per window, the labeling sample's labels by segment (each segment's realized accuracy).
SegmentLabelsOf = Callable[[Runtime, float], Mapping[str, SegmentLabels]]
#: Told the segment rows of the first window with segments at every report (the labels follow its changes).
SegmentsSeen = Callable[[object, Sequence[SegmentRow]], None]


def _no_stats(_rt: Runtime, _now: float) -> Mapping[str, WindowStats]:
    return {}


def _no_section(_rt: Runtime, _now: float) -> Mapping[str, Mapping[str, Any]]:
    return {}


def _no_segment_labels(_rt: Runtime, _now: float) -> Mapping[str, SegmentLabels]:
    return {}


def _ignore_segments(_calibration: object, _rows: Sequence[SegmentRow]) -> None:
    return None


class WindowReport:
    """Reports on ``windows``, with the ``labeled`` sums added to their statistics, the ``section``
    of the JSON and the ``companions``' sections."""

    def __init__(
        self,
        windows: WindowSet,
        *,
        labeled: AddedStats = _no_stats,
        section: EstimateSection = _no_section,
        segment_labels: SegmentLabelsOf = _no_segment_labels,
        per_class_cap: int,
        companions: Sequence[Companion] = (),
        segments_seen: SegmentsSeen = _ignore_segments,
    ) -> None:
        self.windows = windows
        self.labeled = labeled
        self.section = section
        self.segment_labels = segment_labels
        self.per_class_cap = per_class_cap
        self.companions = tuple(companions)
        self.segments_seen = segments_seen

    def windows_of(self, rt: Runtime, now: float) -> list[WindowEntry]:
        """Every window's statistics estimated once (see the module docstring)."""
        added = self.labeled(rt, now)
        by_segment = self.segment_labels(rt, now)
        out = []
        for name, stats in self.windows.stats(rt.calibration, now).items():
            extra = added.get(name)
            total = stats + extra if extra is not None else stats
            entry = window_entry(name, total, rt.calibration, rt.headline, rt.classes, per_class_cap=self.per_class_cap)
            labels = by_segment.get(name)
            if entry.segments is not None and labels is not None:
                entry = dataclasses.replace(entry, segments=with_realized(entry.segments, labels))
            out.append(entry)
        first = next((e.segments for e in out if e.segments is not None), None)
        if first is not None:
            self.segments_seen(rt.calibration, first.rows)
        return out

    def document(self, rt: Runtime, now: float) -> dict[str, Any]:
        """The ``GET /v1/estimates`` body."""
        sections = self.section(rt, now)
        doc = {
            "model": {"name": rt.name, "version": rt.version, "sha256": rt.model_sha256},
            **BundleSection(rt.headline, rt.calibration).to_json(),
            "total_judged": self.windows.total,
            "windows": {
                entry.name: entry.to_json(rt.calibration, sections.get(entry.name))
                for entry in self.windows_of(rt, now)
            },
            "timestamp": now,
        }
        for companion in self.companions:
            doc.update(companion.sections(rt, now))
        return doc

    def snapshot(self, rt: Runtime, now: float) -> Snapshot:
        """What the estimates collector exports at a scrape."""
        bundle = BundleSection(rt.headline, rt.calibration)
        return estimates_snapshot(rt.name, rt.version, self.windows_of(rt, now), bundle)
