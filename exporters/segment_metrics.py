"""Prometheus families of the segments fixed at fit (docs/diagnosis.md): per window and segment its estimated
accuracy, share and contribution to the drop, and its reference accuracy; the same families under
``icos_fleet_`` for the fleet evaluator. Bounded: segment labels are fixed at fit (``fit --max-segments``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric


@dataclass(frozen=True)
class SegmentPoint:
    """One segment of one window (``segment``: its label, fixed at fit): its share of the window's
    predictions, its contribution to the window's drop, its estimated accuracy (None: no prediction in it)
    and its reference accuracy."""

    window: str
    kind: str
    segment: str
    share: float
    contribution: float
    estimate: float | None
    reference_accuracy: float
    #: how far its inputs moved from its reference, label-free (0: unchanged), and the column that moved most
    change_score: float = 0.0
    change_column: str = ""
    #: the window's change is across the traffic, in no one segment (the same on every point of a window)
    widespread: bool = False


def segment_families(prefix: str, rows: Iterable[tuple[Sequence[str], SegmentPoint]], what: str) -> list[Metric]:
    """``<prefix>segment_estimated_accuracy_ratio``, ``<prefix>segment_share_ratio`` and
    ``<prefix>segment_contribution_ratio`` labelled ``model, version, window, kind, segment``, and
    ``<prefix>segment_reference_accuracy_ratio`` labelled ``model, version, kind, segment``, and
    ``<prefix>segment_change_score`` labelled ``model, version, window, kind, segment, column``: one row per
    ``([model, version], point)``; and ``<prefix>segment_change_widespread`` labelled ``model, version, window``,
    one per window; ``what`` says whose windows, in the help texts."""
    labels = ["model", "version", "window", "kind", "segment"]
    estimate = GaugeMetricFamily(
        f"{prefix}segment_estimated_accuracy_ratio", f"Estimated accuracy of the segment {what}.", labels=labels
    )
    share = GaugeMetricFamily(
        f"{prefix}segment_share_ratio", f"Share of the predictions {what} in the segment.", labels=labels
    )
    contribution = GaugeMetricFamily(
        f"{prefix}segment_contribution_ratio",
        f"Accuracy the segment lost against its reference, times its share {what} (beyond noise; "
        "the segments of one dimension add up to the drop, less the change of mix).",
        labels=labels,
    )
    reference = GaugeMetricFamily(
        f"{prefix}segment_reference_accuracy_ratio",
        "Accuracy of the segment on the bundle's validation data (fixed at fit).",
        labels=["model", "version", "kind", "segment"],
    )
    change = GaugeMetricFamily(
        f"{prefix}segment_change_score",
        f"How far the inputs of the segment moved from its own at fit {what}, label-free (per-row effect in "
        "reference standard deviations; 0: no change beyond noise); column: the input that moved most.",
        labels=[*labels, "column"],
    )
    across = GaugeMetricFamily(
        f"{prefix}segment_change_widespread",
        f"1 when the change {what} is across the traffic, in no one segment: in every dimension, segments whose "
        "inputs changed hold half its predictions or more; else 0.",
        labels=["model", "version", "window"],
    )
    seen: set[tuple[str, ...]] = set()
    windows: set[tuple[str, ...]] = set()
    for mv, p in rows:
        lv = [*mv, p.window, p.kind, p.segment]
        if (*mv, p.window) not in windows:
            windows.add((*mv, p.window))
            across.add_metric([*mv, p.window], 1.0 if p.widespread else 0.0)
        share.add_metric(lv, p.share)
        contribution.add_metric(lv, p.contribution)
        change.add_metric([*lv, p.change_column], p.change_score)
        if p.estimate is not None:
            estimate.add_metric(lv, p.estimate)
        key = (*mv, p.kind, p.segment)
        if key not in seen:
            seen.add(key)
            reference.add_metric(list(key), p.reference_accuracy)
    return [estimate, share, contribution, reference, change, across]
