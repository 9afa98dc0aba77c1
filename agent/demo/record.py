"""What the demo records while it runs: per-phase truth, estimates and verdicts, the estimate trace
over time, audit results and MLflow runs. The live view and the report read only this."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class PhaseStats:
    """One phase of traffic as the demo saw it."""

    key: str
    name: str
    description: str
    planned: int
    sent: int = 0
    correct: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    #: the last reading of the count window: ``{estimator: {value, lower, upper, n}}``
    estimates: dict[str, dict[str, float]] = field(default_factory=dict)
    #: estimators the agent marked unreliable, with the reason
    unreliable: dict[str, str] = field(default_factory=dict)
    #: ``n`` of the count window behind :attr:`estimates`
    window_n: int = 0
    #: realized accuracy reported by the agent from delayed labels, when it supports them
    realized: float | None = None
    #: where the window's drop is: the segment that lost the most accuracy beyond noise (None: no segment
    #: did, or the bundle has none), as ``GET /v1/estimates`` ranks them
    drop: dict[str, Any] | None = None
    seconds: float = 0.0
    done: bool = False

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.sent if self.sent else None

    def verdict_shares(self) -> dict[str, float]:
        total = sum(self.verdicts.values())
        return {k: v / total for k, v in sorted(self.verdicts.items())} if total else {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "description": self.description,
            "sent": self.sent,
            "truth": self.accuracy,
            "verdicts": dict(self.verdicts),
            "estimates": self.estimates,
            "unreliable": self.unreliable,
            "window_n": self.window_n,
            "realized": self.realized,
            "drop": self.drop,
            "seconds": round(self.seconds, 3),
        }


def top_segment(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first of a window's segments (ranked by contribution, largest first) when it lost accuracy beyond
    noise: its kind, name, share, estimate, reference accuracy and contribution, and what the labels drawn
    in it say (``realized``) when the agent has them."""
    if not rows or not rows[0].get("contribution") or float(rows[0]["contribution"]) <= 0:
        return None
    row = rows[0]
    estimate = row.get("estimate") or {}
    realized = row.get("realized") or {}
    return {
        "kind": str(row.get("kind", "")),
        "name": str(row.get("name", "")),
        "share": float(row.get("share", 0.0)),
        "estimate": None if estimate.get("value") is None else float(estimate["value"]),
        "reference_accuracy": float(row.get("reference_accuracy", 0.0)),
        "contribution": float(row["contribution"]),
        "realized": None if realized.get("value") is None else float(realized["value"]),
        "realized_n": int(realized.get("n", 0) or 0),
    }


def drop_line(drop: dict[str, Any] | None) -> str:
    """Where the drop is, in words (one line of the demo's output and report)."""
    if drop is None:
        return "no segment lost accuracy beyond noise"
    est = "-" if drop["estimate"] is None else f"{drop['estimate']:.3f}"
    out = (
        f"{drop['name']} (a {drop['kind']} segment, {drop['share']:.0%} of the window): estimated {est} against "
        f"{drop['reference_accuracy']:.3f} at reference, {drop['contribution']:.3f} of the accuracy lost"
    )
    if drop["realized"] is not None:
        out += f"; its {drop['realized_n']} labels say {drop['realized']:.3f}"
    return out


@dataclass(frozen=True)
class TracePoint:
    """One reading of the count window during the replay: estimates beside the truth of the same
    last-N predictions."""

    sent: int
    phase: int
    truth: float
    estimates: dict[str, tuple[float, float, float]]


@dataclass
class DemoRecord:
    """Everything the demo shows and reports."""

    window: str
    window_size: int
    headline: str = ""
    estimators: list[str] = field(default_factory=list)
    phases: list[PhaseStats] = field(default_factory=list)
    trace: list[TracePoint] = field(default_factory=list)
    audits: dict[str, dict[str, Any]] = field(default_factory=dict)
    mlflow_runs: dict[str, str | None] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    current: int = -1
    _recent: deque[bool] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self._recent = deque(maxlen=self.window_size)

    @property
    def total_sent(self) -> int:
        return sum(p.sent for p in self.phases)

    def add_predictions(self, phase: int, labels: np.ndarray, truth: np.ndarray, verdicts: list[str]) -> None:
        p = self.phases[phase]
        correct = labels == truth
        p.sent += len(labels)
        p.correct += int(correct.sum())
        p.verdicts.update(verdicts)
        self._recent.extend(bool(c) for c in correct)

    def window_truth(self) -> float | None:
        """Accuracy of the last ``window_size`` predictions sent (what the count window holds)."""
        return float(np.mean(self._recent)) if self._recent else None

    def read_estimates(self, phase: int, body: dict[str, Any]) -> None:
        """Take a ``GET /v1/estimates`` answer: the count window's estimates become the phase's
        current reading and a trace point."""
        if not self.headline:
            self.headline = str(body.get("headline", ""))
        win = (body.get("windows") or {}).get(self.window)
        if not win:
            return
        ests: dict[str, dict[str, float]] = win.get("estimates") or {}
        if not self.estimators and ests:
            names = list(ests)
            self.estimators = (
                [self.headline] + [n for n in names if n != self.headline] if self.headline in names else names
            )
        p = self.phases[phase]
        realized = (win.get("realized") or {}).get("accuracy") or {}
        if realized.get("value") is not None:
            p.realized = float(realized["value"])
        p.estimates = {
            k: {kk: float(vv) for kk, vv in v.items() if isinstance(vv, int | float)} for k, v in ests.items()
        }
        p.unreliable = {k: str(v["unreliable"]) for k, v in ests.items() if v.get("unreliable")}
        p.window_n = int(win.get("n", 0))
        p.drop = top_segment(win.get("segments") or [])
        truth = self.window_truth()
        if truth is not None and ests:
            point = {
                k: (float(v["value"]), float(v.get("lower", v["value"])), float(v.get("upper", v["value"])))
                for k, v in ests.items()
                if v.get("value") is not None
            }
            self.trace.append(TracePoint(self.total_sent, phase, truth, point))

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "window_size": self.window_size,
            "headline": self.headline,
            "estimators": self.estimators,
            "phases": [p.to_dict() for p in self.phases],
            "trace": [
                {"sent": t.sent, "phase": t.phase, "truth": t.truth, "estimates": t.estimates} for t in self.trace
            ],
            "audits": self.audits,
            "mlflow_runs": self.mlflow_runs,
            "info": self.info,
        }
