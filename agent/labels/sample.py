"""The labeling sample, and the prediction store judged predictions go to.

Every judged request reaches :meth:`LabelingSample.on_judged` (a judged-batch sink of the recorder):
each of its predictions is drawn into the labeling sample independently, from the agent's own random
source (OS entropy), so no client can choose what is sampled, and the request is queued for the
prediction store's writer with its draws (and, under active sampling, their draw probabilities:
``with_labels`` weights each label by the inverse of its probability, :mod:`agent.estimation.active`).

``labels.sampling``:

* ``uniform`` — every prediction with probability ``labels.sample_rate`` (no probability is stored:
  ``with_labels`` is the unweighted PPI++ of :mod:`agent.estimation.prediction_powered`);
* ``active`` — with probability growing with the uncertainty of the bundle's calibrated correctness
  predictor (:func:`agent.estimation.active.draw_probabilities`), scaled so that the expected number
  drawn per ``labels.budget_window`` is ``labels.per_window``: :class:`ActiveBudget` keeps the
  traffic's rate, mean uncertainty and the share lost to probabilities clipped at 1 as exponentially
  decayed sums (time constant a tenth of the window, corrected for the start-up as an EWMA's bias is).
  While :meth:`LabelingSample.boost` is on (the trust signal says a window lies outside the
  calibration's range: :mod:`agent.labels.boost` looks on a timer), the rate is multiplied by
  ``labels.boost_factor``: the budget is spent sooner, where the label-free estimate is least to be believed.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from agent.config.settings import LabelsConfig
from agent.estimation.active import draw_probabilities, uncertainty
from agent.judging.recorder import JudgedBatch
from agent.labels.kept_inputs import KeptInputsPolicy
from agent.labels.rows import PendingBatch
from agent.labels.store import PredictionStore
from agent.model.classifier import label_confidences
from exporters.label_metrics import LabelMetrics


def open_prediction_store(config: LabelsConfig, state_dir: Path | None, metrics: LabelMetrics) -> PredictionStore:
    """The prediction store of ``labels`` settings (not yet opened: the agent opens it at start)."""
    return PredictionStore(
        state_dir,
        max_predictions=config.max_predictions,
        max_age_seconds=config.max_age_seconds,
        queue_limit=config.queue_limit,
        flush_interval=config.flush_interval_seconds,
        durability=config.durability,
        store_url=config.database_url() if config.enabled else None,
        pool_size=config.pool_size,
        on_error=lambda op: metrics.store_errors.labels(op).inc(),
        on_drop=lambda n, reason: metrics.store_dropped.labels(reason).inc(n),
        on_buffered=metrics.store_buffered.inc,
        kept=KeptInputsPolicy.of(config),
        on_inputs_dropped=lambda n, reason: metrics.kept_inputs_dropped.labels(reason).inc(n),
    )


class ActiveBudget:
    """The rate of active draws that meets a budget of labels per window (see the module docstring).
    Not thread-safe by itself: :class:`LabelingSample` calls it under its lock."""

    def __init__(self, per_window: int, window_seconds: float, floor: float, start: float | None = None) -> None:
        self.per_window = int(per_window)
        self.window = float(window_seconds)
        self.tau = max(self.window / 10.0, 1.0)
        self.floor = float(floor)
        self._start = time.monotonic() if start is None else start
        self._last = self._start
        self._count = 0.0  # decayed predictions
        self._u = 0.0  # decayed Σ uncertainty
        self._drawn = 0.0  # decayed Σ π
        self._asked = 0.0  # decayed Σ rate (what π would sum to without clipping)

    def _decay(self, now: float) -> None:
        k = math.exp(-max(now - self._last, 0.0) / self.tau)
        self._count *= k
        self._u *= k
        self._drawn *= k
        self._asked *= k
        self._last = max(now, self._last)

    def traffic_rate(self, now: float) -> float:
        """Predictions per second, smoothed (the decayed count over the decayed time elapsed)."""
        span = self.tau * (1.0 - math.exp(-max(now - self._start, 1e-9) / self.tau))
        return self._count / span if span > 0 else 0.0

    def probabilities(self, predicted_correct: np.ndarray, now: float, boost: float = 1.0) -> np.ndarray:
        """The draw probabilities of one batch, and the batch counted into the smoothed figures."""
        f = np.asarray(predicted_correct, dtype=np.float64).reshape(-1)
        u = uncertainty(f)
        self._decay(now)
        self._count += len(f)
        self._u += float(u.sum())
        expected = self.traffic_rate(now) * self.window
        goal = min(self.per_window * boost / expected, 1.0) if expected > 0 else 1.0
        kept = self._drawn / self._asked if self._asked > 0 else 1.0
        rate = min(goal / max(kept, 1e-3), 1.0 / self.floor)
        pi = draw_probabilities(f, rate, self._u / self._count, self.floor)
        self._drawn += float(pi.sum())
        self._asked += rate * len(f)
        return pi


class LabelingSample:
    """Draws judged predictions into the labeling sample and queues them for the prediction store.

    ``budget`` (active sampling) gives every prediction its own probability; without it every
    prediction is drawn with probability ``rate``."""

    def __init__(
        self,
        store: PredictionStore,
        rate: float,
        metrics: LabelMetrics,
        budget: ActiveBudget | None = None,
        boost_factor: float = 1.0,
    ) -> None:
        self.store = store
        self.rate = rate
        self.metrics = metrics
        self.budget = budget
        self.boost_factor = float(boost_factor)
        self._boost_until = 0.0
        self._lock = threading.Lock()
        self._rng = np.random.default_rng()  # drawn from OS entropy, never from the request

    @classmethod
    def of(cls, config: LabelsConfig, store: PredictionStore, metrics: LabelMetrics) -> LabelingSample:
        """The sample of ``labels`` settings."""
        if config.sampling == "active":
            budget = ActiveBudget(config.per_window, config.budget_seconds, config.active_floor)
            return cls(store, 0.0, metrics, budget, config.boost_factor)
        return cls(store, config.sample_rate, metrics)

    def boost(self, seconds: float, now: float | None = None) -> None:
        """Raise active draw probabilities by the boost factor for the next ``seconds``."""
        until = (time.monotonic() if now is None else now) + max(float(seconds), 0.0)
        with self._lock:
            self._boost_until = max(self._boost_until, until)

    def boosted(self, now: float | None = None) -> bool:
        """Whether the draws are boosted now (``now``: :func:`time.monotonic`, as :meth:`boost` takes it)."""
        t = time.monotonic() if now is None else now
        with self._lock:
            return t < self._boost_until

    def _draw(self, batches: Sequence[JudgedBatch]) -> list[tuple[np.ndarray | None, np.ndarray | None]]:
        """Every batch's drawn predictions (and, under active sampling, their draw probabilities), in one
        draw over the batches' predictions one after the other."""
        offsets = list(itertools.accumulate((len(b.predicted) for b in batches), initial=0))
        if self.budget is None:
            if self.rate <= 0:
                return [(None, None)] * len(batches)
            # uniform draws keep no probability: with_labels is then the unweighted PPI++ of equal draws
            drawn = np.flatnonzero(self._rng.random(offsets[-1]) < self.rate)
            cuts = np.searchsorted(drawn, offsets).tolist()  # each batch's draws: one slice of them
            return [(drawn[cuts[i] : cuts[i + 1]] - offsets[i], None) for i in range(len(batches))]
        f = (
            np.concatenate([_predicted_correct(b) for b in batches])
            if len(batches) > 1
            else _predicted_correct(batches[0])
        )
        now = time.monotonic()
        with self._lock:
            boost = self.boost_factor if now < self._boost_until else 1.0
            pi = self.budget.probabilities(f, now, boost)
            hit = self._rng.random(len(f)) < pi
        drawn = np.flatnonzero(hit)
        cuts = np.searchsorted(drawn, offsets).tolist()  # each batch's draws: one slice of them
        return [
            (drawn[cuts[i] : cuts[i + 1]] - offsets[i], pi[drawn[cuts[i] : cuts[i + 1]]]) for i in range(len(batches))
        ]

    def on_judged(self, batch: JudgedBatch) -> None:
        """Judged-batch sink (called while recording, so it only enqueues)."""
        self.on_judged_group((batch,))

    def on_judged_group(self, batches: Sequence[JudgedBatch]) -> None:
        """Judged-group sink: the requests of one recording call drawn together, then queued one by one."""
        drawn = 0
        for batch, (sampled, probability) in zip(batches, self._draw(batches), strict=True):
            if sampled is not None and len(sampled):
                drawn += len(sampled)
            else:
                sampled = probability = None
            self.store.enqueue(
                PendingBatch(
                    batch.request_id,
                    batch.timestamp,
                    batch.rt.identity,
                    batch.probabilities,
                    batch.predicted,
                    batch.verdicts,
                    batch.extras,
                    sampled,
                    inputs=batch.inputs if sampled is not None and self.store.kept.enabled else None,
                    sampled_p=probability,
                )
            )
        if drawn:
            self.metrics.label_sample.inc(drawn)


def _predicted_correct(batch: JudgedBatch) -> np.ndarray:
    """The batch's calibrated probabilities of being correct: the recorder's, else computed here from
    the confidences as the windows take them."""
    if batch.predicted_correct is not None:
        return batch.predicted_correct
    conf = label_confidences(batch.probabilities, batch.predicted)
    return batch.rt.calibration.predicted_correct(conf, batch.verdicts)
