"""The one rendering of estimates, whoever serves them: an agent's ``GET /v1/estimates``, the fleet
evaluator's, ``icos-agent check --json`` and the scrape-time snapshot behind the ``icos_estimated_*``
and ``icos_fleet_*`` metrics — so that a fleet user reads what a single-agent user reads, and the JSON
and the metrics never disagree.

A window is estimated once (:func:`window_entry`: every estimator, the trust signal and the headline
from one :func:`~agent.estimation.estimators.estimate_window` call, and CBPE's label-free per-class
figures from the same statistics) and rendered from that entry: :meth:`WindowEntry.to_json` for the
documents, :func:`snapshot_points` for the metrics. An estimate reads the same everywhere
(:func:`estimate_json`): marked ``unreliable`` with the reason when it says too little to be read as a
number (:mod:`agent.estimation.reliability`), and, in the documents served over HTTP, rounded to six
decimals for the person reading them (``check --json`` keeps every digit: programs compute from it).
What the bundle says about every window (the headline estimator and the evidence for it, the oracle's
TPR/FPR, the reference accuracy) is :func:`bundle_json`. What only one server knows (an agent's
realized windows of delayed labels, the fleet's replicas per window) is added to a window as a
section of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.class_metrics import window_class_metrics
from agent.estimation.estimators import WindowEstimates, estimate_window, headline_of
from agent.estimation.evidence import evidence_section
from agent.estimation.intervals import Estimate
from agent.estimation.reliability import unreliable
from agent.estimation.segment_table import SegmentTable, segment_table
from agent.estimation.statistics import WindowStats
from agent.estimation.trust import Trust
from exporters.prometheus import EstimatePoint, SegmentPoint, WindowPoint

#: Decimals of an estimate in the documents served over HTTP (a person reads them; the metrics and
#: ``check --json`` keep every digit).
DECIMALS = 6


def estimate_json(
    name: str, e: Estimate, calibration: EstimatorCalibration, *, decimals: int | None = DECIMALS
) -> dict[str, Any]:
    """Estimator ``name``'s estimate ``e``: its fields rounded to ``decimals`` (None: every digit), marked
    ``unreliable`` (with the reason) when it says too little to be read as a number."""
    d: dict[str, Any] = {
        k: round(v, decimals) if decimals is not None and isinstance(v, float) else v for k, v in e.to_dict().items()
    }
    why = unreliable(name, e, calibration)
    if why is not None:
        d["unreliable"] = why
    return d


def estimates_json(
    estimates: Mapping[str, Estimate], calibration: EstimatorCalibration, *, decimals: int | None = DECIMALS
) -> dict[str, dict[str, Any]]:
    """Every estimator's estimate (:func:`estimate_json`), in the registry's order."""
    return {k: estimate_json(k, e, calibration, decimals=decimals) for k, e in estimates.items()}


def headline_json(headline: tuple[str, Estimate]) -> dict[str, Any]:
    """A window's headline: the estimator that gave it and its estimate (every digit, as the
    ``*_headline_accuracy_ratio`` metrics export it)."""
    return {"estimator": headline[0], **headline[1].to_dict()}


def trust_json(trust: Trust) -> dict[str, Any]:
    """Where the window lies relative to the headline's calibration windows."""
    return dict(trust.to_dict())


@dataclass(frozen=True)
class WindowEntry:
    """One window estimated once: its statistics, every estimate and the trust signal, its headline and
    its label-free per-class figures."""

    name: str
    window: WindowEstimates
    #: CBPE's per-class figures (None: the window has none, or the model's classes are unknown)
    classes: dict[str, Any] | None
    #: the headline estimator and its estimate (None for an empty window)
    headline: tuple[str, Estimate] | None
    #: the window's segments ranked by their contribution to its drop (None: the bundle has none)
    segments: SegmentTable | None = None

    @property
    def stats(self) -> WindowStats:
        return self.window.stats

    @property
    def estimates(self) -> dict[str, Estimate]:
        return self.window.estimates

    @property
    def trust(self) -> Trust | None:
        return self.window.trust

    def to_json(self, calibration: EstimatorCalibration, sections: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The window in ``/v1/estimates``; ``sections`` (e.g. ``realized``, ``replicas``) added last."""
        stats = self.stats
        out: dict[str, Any] = {
            "n": stats.n,
            "fails": stats.fails,
            "n_labels": stats.lab_n,
            "fails_by_family": dict(stats.fails_by_family),
            "estimates": estimates_json(self.estimates, calibration),
        }
        if self.headline is not None:
            out["headline"] = headline_json(self.headline)
        if self.trust is not None:
            out["trust"] = trust_json(self.trust)
        if self.classes is not None:
            out["classes"] = {"estimated": self.classes}
        if self.segments is not None:
            out.update(segments_json(self.segments))
        out.update(sections or {})
        return out


def segments_json(table: SegmentTable, *, decimals: int | None = DECIMALS) -> dict[str, Any]:
    """A window's ``segments`` (ranked by contribution, largest first) and ``segment_drop`` (each dimension's
    mix and within parts, :mod:`agent.estimation.segment_table`)."""
    return {"segments": table.rows_json(decimals), "segment_drop": table.drop_json(decimals)}


def window_entry(
    name: str,
    stats: WindowStats,
    calibration: EstimatorCalibration,
    headline: str,
    classes: Sequence[str] = (),
    *,
    per_class_cap: int,
) -> WindowEntry:
    """Window ``name`` estimated from ``stats`` with the bundle's ``calibration``; its headline is
    ``headline`` (or the fallback of :func:`~agent.estimation.estimators.headline_of`); CBPE's figures
    per class of ``classes`` (per class only up to ``per_class_cap`` classes, macro and weighted always;
    a labeled sample's sums added to ``stats`` change none of them)."""
    window = estimate_window(stats, calibration)
    figures = window_class_metrics(
        stats.cbpe_predicted,
        stats.cbpe_true_positive,
        stats.cbpe_support,
        classes,
        per_class=len(classes) <= per_class_cap,
    )
    segments = segment_table(stats, calibration, window.estimates)
    return WindowEntry(name, window, figures, headline_of(window.estimates, headline), segments)


def bundle_json(headline: str, calibration: EstimatorCalibration) -> dict[str, Any]:
    """What the bundle says about every window: the headline estimator and the evidence it was chosen
    on, the oracle's TPR/FPR on the calibration split and the model's accuracy there (what the relative
    alerts compare the headline with, ``icos_reference_accuracy_ratio``)."""
    return {
        "headline": headline,
        **evidence_section(calibration.headline, shift_aware=calibration.shift is not None),
        "oracle": {"tpr": calibration.tpr, "fpr": calibration.fpr},
        "reference": {"accuracy": calibration.accuracy},
    }


@dataclass(frozen=True)
class SnapshotPoints:
    """The windows as the estimates collectors export them."""

    estimates: list[EstimatePoint]
    headline: list[EstimatePoint]
    windows: list[WindowPoint]
    segments: list[SegmentPoint]


def _point(estimator: str, window: str, e: Estimate) -> EstimatePoint:
    return EstimatePoint(estimator, window, e.value, e.lower, e.upper, e.n)


def segment_points(entry: WindowEntry) -> list[SegmentPoint]:
    """The window's segments as the ``*_segment_*`` metrics export them (segments without a prediction in
    the window: their share only)."""
    if entry.segments is None:
        return []
    return [
        SegmentPoint(
            entry.name,
            row.kind,
            row.label,
            row.share,
            row.contribution,
            row.estimate.value if row.estimate is not None else None,
            row.reference_accuracy,
        )
        for row in entry.segments.rows
    ]


def snapshot_points(entries: Iterable[WindowEntry]) -> SnapshotPoints:
    """Every estimate, every headline, every window's counts, trust distance and per-class figures, and every
    segment's figures."""
    out = SnapshotPoints([], [], [], [])
    for entry in entries:
        out.segments.extend(segment_points(entry))
        trust = entry.trust
        stats = entry.stats
        out.windows.append(
            WindowPoint(
                entry.name,
                stats.n,
                dict(stats.fails_by_family),
                trust.distance if trust is not None else None,
                entry.classes,
            )
        )
        out.estimates.extend(_point(est, entry.name, e) for est, e in entry.estimates.items())
        if entry.headline is not None:
            out.headline.append(_point(entry.headline[0], entry.name, entry.headline[1]))
    return out
