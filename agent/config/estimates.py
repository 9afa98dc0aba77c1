"""What the agent keeps of the judged predictions: the ``windows`` of the live estimates, the share of
requests ``judging`` judges, the per-class ``metrics`` and how often the ``state`` is saved."""

from __future__ import annotations

from pydantic import Field, field_validator

from agent.config.section import Section
from agent.core.durations import parse_duration


class WindowsConfig(Section):
    time: list[str] = Field(default_factory=lambda: ["5m", "1h"])
    """time windows of the live estimates (durations such as `30s`, `5m`, `1h`, `1d`)"""

    count: int | None = Field(1000, ge=1, le=10_000_000)
    """the count window: the last N predictions (null: none); for models with at most metrics.per_class_label_cap
    classes it keeps their probability vectors too (4 bytes per class each), and for bundles with segments each
    prediction's change columns (4 bytes per column, at most 32)"""

    @field_validator("time")
    @classmethod
    def _durations(cls, v: list[str]) -> list[str]:
        seen: set[float] = set()
        for item in v:
            seconds = parse_duration(item)
            if seconds < 1:
                raise ValueError(f"window {item!r} is shorter than one second")
            if seconds in seen:
                raise ValueError(f"window {item!r} is listed twice")
            seen.add(seconds)
        return [s.strip() for s in v]


class MetricsConfig(Section):
    per_class_label_cap: int = Field(20, ge=0, le=1000)
    """per-class metric labels only for models with at most this many classes"""


class JudgingConfig(Section):
    sample_rate: float = Field(1.0, gt=0, le=1)
    """share of requests judged when their client does not ask for `icos_verdict` (drawn uniformly at random per
    request): bounds the agent's cost whatever the traffic; the estimates and their intervals rest on the judged
    predictions (`n`), the others are counted in `icos_unjudged_predictions_total` and not stored for delayed
    labels. Verdicts a client asks for are always computed; `labels.durability: commit` judges every request"""


class StateConfig(Section):
    flush_interval_seconds: float = Field(10.0, gt=0)
    """how often the estimate windows are saved to the state directory"""
