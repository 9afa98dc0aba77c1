"""A ``GET /v1/estimates`` answer read back by a client (the demo): a window's estimates, its realized
accuracy and where its drop is, typed — so that a reader of the served document calls results, not keys, and
says of them what ``check`` and the report say (:meth:`ServedEstimate.to_text`, :meth:`TopSegment.to_text`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.estimation.segments.kinds.rule import Rule, abbreviated
from agent.results.segments import across_the_traffic

#: What the demo says of a window without a segment whose inputs changed or that lost accuracy beyond noise.
NO_DROP = "no segment's inputs changed and none lost accuracy beyond noise"


@dataclass(frozen=True)
class ServedEstimate:
    """One estimator's estimate as served: its numeric figures (``value``, ``lower``, ``upper``, ``n``, ...)
    and why it is ``unreliable`` (None: it can be read as a number)."""

    figures: dict[str, float] = field(default_factory=dict)
    unreliable: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ServedEstimate:
        figures = {k: float(v) for k, v in d.items() if isinstance(v, int | float)}
        return cls(figures, str(d["unreliable"]) if d.get("unreliable") else None)

    @property
    def value(self) -> float | None:
        return self.figures.get("value")

    @property
    def lower(self) -> float | None:
        return self.figures.get("lower", self.value)

    @property
    def upper(self) -> float | None:
        return self.figures.get("upper", self.value)

    def __bool__(self) -> bool:
        return bool(self.figures)

    def interval(self) -> tuple[float, float, float] | None:
        """``(value, lower, upper)`` (the bounds default to the value; None: no value)."""
        v = self.value
        if v is None:
            return None
        return v, self.figures.get("lower", v), self.figures.get("upper", v)

    def to_json(self) -> dict[str, float]:
        """The numeric figures (what the demo's record keeps)."""
        return dict(self.figures)

    def to_text(self, digits: int = 3) -> str:
        """``value [lower, upper]`` with ``digits`` decimals."""
        f = self.figures
        return f"{f['value']:.{digits}f} [{f['lower']:.{digits}f}, {f['upper']:.{digits}f}]"

    def error(self, truth: float) -> float:
        """How far the estimate is from the ``truth``."""
        return abs(self.figures["value"] - truth)


@dataclass(frozen=True)
class TopSegment:
    """The segment ranked first in a window, when its inputs changed or it lost accuracy beyond noise: its
    kind, name, share, estimate, reference accuracy and contribution, what the labels drawn in it say
    (``realized``) and the inputs that changed (``changed``: none when they did not)."""

    kind: str
    name: str
    share: float
    estimate: float | None
    reference_accuracy: float
    contribution: float
    realized: float | None
    realized_n: int
    changed: tuple[str, ...] = ()
    #: why the change is across the traffic rather than in this segment (None: it is not; :mod:`.segments`)
    across: str | None = None

    @classmethod
    def of_rows(cls, rows: list[dict[str, Any]], drop: Mapping[str, Any] | None = None) -> TopSegment | None:
        """The first of a window's served ``segments`` (ranked by evidence of a drop) when its inputs changed or
        it lost accuracy beyond noise; ``drop``: the window's ``segment_drop``, which says whether the change is
        across the traffic."""
        if not rows:
            return None
        row = rows[0]
        change = row.get("change") or {}
        changed = tuple(str(c.get("column", "")) for c in change.get("columns", ())) if change.get("changed") else ()
        if not changed and (not row.get("contribution") or float(row["contribution"]) <= 0):
            return None
        estimate = row.get("estimate") or {}
        realized = row.get("realized") or {}
        return cls(
            str(row.get("kind", "")),
            str(row.get("name", "")),
            float(row.get("share", 0.0)),
            None if estimate.get("value") is None else float(estimate["value"]),
            float(row.get("reference_accuracy", 0.0)),
            float(row["contribution"]),
            None if realized.get("value") is None else float(realized["value"]),
            int(realized.get("n", 0) or 0),
            changed,
            across_the_traffic(drop) if drop else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "share": self.share,
            "estimate": self.estimate,
            "reference_accuracy": self.reference_accuracy,
            "contribution": self.contribution,
            "realized": self.realized,
            "realized_n": self.realized_n,
            "changed": list(self.changed),
            "across": self.across,
        }

    def to_text(self) -> str:
        """Where the drop is, in words (one line of the demo's output and report)."""
        est = "-" if self.estimate is None else f"{self.estimate:.3f}"
        out = "" if self.across is None else f"across the traffic: {self.across}; the change is largest in "
        name = abbreviated(self.name) if self.kind == Rule.name else self.name
        out += f"{name} (a {self.kind} segment, {self.share:.0%} of the window): "
        if self.changed:
            out += f"its inputs changed ({', '.join(self.changed)}); "
        if self.changed and self.contribution <= 0:
            out += f"no label-free estimate moved (reference {self.reference_accuracy:.3f})"
        else:
            out += (
                f"estimated {est} against {self.reference_accuracy:.3f} at reference, {self.contribution:.3f} of "
                "the accuracy lost"
            )
        if self.realized is not None:
            out += f"; its {self.realized_n} labels say {self.realized:.3f}"
        elif self.changed:
            out += "; the labels drawn follow it"
        return out


def drop_text(drop: TopSegment | None) -> str:
    """Where a window's drop is, in words (:data:`NO_DROP` when no segment's inputs changed and none lost
    accuracy beyond noise)."""
    return NO_DROP if drop is None else drop.to_text()


@dataclass(frozen=True)
class ServedWindow:
    """One window of a served document: its predictions, every estimate, the realized accuracy of its
    delayed labels (None: none) and where its drop is."""

    n: int
    estimates: dict[str, ServedEstimate]
    realized: float | None
    drop: TopSegment | None

    @classmethod
    def from_json(cls, win: Mapping[str, Any]) -> ServedWindow:
        realized = (win.get("realized") or {}).get("accuracy") or {}
        return cls(
            int(win.get("n", 0)),
            {k: ServedEstimate.from_json(v) for k, v in (win.get("estimates") or {}).items()},
            None if realized.get("value") is None else float(realized["value"]),
            TopSegment.of_rows(win.get("segments") or [], win.get("segment_drop")),
        )


@dataclass(frozen=True)
class ServedEstimates:
    """A ``GET /v1/estimates`` answer: the headline estimator and the windows."""

    headline: str
    windows: dict[str, ServedWindow]

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ServedEstimates:
        windows = body.get("windows") or {}
        return cls(str(body.get("headline", "")), {k: ServedWindow.from_json(w) for k, w in windows.items() if w})
