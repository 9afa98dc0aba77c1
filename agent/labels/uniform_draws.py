"""Uniform draws of the labeling sample (``labels.sampling: uniform``): every prediction with probability
``labels.sample_rate``. Equal draws keep no probability: ``with_labels`` is then the unweighted PPI++ of
:mod:`agent.estimation.estimators.prediction_powered`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from agent.config.sampling import Sampling
from agent.config.settings import LabelsConfig
from agent.judging.recorder import JudgedBatch
from agent.labels.draw_policy import Draw, DrawPolicy


class UniformDraws(DrawPolicy):
    """Every prediction drawn with probability ``rate`` (0: no sample)."""

    name: ClassVar[Sampling] = "uniform"
    weighted: ClassVar[bool] = False

    def __init__(self, rate: float) -> None:
        self.rate = float(rate)

    @classmethod
    def of(cls, config: LabelsConfig, start: float | None = None) -> UniformDraws:
        return cls(config.sample_rate)

    def probabilities(self, batches: Sequence[JudgedBatch], now: float, boost: float = 1.0) -> Draw:
        return Draw(np.full(sum(len(b.predicted) for b in batches), self.rate))
