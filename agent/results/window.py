"""The one rendering of estimates, whoever serves them: an agent's ``GET /v1/estimates``, the fleet
evaluator's, ``icos-agent check --json`` and the scrape-time snapshot behind the ``icos_estimated_*``
and ``icos_fleet_*`` metrics — so that a fleet user reads what a single-agent user reads, and the JSON
and the metrics never disagree.

A window is estimated once (:func:`window_entry`: every estimator, the trust signal and the headline
from one :func:`~agent.estimation.estimators.estimate_window` call, the flag "this number may be wrong"
on them (:func:`~agent.estimation.assessment.assess`: ``trust`` with ``calibrated`` and ``reasons``, the
headline's interval widened where the flag is raised), and CBPE's label-free per-class figures from the
same statistics) and rendered from that entry: :meth:`WindowEntry.to_json` for the
documents, :func:`snapshot_points` for the metrics. An estimate reads the same everywhere
(:func:`estimate_json`): marked ``unreliable`` with the reason when it says too little to be read as a
number (:mod:`agent.estimation.reliability`), and, in the documents served over HTTP, rounded to six
decimals for the person reading them (``check --json`` keeps every digit: programs compute from it).
What the bundle says about every window (the headline estimator and the evidence for it, the oracle's
TPR/FPR, the reference accuracy) is :func:`bundle_json`. What only one server knows (an agent's
realized windows of delayed labels, the fleet's replicas per window) is added to a window as a
section of its own. A challenger's comparison with the champion on the same requests is estimated once per
window too (:func:`paired_entry`) and rendered as the ``challenger`` section (:func:`challenger_json`) and as
the ``icos_challenger_*`` metrics (:func:`paired_points`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.estimation.assessment import Assessment, assess
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.class_metrics import window_class_metrics
from agent.estimation.estimators import WindowEstimates, estimate_window, headline_of
from agent.estimation.evidence import evidence_section
from agent.estimation.intervals import Estimate
from agent.estimation.pair_calibration import PairCalibration
from agent.estimation.paired import Difference, PairSums, best_of, differences
from agent.estimation.reliability import unreliable
from agent.estimation.segment_table import SegmentTable, segment_table
from agent.estimation.statistics import WindowStats
from agent.estimation.trust import Trust
from exporters.challenger_metrics import PairedPoint
from exporters.prometheus import EstimatePoint, WindowPoint
from exporters.segment_metrics import SegmentPoint

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


def headline_json(headline: tuple[str, Estimate], assessment: Assessment | None = None) -> dict[str, Any]:
    """A window's headline: the estimator that gave it and its estimate (every digit, as the
    ``*_headline_accuracy_ratio`` metrics export it; its interval widened where the flag is raised), and
    what the flag says of it (:meth:`~agent.estimation.assessment.Assessment.headline_dict`)."""
    return {"estimator": headline[0], **headline[1].to_dict(), **(assessment.headline_dict() if assessment else {})}


def trust_json(assessment: Assessment) -> dict[str, Any]:
    """Is the window's number right: the flag (``calibrated``, ``reasons``) and the evidence it rests on."""
    return assessment.to_dict()


def flag_sections(window: WindowEstimates, headline: str, calibration: EstimatorCalibration) -> dict[str, Any]:
    """What ``check`` reports of the flag on its data: ``headline_estimate`` (the headline's estimate, its
    interval widened where the flag is raised, and ``calibrated``) and ``trust`` (absent for a bundle with
    neither a flag nor a trust model)."""
    head = headline_of(window.estimates, headline)
    assessment = assess(window, head, calibration)
    if assessment is not None and assessment.headline is not None:
        head = assessment.headline
    out: dict[str, Any] = {}
    if head is not None:
        out["headline_estimate"] = headline_json(head, assessment)
    if assessment is not None:
        out["trust"] = trust_json(assessment)
    return out


@dataclass(frozen=True)
class WindowEntry:
    """One window estimated once: its statistics, every estimate and the trust signal, its headline (its
    interval widened where the flag is raised), the flag and its label-free per-class figures."""

    name: str
    window: WindowEstimates
    #: CBPE's per-class figures (None: the window has none, or the model's classes are unknown)
    classes: dict[str, Any] | None
    #: the headline estimator and its estimate (None for an empty window)
    headline: tuple[str, Estimate] | None
    #: the flag on the window (None: an empty window, or a bundle with neither a flag nor a trust model)
    assessment: Assessment | None = None
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
            out["headline"] = headline_json(self.headline, self.assessment)
        if self.assessment is not None:
            out["trust"] = trust_json(self.assessment)
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
    head = headline_of(window.estimates, headline)
    assessment = assess(window, head, calibration)
    if assessment is not None:
        head = assessment.headline
    segments = segment_table(stats, calibration, window.estimates)
    return WindowEntry(name, window, figures, head, assessment, segments)


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
    """Every estimate, every headline, every window's counts, trust distance, flag and per-class figures,
    and every segment's figures."""
    out = SnapshotPoints([], [], [], [])
    for entry in entries:
        out.segments.extend(segment_points(entry))
        trust = entry.trust
        stats = entry.stats
        a = entry.assessment
        out.windows.append(
            WindowPoint(
                entry.name,
                stats.n,
                dict(stats.fails_by_family),
                trust.distance if trust is not None else None,
                entry.classes,
                flagged=None if a is None else not a.calibrated,
                flag_reason=None if a is None else (a.reasons[0] if a.reasons else "none"),
            )
        )
        out.estimates.extend(_point(est, entry.name, e) for est, e in entry.estimates.items())
        if entry.headline is not None:
            out.headline.append(_point(entry.headline[0], entry.name, entry.headline[1]))
    return out


# -- a challenger beside the champion ---------------------------------------------------------------------


@dataclass(frozen=True)
class PairedModel:
    """One version of a pair as its window is estimated: its bundle's calibration and headline estimator."""

    calibration: EstimatorCalibration
    headline: str


@dataclass(frozen=True)
class PairedEntry:
    """One window of paired predictions estimated once: the pair's sums, every difference, and each version's
    headline on the paired predictions (None where only the pair's sums are known: the fleet)."""

    name: str
    pair: PairSums
    differences: dict[str, Difference]
    champion: tuple[str, Estimate] | None = None
    challenger: tuple[str, Estimate] | None = None
    #: why the label-free difference should not be read as a number (None: it can be)
    label_free_caveat: str | None = None

    def difference_json(self, name: str, d: Difference, decimals: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: round(v, decimals) if decimals is not None and isinstance(v, float) else v
            for k, v in d.to_dict().items()
        }
        if name == "label_free" and self.label_free_caveat is not None:
            out["unreliable"] = self.label_free_caveat
        return out

    def to_json(self, *, decimals: int | None = DECIMALS) -> dict[str, Any]:
        """The window in a ``challenger`` section: the paired predictions and their agreement, the difference
        reported first (``difference``: labeled when the window has labeled disagreements) and every one, and
        each version's headline."""
        out: dict[str, Any] = {
            "n": self.pair.n,
            "disagreements": self.pair.n_dis,
            "agreement": round(self.pair.agreement, decimals) if decimals is not None else self.pair.agreement,
        }
        best = best_of(self.differences)
        if best is not None:
            out["difference"] = {"estimator": best[0], **self.difference_json(*best, decimals)}
        out["differences"] = {k: self.difference_json(k, d, decimals) for k, d in self.differences.items()}
        for role, headline in (("champion", self.champion), ("challenger", self.challenger)):
            if headline is not None:
                out[role] = headline_json(headline)
        return out


def _caveat(pair: PairCalibration) -> str | None:
    if pair.corrupted_sets > 0:
        return None
    return (
        "the pair was calibrated on clean rows only (no model to corrupt inputs for): under a covariate shift "
        "its interval may not hold; labels drawn on the disagreements settle it"
    )


def paired_entry(
    name: str,
    pair: PairSums,
    calibration: PairCalibration,
    champion: tuple[WindowStats, PairedModel] | None = None,
    challenger: tuple[WindowStats, PairedModel] | None = None,
) -> PairedEntry:
    """Window ``name`` of paired predictions estimated from the pair's sums (labeled ones included) with the
    pair's ``calibration``, and each version's headline from its statistics on the paired predictions."""

    def headline(side: tuple[WindowStats, PairedModel] | None) -> tuple[str, Estimate] | None:
        if side is None or side[0].n == 0:
            return None
        stats, model = side
        return headline_of(estimate_window(stats, model.calibration).estimates, model.headline)

    return PairedEntry(
        name, pair, differences(pair, calibration), headline(champion), headline(challenger), _caveat(calibration)
    )


def challenger_json(
    info: Mapping[str, Any], entries: Iterable[PairedEntry], *, decimals: int | None = DECIMALS
) -> dict[str, Any]:
    """The ``challenger`` section of ``/v1/estimates``: what the challenger is (``info``) and every window."""
    return {**info, "windows": {e.name: e.to_json(decimals=decimals) for e in entries}}


def paired_points(entries: Iterable[PairedEntry]) -> list[PairedPoint]:
    """Every window as the ``icos_challenger_*`` collectors export it."""
    out = []
    for e in entries:
        diffs = [EstimatePoint(k, e.name, d.value, d.lower, d.upper, d.n) for k, d in e.differences.items()]
        sides = [_point(h[0], e.name, h[1]) if h is not None else None for h in (e.champion, e.challenger)]
        out.append(PairedPoint(e.name, e.pair.n, e.pair.agreement, diffs, sides[0], sides[1]))
    return out
