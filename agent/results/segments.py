"""A window's segment table as a result: ranked by evidence of a drop (changed inputs first), rendered as the
``segments`` and ``segment_drop`` sections of the documents, as the ``*_segment_*`` metrics, as the lines
``check`` prints ("where the drop is") and as one flat row — each from the one
:class:`~agent.estimation.segments.table.SegmentTable`, so that they never disagree."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.estimation.segments.scope import least_changed
from agent.estimation.segments.segmentation import label_of
from agent.estimation.segments.table import SegmentTable
from agent.results.estimate import DECIMALS
from exporters.segment_metrics import SegmentPoint

#: Segments ``check`` names in words (``--json`` lists them all).
SEGMENTS_SHOWN = 3


def segments_json(table: SegmentTable, *, decimals: int | None = DECIMALS) -> dict[str, Any]:
    """A window's ``segments`` (ranked by evidence of a drop: changed inputs first) and ``segment_drop`` (each
    dimension's mix and within parts, :mod:`agent.estimation.segments.table`)."""
    return {"segments": table.rows_json(decimals), "segment_drop": table.drop_json(decimals)}


def segment_lines(doc: Mapping[str, Any]) -> list[str]:
    """Where the drop is, in words, from a document's ``segments`` and ``segment_drop`` (none: no lines): the
    segments whose inputs changed (what changed, and what their labels say it costs, or that no label-free
    estimate can) and those that lost the most accuracy beyond noise (their share now and at reference, the
    estimate against the reference, the truth when known), in the table's order, and the changes of mix."""
    rows = doc.get("segments")
    drop = doc.get("segment_drop")
    if not isinstance(rows, list) or not isinstance(drop, dict):
        return []
    shown = [r for r in rows if r.get("status", "dropping" if r["contribution"] > 0 else "ok") != "ok"]
    shown = shown[:SEGMENTS_SHOWN]
    across = across_the_traffic(drop)
    if not shown:
        lines = ["where the drop is: no segment's inputs changed and none lost accuracy beyond noise"]
    elif across is not None:
        lines = [
            f"where the drop is: across the traffic, in no one segment: {across}. The segments where the change "
            f"is largest ({drop['estimator']} per segment):"
        ]
    else:
        lines = [f"where the drop is (segments by evidence of a drop, {drop['estimator']} per segment):"]
    for r in shown:
        lines.append(f"  {r['name']}: {_described(r)}")
    moved = [(name, d["mix"]) for name, d in drop["dimensions"].items() if abs(d["mix"]) >= 0.01]
    for name, mix in moved:
        way = "costs" if mix > 0 else "gains"
        lines.append(f"  the change of mix of {name} alone {way} {abs(mix):.3f} of the accuracy")
    return lines


def across_the_traffic(drop: Mapping[str, Any]) -> str | None:
    """When a document's ``segment_drop`` says the change is ``widespread`` (:mod:`agent.estimation.segments.scope`),
    why, in words; else None."""
    if not drop.get("widespread"):
        return None
    shares = {str(d): float(v.get("changed_share", 0.0)) for d, v in (drop.get("dimensions") or {}).items()}
    least = least_changed(shares)
    if least is None:
        return None
    return (
        f"segments whose inputs changed hold {least[1]:.0%} or more of every dimension's predictions, "
        f"{least[0]} the least"
    )


def _described(r: Mapping[str, Any]) -> str:
    """One segment row in words."""
    parts = [f"{r['share']:.0%} of predictions (reference {r['reference_share']:.0%})"]
    change = r.get("change") or {}
    if change.get("changed"):
        moved = ", ".join(_column(c) for c in change.get("columns", ()))
        parts.append(f"inputs changed ({moved})")
    e = r["estimate"]
    if e is not None and r.get("estimable", True):
        parts.append(
            f"estimated {e['value']:.3f} [{e['lower']:.3f}, {e['upper']:.3f}] against {r['reference_accuracy']:.3f} "
            "at reference"
        )
    if "realized" in r:
        z = r["realized"]
        parts.append(f"{z['n']} labels drawn: {z['value']:.3f} [{z['lower']:.3f}, {z['upper']:.3f}]")
    elif r.get("status") == "changed_cost_unknown":
        parts.append("cost unknown without labels (the labels drawn follow it)")
    if "truth_accuracy" in r:
        parts.append(f"true {r['truth_accuracy']:.3f}")
    if r["contribution"] > 0:
        parts.append(f"{r['contribution']:.3f} of the accuracy")
    return ", ".join(parts)


def _column(c: Mapping[str, Any]) -> str:
    """A changed column in words: a mean shift and spread (columns), a correlation's change, a share's change (the
    rows at a column's most common value), a rate's rise."""
    kind = c.get("kind", "column")
    if kind == "column":
        return f"{c['column']}: mean {c['shift']:+.2f} sd, spread ×{c['spread']:.2f}"
    if kind == "point":
        return f"{c['column']}: share {c['shift']:+.2f}"
    if kind == "pair":
        return f"correlation {c['column']} {c['shift']:+.2f}"
    if kind == "share":
        return f"unseen at fit, ×{c['shift']:.0f} its share there"
    return f"{c['column']} {c['shift']:+.2f} sd"


@dataclass(frozen=True)
class SegmentResult:
    """Window ``window``'s segment table."""

    window: str
    table: SegmentTable

    def to_json(self, *, decimals: int | None = DECIMALS) -> dict[str, Any]:
        """The ``segments`` and ``segment_drop`` sections (:func:`segments_json`)."""
        return segments_json(self.table, decimals=decimals)

    def to_text(self) -> list[str]:
        """The lines ``check`` prints of the table (:func:`segment_lines`)."""
        return segment_lines(self.to_json(decimals=None))

    def points(self) -> list[SegmentPoint]:
        """The segments as the ``*_segment_*`` metrics export them (segments without a prediction in the
        window: their share only)."""
        across = self.table.widespread
        return [
            SegmentPoint(
                self.window,
                row.kind,
                row.label,
                row.share,
                row.contribution,
                row.estimate.value if row.estimate is not None else None,
                row.reference_accuracy,
                row.change.score,
                label_of(row.change.columns[0].column) if row.change.columns else "",
                across,
            )
            for row in self.table.rows
        ]

    def to_row(self) -> dict[str, Any]:
        """One flat row: the window, the estimator per segment, the segment ranked first (its estimate, with the
        interval, against its reference, its contribution and its changed columns; None where no segment
        changed or lost any) and ``alert``: whether a segment's inputs changed or it lost accuracy beyond
        noise."""
        top = self.table.rows[0] if self.table.rows else None
        lost = top is not None and (top.contribution > 0 or top.change.changed)
        e = top.estimate if top is not None and lost else None
        return {
            "window": self.window,
            "estimator": self.table.estimator,
            "segment": top.name if lost and top is not None else None,
            "value": None if e is None else e.value,
            "lower": None if e is None else e.lower,
            "upper": None if e is None else e.upper,
            "reference": top.reference_accuracy if lost and top is not None else None,
            "contribution": top.contribution if lost and top is not None else None,
            "changed": top.change.names if lost and top is not None and top.change.changed else None,
            "alert": lost,
        }
