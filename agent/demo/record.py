"""What the demo records while it runs: per-phase truth, estimates and verdicts, the estimate trace
over time, audit results and MLflow runs. The live view and the report read only this."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.results.served import ServedEstimate, ServedEstimates, TopSegment, drop_text


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
    #: the last reading of the count window, per estimator
    estimates: dict[str, ServedEstimate] = field(default_factory=dict)
    #: estimators the agent marked unreliable, with the reason
    unreliable: dict[str, str] = field(default_factory=dict)
    #: ``n`` of the count window behind :attr:`estimates`
    window_n: int = 0
    #: realized accuracy reported by the agent from delayed labels, when it supports them
    realized: float | None = None
    #: where the window's drop is: the segment that lost the most accuracy beyond noise (None: no segment
    #: did, or the bundle has none), as ``GET /v1/estimates`` ranks them
    drop: TopSegment | None = None
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
            "estimates": {k: e.to_json() for k, e in self.estimates.items()},
            "unreliable": self.unreliable,
            "window_n": self.window_n,
            "realized": self.realized,
            "drop": None if self.drop is None else self.drop.to_json(),
            "seconds": round(self.seconds, 3),
        }


def drop_line(drop: TopSegment | None) -> str:
    """Where the drop is, in words (one line of the demo's output and report)."""
    return drop_text(drop)


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
        served = ServedEstimates.from_json(body)
        if not self.headline:
            self.headline = served.headline
        win = served.windows.get(self.window)
        if win is None:
            return
        ests = win.estimates
        if not self.estimators and ests:
            names = list(ests)
            self.estimators = (
                [self.headline] + [n for n in names if n != self.headline] if self.headline in names else names
            )
        p = self.phases[phase]
        if win.realized is not None:
            p.realized = win.realized
        p.estimates = ests
        p.unreliable = {k: e.unreliable for k, e in ests.items() if e.unreliable}
        p.window_n = win.n
        p.drop = win.drop
        truth = self.window_truth()
        if truth is not None and ests:
            point = {k: iv for k, e in ests.items() if (iv := e.interval()) is not None}
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
