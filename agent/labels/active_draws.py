"""Active draws of the labeling sample (``labels.sampling: active``): each prediction with a probability
growing with the uncertainty of the bundle's calibrated correctness predictor
(:func:`agent.estimation.estimators.active.draw_probabilities`), scaled so that the expected number drawn per
``labels.budget_window`` is ``labels.per_window``. :class:`ActiveBudget` keeps the traffic's rate, mean
uncertainty and the share lost to probabilities clipped at 1 as exponentially decayed sums (time constant a
tenth of the window, corrected for the start-up as an EWMA's bias is). While the sample is boosted (the trust
signal says a window lies outside the calibration's range: :mod:`agent.labels.boost`) the rate is multiplied by
``labels.boost_factor``: the budget is spent sooner, where the label-free estimate is least to be believed.
Every draw keeps its probability: ``with_labels`` weights each label by its inverse
(:mod:`agent.estimation.estimators.active`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from agent.config.sampling import Sampling
from agent.config.settings import LabelsConfig
from agent.estimation.estimators.active import spread_probabilities, uncertainty
from agent.judging.recorder import JudgedBatch
from agent.labels.draw_policy import Draw, DrawPolicy
from agent.model.classifier import label_confidences


class ActiveBudget:
    """The rate of active draws that meets a budget of labels per window (see the module docstring).
    Not thread-safe by itself: :class:`ActiveDraws` calls it under its lock."""

    def __init__(self, per_window: int, window_seconds: float, floor: float, start: float | None = None) -> None:
        self.per_window = int(per_window)
        self.window = float(window_seconds)
        self.tau = max(self.window / 10.0, 1.0)
        self.floor = float(floor)
        self._start = time.monotonic() if start is None else start
        self._last = self._start
        self._count = 0.0  # decayed predictions
        self._u = 0.0  # decayed Σ uncertainty
        self._g = 0.0  # decayed Σ focus factor
        self._drawn = 0.0  # decayed Σ π
        self._asked = 0.0  # decayed Σ rate (what π would sum to without clipping)

    def _decay(self, now: float) -> None:
        k = math.exp(-max(now - self._last, 0.0) / self.tau)
        self._count *= k
        self._u *= k
        self._g *= k
        self._drawn *= k
        self._asked *= k
        self._last = max(now, self._last)

    def traffic_rate(self, now: float) -> float:
        """Predictions per second, smoothed (the decayed count over the decayed time elapsed)."""
        span = self.tau * (1.0 - math.exp(-max(now - self._start, 1e-9) / self.tau))
        return self._count / span if span > 0 else 0.0

    def probabilities(
        self,
        predicted_correct: np.ndarray,
        now: float,
        boost: float = 1.0,
        spread: np.ndarray | None = None,
        focus: np.ndarray | None = None,
    ) -> np.ndarray:
        """The draw probabilities of one batch, and the batch counted into the smoothed figures. ``spread``:
        each prediction's residual standard deviation as stratified draws learn it (default: the calibrated
        uncertainty of ``f``); ``focus``: each prediction's factor where the inputs changed (default: 1;
        :func:`~agent.estimation.estimators.active.spread_probabilities`)."""
        f = np.asarray(predicted_correct, dtype=np.float64).reshape(-1)
        u = uncertainty(f) if spread is None else np.asarray(spread, dtype=np.float64).reshape(-1)
        g = np.ones(len(f)) if focus is None else np.asarray(focus, dtype=np.float64).reshape(-1)
        self._decay(now)
        self._count += len(f)
        self._u += float(u.sum())
        self._g += float(g.sum())
        expected = self.traffic_rate(now) * self.window
        goal = min(self.per_window * boost / expected, 1.0) if expected > 0 else 1.0
        kept = self._drawn / self._asked if self._asked > 0 else 1.0
        rate = min(goal / max(kept, 1e-3), 1.0 / self.floor)
        pi = spread_probabilities(u, rate, self._u / self._count, self.floor, g, self._g / self._count)
        self._drawn += float(pi.sum())
        self._asked += rate * len(f)
        return pi


class ActiveDraws(DrawPolicy):
    """Draws that meet a budget of labels per window, each with a probability growing with the prediction's
    calibrated uncertainty (thread-safe)."""

    name: ClassVar[Sampling] = "active"
    boostable: ClassVar[bool] = True

    def __init__(self, budget: ActiveBudget) -> None:
        self.budget = budget
        self._lock = threading.Lock()

    @classmethod
    def of(cls, config: LabelsConfig, start: float | None = None) -> ActiveDraws:
        return cls(ActiveBudget(config.per_window, config.budget_seconds, config.active_floor, start))

    def probabilities(self, batches: Sequence[JudgedBatch], now: float, boost: float = 1.0) -> Draw:
        f = joined([predicted_correct(b) for b in batches])
        with self._lock:
            return Draw(self.budget.probabilities(f, now, boost))


def joined(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The batches' values one after the other (the one batch's own array when there is one)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0)


def predicted_correct(batch: JudgedBatch) -> np.ndarray:
    """The batch's calibrated probabilities of being correct: the recorder's, else computed here from
    the confidences as the windows take them."""
    if batch.predicted_correct is not None:
        return batch.predicted_correct
    conf = label_confidences(batch.probabilities, batch.predicted)
    return batch.rt.calibration.predicted_correct(conf, batch.verdicts)
