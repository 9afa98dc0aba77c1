"""The ``labels`` settings of the labeling sample's draws (part of :class:`agent.config.labels.LabelsConfig`):
uniform, active or stratified draws (each a policy of :mod:`agent.labels.draw_policies`), and the budget of
labels per window (:mod:`agent.labels.sample`)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from agent.config.section import Section
from agent.core.durations import parse_duration

#: The labeling designs: each is one draw policy of :mod:`agent.labels.draw_policies`, registered by this value.
Sampling = Literal["active", "stratified", "uniform"]
SAMPLINGS: tuple[Sampling, ...] = get_args(Sampling)


class LabelSampling(Section):
    """How predictions are drawn into the labeling sample (``labels.sample_rate`` stays with the other
    ``labels`` settings: it predates the choice)."""

    sampling: Sampling | None = None
    """how predictions are drawn into the labeling sample: `active` (each with a probability growing with the
    bundle's predicted uncertainty that it is correct, `labels.per_window` expected per `labels.budget_window`;
    every label weighted by its inverse probability), `stratified` (as `active`, the probability growing with
    the residual spread of the prediction's segment or bin of predicted correctness as the labels received so
    far show it) or `uniform` (each with probability `labels.sample_rate`); null: `uniform` when
    `labels.sample_rate` is set, else `active`"""

    per_window: int = Field(200, ge=1, le=1_000_000)
    """with active sampling, the labels to draw per `labels.budget_window` (expected; the traffic rate is measured
    and smoothed)"""

    budget_window: str = "1h"
    """the window `labels.per_window` is counted over (e.g. `1h`)"""

    active_floor: float = Field(0.5, gt=0, le=1)  # agent.estimation.estimators.active.DEFAULT_FLOOR
    """with active sampling, the share of the budget drawn uniformly: every prediction is drawn with probability at
    least this share of the mean rate"""

    boost_factor: float = Field(2.0, ge=1, le=100)
    """with active sampling, how much faster the budget is spent while the trust signal says the label-free estimate
    of a window is outside its calibrated range"""

    @model_validator(mode="after")
    def _sampling(self) -> LabelSampling:
        if self.sampling is None:
            self.sampling = "uniform" if "sample_rate" in self.model_fields_set else "active"
        return self

    @property
    def design(self) -> Sampling:
        """``sampling`` as the validation settled it (never null)."""
        return "active" if self.sampling is None else self.sampling

    @property
    def budget_seconds(self) -> float:
        """``budget_window`` in seconds."""
        return parse_duration(self.budget_window)

    @field_validator("budget_window")
    @classmethod
    def _budget_window(cls, v: str) -> str:
        if parse_duration(v) <= 0:
            raise ValueError("labels.budget_window must be a positive duration")
        return v
