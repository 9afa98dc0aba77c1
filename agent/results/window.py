"""A window's estimates as a result, whoever serves them: an agent's ``GET /v1/estimates``, the fleet
evaluator's, ``icos-agent check`` and the scrape-time snapshot behind the ``icos_estimated_*`` and
``icos_fleet_*`` metrics — so that a fleet user reads what a single-agent user reads, and the JSON and the
metrics never disagree.

A window is estimated once (:func:`window_entry`: every estimator, the trust signal and the headline from
one :func:`~agent.estimation.estimators.registry.estimate_window` call, the flag "this number may be wrong" on them
(:func:`~agent.estimation.flag.assessment.assess`: ``flag`` with ``raised`` and ``reasons``, the headline's
interval widened where the flag is raised), CBPE's label-free per-class figures from the same statistics,
and its segment table) and renders itself from that entry: :meth:`WindowEntry.to_json` for the documents,
:meth:`WindowEntry.points` for the metrics, :meth:`WindowEntry.to_text` for the lines ``check`` prints,
:meth:`WindowEntry.to_row` for one flat row. An estimate reads the same everywhere
(:mod:`agent.results.estimate`). What the bundle says about every window is
:class:`~agent.results.bundle.BundleSection`; what only one server knows (an agent's realized windows of
delayed labels, the fleet's replicas per window) is added to a window as a section of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import WindowEstimates, estimate_window, headline_of
from agent.estimation.estimators.trust import Trust
from agent.estimation.flag.assessment import Assessment, assess
from agent.estimation.intervals import Estimate
from agent.estimation.segments.table import SegmentTable, segment_table
from agent.estimation.statistics.class_metrics import window_class_metrics
from agent.estimation.statistics.window import WindowStats
from agent.results.bundle import BundleSection
from agent.results.estimate import estimate_point, estimate_row, estimates_json, headline_json
from agent.results.segments import SegmentResult, segment_lines
from exporters.prometheus import EstimatePoint, Snapshot, WindowPoint
from exporters.segment_metrics import SegmentPoint


def flag_json(assessment: Assessment) -> dict[str, Any]:
    """Is the window's number right: ``flag`` (``raised``, ``reasons`` and the evidence it rests on) and, until
    :data:`~agent.estimation.flag.assessment.TRUST_REMOVED_IN`, the same under its deprecated name ``trust``
    (``calibrated``: not raised)."""
    return {"flag": assessment.to_dict(), "trust": assessment.trust_dict()}


def flag_sections(window: WindowEstimates, headline: str, calibration: EstimatorCalibration) -> dict[str, Any]:
    """What ``check`` reports of the flag on its data: ``headline_estimate`` (the headline's estimate, its
    interval widened where the flag is raised, and ``flag_raised``) and ``flag`` with its deprecated alias
    ``trust`` (absent for a bundle with neither a flag nor a trust model)."""
    head = headline_of(window.estimates, headline)
    assessment = assess(window, head, calibration)
    if assessment is not None and assessment.headline is not None:
        head = assessment.headline
    out: dict[str, Any] = {}
    if head is not None:
        out["headline_estimate"] = headline_json(head, assessment)
    if assessment is not None:
        out.update(flag_json(assessment))
    return out


def estimate_lines(
    estimates: Mapping[str, Mapping[str, Any]], headline: str | None, errors: Mapping[str, float] | None = None
) -> list[str]:
    """Every estimate of a document's ``estimates``, the ``headline`` estimator's first and marked, with its
    absolute error where ``errors`` (the truth is known) are given."""
    lines = [f"{'estimator':<16}{'estimate':>9}{'95% interval':>18}" + ("  abs error" if errors is not None else "")]
    for name, e in sorted(estimates.items(), key=lambda kv: kv[0] != headline):  # headline first
        mark = " *" if name == headline else ""
        row = f"{name + mark:<16}{e['value']:>9.3f}   [{e['lower']:.3f}, {e['upper']:.3f}]"
        if errors is not None:
            row += f"{errors[name]:>11.3f}"
        if "n_labels" in e:
            row += f"  ({e['n_labels']} labels)"
        if "unreliable" in e:
            row += f"  unreliable: {e['unreliable']}"
        lines.append(row)
    return lines


def class_lines(classes: object) -> list[str]:
    """A document's ``classes``: the macro and weighted F1 (and ROC AUC) of each kind it holds."""
    if not isinstance(classes, dict):
        return []
    lines = []
    for kind in ("estimated", "realized", "with_labels"):
        block = classes.get(kind)
        if isinstance(block, dict):
            macro, weighted = block["macro"], block["weighted"]
            auc = f"  ROC AUC {block['roc_auc']:.4f}" if block.get("roc_auc") is not None else ""
            caveat = (
                "  (label-free: the expected F1 if the model's probabilities are calibrated)"
                if kind == "estimated"
                else ""
            )
            lines.append(f"F1 {kind}: macro {macro['f1']:.3f}  weighted {weighted['f1']:.3f}{auc}{caveat}")
    return lines


def flag_lines(flag: object, head: object) -> list[str]:
    """Is the headline right, from a document's ``flag`` and headline: the flag (raised, with its reasons and
    the widened interval, or down), and the trust distance it rests on."""
    if not isinstance(flag, dict):
        return []
    lines = []
    reasons = [str(r).replace("_", " ") for r in flag.get("reasons", [])]
    if flag.get("basis") == "flag":
        if flag["raised"] and isinstance(head, dict):
            own = head.get("own_interval")
            interval = f"[{head['lower']:.3f}, {head['upper']:.3f}]"
            widened = (
                f"its interval is widened to {interval} (its own [{own['lower']:.3f}, {own['upper']:.3f}])"
                if own
                else f"its own interval {interval} is already as wide as the flag asks"
            )
            lines.append(
                f"FLAG RAISED: the headline may be off by more than {flag['tolerance']:.2f} (estimated probability "
                f"{flag['probability']:.0%}): {', '.join(reasons)}; {widened}"
            )
        else:
            text = (
                f"flag down: the headline is expected within {flag['tolerance']:.2f} of the truth (estimated "
                f"probability of a larger error {flag['probability']:.0%})"
            )
            if "class_mix" in flag and flag["class_mix"].get("only"):
                text += "; the class mix changed and nothing else did (label shift): confidence-based estimates hold"
            lines.append(text + (f"; notes: {', '.join(reasons)}" if reasons else ""))
    if "distance" in flag:
        where = "inside" if flag["in_calibrated_range"] else "outside"
        lines.append(
            f"trust: distance {flag['distance']:.2f} ({where} the calibrated range; "
            f"{flag['weight']:.0%} of the learnt correction used)"
        )
    if flag.get("basis") != "flag" and flag.get("note"):
        lines.append(f"note: {flag['note']}")
    return lines


@dataclass(frozen=True)
class WindowPoints:
    """One window as the estimates collectors export it."""

    estimates: list[EstimatePoint]
    #: the headline estimate (None for an empty window)
    headline: EstimatePoint | None
    window: WindowPoint
    segments: list[SegmentPoint]


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

    @property
    def segment_result(self) -> SegmentResult | None:
        """The window's segment table as a result (None: the bundle has no segments)."""
        return None if self.segments is None else SegmentResult(self.name, self.segments)

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
            out.update(flag_json(self.assessment))
        if self.classes is not None:
            out["classes"] = {"estimated": self.classes}
        segments = self.segment_result
        if segments is not None:
            out.update(segments.to_json())
        out.update(sections or {})
        return out

    def to_text(self, calibration: EstimatorCalibration) -> list[str]:
        """The window in the lines ``check`` prints: every estimate (the headline first), the per-class
        figures, the flag and where the drop is."""
        doc = self.to_json(calibration)
        head = self.headline[0] if self.headline is not None else None
        return [
            *estimate_lines(doc["estimates"], head),
            *class_lines(doc.get("classes")),
            *flag_lines(doc.get("flag"), doc.get("headline")),
            *segment_lines(doc),
        ]

    def points(self) -> WindowPoints:
        """The window's estimates, headline, counts, trust distance, flag, per-class figures and segments as
        the metrics export them."""
        trust, stats, a = self.trust, self.stats, self.assessment
        window = WindowPoint(
            self.name,
            stats.n,
            dict(stats.fails_by_family),
            trust.distance if trust is not None else None,
            self.classes,
            flagged=None if a is None else a.raised,
            flag_reason=None if a is None else (a.reasons[0] if a.reasons else "none"),
        )
        segments = self.segment_result
        return WindowPoints(
            [estimate_point(est, self.name, e) for est, e in self.estimates.items()],
            None if self.headline is None else estimate_point(self.headline[0], self.name, self.headline[1]),
            window,
            [] if segments is None else segments.points(),
        )

    def to_row(self, realized: float | None = None) -> dict[str, Any]:
        """One flat row (a data frame's, later): the window and its counts, the headline's ``value``,
        ``lower`` and ``upper`` and its ``estimator``, every estimator's ``<name>_value``/``_lower``/
        ``_upper``, the ``realized`` accuracy when known, ``alert`` (the flag raised; None: no flag) and its
        ``reasons`` (joined by ``;``)."""
        stats, a = self.stats, self.assessment
        head = self.headline
        row: dict[str, Any] = {
            "window": self.name,
            "n": stats.n,
            "fails": stats.fails,
            "n_labels": stats.lab_n,
            "estimator": None if head is None else head[0],
        }
        e = None if head is None else head[1]
        row.update(value=None if e is None else e.value, lower=None if e is None else e.lower)
        row["upper"] = None if e is None else e.upper
        for name, e in self.estimates.items():
            row.update(estimate_row(name, e))
        row["realized"] = realized
        row["alert"] = None if a is None else a.raised
        row["reasons"] = None if a is None else ";".join(a.reasons)
        return row


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
    ``headline`` (or the fallback of :func:`~agent.estimation.estimators.registry.headline_of`); CBPE's figures
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


@dataclass(frozen=True)
class SnapshotPoints:
    """The windows as the estimates collectors export them."""

    estimates: list[EstimatePoint]
    headline: list[EstimatePoint]
    windows: list[WindowPoint]
    segments: list[SegmentPoint]


def snapshot_points(entries: Iterable[WindowEntry]) -> SnapshotPoints:
    """Every window's points (:meth:`WindowEntry.points`), gathered by kind."""
    out = SnapshotPoints([], [], [], [])
    for entry in entries:
        p = entry.points()
        out.segments.extend(p.segments)
        out.windows.append(p.window)
        out.estimates.extend(p.estimates)
        if p.headline is not None:
            out.headline.append(p.headline)
    return out


def estimates_snapshot(model: str, version: str, entries: Iterable[WindowEntry], bundle: BundleSection) -> Snapshot:
    """What the estimates collector (:class:`exporters.prometheus.EstimatesCollector`) exports of the windows
    ``entries`` of model ``model`` at ``version``: an agent's at a scrape, a lake's window as backfilled history."""
    points = snapshot_points(entries)
    fixed = bundle.points()
    return Snapshot(
        model,
        version,
        points.estimates,
        points.windows,
        fixed.oracle_tpr,
        fixed.oracle_fpr,
        fixed.calibration_wrong,
        fixed.calibration_right,
        headline=points.headline,
        reference_accuracy=fixed.reference_accuracy,
        segments=points.segments,
    )
