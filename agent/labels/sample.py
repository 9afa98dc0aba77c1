"""The labeling sample, and the prediction store judged predictions go to.

Every judged request reaches :meth:`LabelingSample.on_judged` (a judged-batch sink of the recorder):
each of its predictions is drawn into the labeling sample independently with probability
``labels.sample_rate``, from the agent's own random source (OS entropy), so no client can choose what
is sampled, and the request is queued for the prediction store's writer with its draws.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.config.settings import LabelsConfig
from agent.judging.recorder import JudgedBatch
from agent.labels.kept_inputs import KeptInputsPolicy
from agent.labels.rows import PendingBatch
from agent.labels.store import PredictionStore
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
        kept=KeptInputsPolicy(config.keep_sampled_inputs, config.max_kept_input_bytes, config.max_kept_inputs_bytes),
        on_inputs_dropped=lambda n, reason: metrics.kept_inputs_dropped.labels(reason).inc(n),
    )


class LabelingSample:
    """Draws judged predictions into the labeling sample and queues them for the prediction store."""

    def __init__(self, store: PredictionStore, rate: float, metrics: LabelMetrics) -> None:
        self.store = store
        self.rate = rate
        self.metrics = metrics
        self._rng = np.random.default_rng()  # drawn from OS entropy, never from the request

    def on_judged(self, batch: JudgedBatch) -> None:
        """Judged-batch sink (called while recording, so it only enqueues)."""
        sampled = None
        if self.rate > 0:
            drawn = np.flatnonzero(self._rng.random(len(batch.predicted)) < self.rate)
            if len(drawn):
                sampled = drawn
                self.metrics.label_sample.inc(len(drawn))
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
                batch.inputs if sampled is not None and self.store.kept.enabled else None,
            )
        )
