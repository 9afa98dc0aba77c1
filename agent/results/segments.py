"""A window's segment table as a result: ranked by contribution to the window's drop, rendered as the
``segments`` and ``segment_drop`` sections of the documents, as the ``*_segment_*`` metrics, as the lines
``check`` prints ("where the drop is") and as one flat row — each from the one
:class:`~agent.estimation.segments.table.SegmentTable`, so that they never disagree."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.estimation.segments.table import SegmentTable
from agent.results.estimate import DECIMALS
from exporters.segment_metrics import SegmentPoint

#: Segments ``check`` names in words (``--json`` lists them all).
SEGMENTS_SHOWN = 3


def segments_json(table: SegmentTable, *, decimals: int | None = DECIMALS) -> dict[str, Any]:
    """A window's ``segments`` (ranked by contribution, largest first) and ``segment_drop`` (each dimension's
    mix and within parts, :mod:`agent.estimation.segments.table`)."""
    return {"segments": table.rows_json(decimals), "segment_drop": table.drop_json(decimals)}


def segment_lines(doc: Mapping[str, Any]) -> list[str]:
    """Where the drop is, in words, from a document's ``segments`` and ``segment_drop`` (none: no lines): the
    segments that lost the most accuracy beyond noise (their share now and at reference, the estimate against
    the reference, the truth when known), and the changes of mix."""
    rows = doc.get("segments")
    drop = doc.get("segment_drop")
    if not isinstance(rows, list) or not isinstance(drop, dict):
        return []
    lost = [r for r in rows if r["contribution"] > 0][:SEGMENTS_SHOWN]
    if not lost:
        lines = ["where the drop is: no segment lost accuracy beyond noise against its reference"]
    else:
        lines = [f"where the drop is (segments by accuracy lost, {drop['estimator']} per segment):"]
    for r in lost:
        e = r["estimate"]
        truth = f", true {r['truth_accuracy']:.3f}" if "truth_accuracy" in r else ""
        if "realized" in r:
            z = r["realized"]
            truth += f", {z['n']} labels drawn: {z['value']:.3f} [{z['lower']:.3f}, {z['upper']:.3f}]"
        lines.append(
            f"  {r['name']}: {r['share']:.0%} of predictions (reference {r['reference_share']:.0%}), estimated "
            f"{e['value']:.3f} [{e['lower']:.3f}, {e['upper']:.3f}] against {r['reference_accuracy']:.3f} at "
            f"reference{truth}: {r['contribution']:.3f} of the accuracy"
        )
    moved = [(name, d["mix"]) for name, d in drop["dimensions"].items() if abs(d["mix"]) >= 0.01]
    for name, mix in moved:
        way = "costs" if mix > 0 else "gains"
        lines.append(f"  the change of mix of {name} alone {way} {abs(mix):.3f} of the accuracy")
    return lines


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
        return [
            SegmentPoint(
                self.window,
                row.kind,
                row.label,
                row.share,
                row.contribution,
                row.estimate.value if row.estimate is not None else None,
                row.reference_accuracy,
            )
            for row in self.table.rows
        ]

    def to_row(self) -> dict[str, Any]:
        """One flat row: the window, the estimator per segment, the segment that lost the most (its estimate,
        with the interval, against its reference, and its contribution; None where none lost any) and
        ``alert``: whether a segment lost accuracy beyond noise."""
        top = self.table.rows[0] if self.table.rows else None
        lost = top is not None and top.contribution > 0
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
            "alert": lost,
        }
