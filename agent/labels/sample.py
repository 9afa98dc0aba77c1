"""The labeling sample, and the prediction store judged predictions go to.

Every judged request reaches :meth:`LabelingSample.on_judged` (a judged-batch sink of the recorder):
each of its predictions is drawn into the labeling sample independently, from the agent's own random
source (OS entropy), so no client can choose what is sampled, and the request is queued for the
prediction store's writer with its draws (and, where they differ, their draw probabilities:
``with_labels`` weights each label by the inverse of its probability, :mod:`agent.estimation.estimators.active`).

Each prediction's probability is the draw policy's that ``labels.sampling`` chose
(:mod:`agent.labels.draw_policies`: ``uniform``, ``active``, ``stratified``); the sample never asks which.
While :meth:`LabelingSample.boost` is on (the trust signal says a window lies outside the calibration's
range: :mod:`agent.labels.boost` looks on a timer), a budgeted policy spends its budget
``labels.boost_factor`` times faster.

A challenger run beside the champion (:mod:`agent.dataplane.challenger`) hands the sample the requests it
paired once it has predicted them, with a *preference*: a probability each disagreement of the two versions
is drawn with at least (where a label decides which is right). A prediction is still drawn once, with the
larger of the two probabilities, and every draw then keeps its probability (under uniform draws too), so
``with_labels`` and the paired difference both weight each label by the inverse of its probability.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from agent.config.settings import LabelsConfig
from agent.judging.recorder import JudgedBatch
from agent.labels.draw_policies import draw_policy_of
from agent.labels.draw_policy import DrawPolicy
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
        kept=KeptInputsPolicy.of(config),
        on_inputs_dropped=lambda n, reason: metrics.kept_inputs_dropped.labels(reason).inc(n),
    )


class LabelingSample:
    """Draws judged predictions into the labeling sample by its draw ``policy`` and queues them for the
    prediction store. ``rng``: the random source of the draws (default: seeded from OS entropy); ``clock``: the
    time the policy's budget and the boost count in (:func:`time.monotonic`)."""

    def __init__(
        self,
        store: PredictionStore,
        policy: DrawPolicy,
        metrics: LabelMetrics,
        boost_factor: float = 1.0,
        keep_probabilities: bool = False,
        rng: np.random.Generator | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.draw_policy = policy
        self.metrics = metrics
        self.boost_factor = float(boost_factor)
        #: every draw keeps its probability (a challenger's preference makes uniform draws unequal)
        self.keep_probabilities = keep_probabilities or policy.weighted
        self._boost_until = 0.0
        self._lock = threading.Lock()
        self._rng = np.random.default_rng() if rng is None else rng  # never drawn from the request
        self._clock = clock

    @classmethod
    def of(
        cls, config: LabelsConfig, store: PredictionStore, metrics: LabelMetrics, keep_probabilities: bool = False
    ) -> LabelingSample:
        """The sample of ``labels`` settings (``keep_probabilities``: a challenger prefers disagreements)."""
        return cls(store, draw_policy_of(config), metrics, config.boost_factor, keep_probabilities)

    def boost(self, seconds: float, now: float | None = None) -> None:
        """Spend a budgeted policy's labels faster, by the boost factor, for the next ``seconds``."""
        until = (self._clock() if now is None else now) + max(float(seconds), 0.0)
        with self._lock:
            self._boost_until = max(self._boost_until, until)

    def boosted(self, now: float | None = None) -> bool:
        """Whether the draws are boosted now (``now``: the sample's clock, as :meth:`boost` takes it)."""
        t = self._clock() if now is None else now
        with self._lock:
            return t < self._boost_until

    def _draw(
        self, batches: Sequence[JudgedBatch], prefer: np.ndarray | None = None
    ) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Every batch's drawn predictions and their draw probabilities (None: not kept), in one draw over the
        batches' predictions one after the other. ``prefer``: per prediction of all the batches, the
        probability it is drawn with at least (a challenger's preference for its disagreements)."""
        offsets = list(itertools.accumulate((len(b.predicted) for b in batches), initial=0))
        now = self._clock()
        boost = self.boost_factor if self.boosted(now) else 1.0
        draw = self.draw_policy.probabilities(batches, now, boost)
        pi = draw.pi if prefer is None else np.maximum(draw.pi, prefer)
        with self._lock:
            drawn = np.flatnonzero(self._rng.random(offsets[-1]) < pi)
        kept = self.keep_probabilities or prefer is not None
        cuts = np.searchsorted(drawn, offsets).tolist()  # each batch's draws: one slice of them
        out: list[tuple[np.ndarray, np.ndarray | None]] = []
        for i in range(len(batches)):
            mine = drawn[cuts[i] : cuts[i + 1]]
            if draw.on_drawn is not None:
                draw.on_drawn(i, mine - offsets[i])
            out.append((mine - offsets[i], pi[mine] if kept else None))
        return out

    def labeled(self, labels: list[tuple[str, int]]) -> None:
        """Accepted labels ``(prediction id, true class)`` (from the label intake): the draw policy learns from them
        (stratified draws' allocation), whatever their source. Their segments' realized figures read them from the
        store, with their source (:mod:`agent.labels.realized`)."""
        self.draw_policy.learn(labels)

    def on_judged(self, batch: JudgedBatch, prefer: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Judged-batch sink (called while recording, so it only enqueues). ``prefer``: per prediction, the
        probability it is drawn with at least (a challenger's preference for the disagreements). Returns the
        indices drawn and their draw probabilities (None: not kept)."""
        ((sampled, probability),) = self._queue((batch,), prefer)
        return (sampled, probability) if sampled is not None else (np.zeros(0, dtype=np.int64), None)

    def on_judged_group(self, batches: Sequence[JudgedBatch]) -> None:
        """Judged-group sink: the requests of one recording call drawn together, then queued together."""
        self._queue(batches, None)

    def _queue(
        self, batches: Sequence[JudgedBatch], prefer: np.ndarray | None
    ) -> list[tuple[np.ndarray | None, np.ndarray | None]]:
        out: list[tuple[np.ndarray | None, np.ndarray | None]] = []
        pending: list[PendingBatch] = []
        drawn = 0
        keep_inputs = self.store.kept.enabled
        for batch, (indices, p) in zip(batches, self._draw(batches, prefer), strict=True):
            sampled, probability = (indices, p) if len(indices) else (None, None)
            if sampled is not None:
                drawn += len(sampled)
            pending.append(
                PendingBatch(
                    batch.request_id,
                    batch.timestamp,
                    batch.rt.identity,
                    batch.probabilities,
                    batch.predicted,
                    batch.verdicts,
                    batch.extras,
                    sampled,
                    inputs=batch.inputs if sampled is not None and keep_inputs else None,
                    sampled_p=probability,
                    sampled_segments=_segments_of(batch, sampled),
                )
            )
            out.append((sampled, probability))
        self.store.enqueue_many(pending)
        if drawn:
            self.metrics.label_sample.inc(drawn)
        return out


def _segments_of(batch: JudgedBatch, sampled: np.ndarray | None) -> np.ndarray | None:
    """The segment numbers of the sampled predictions, ``[m, D]``, kept with them so that a label gives its
    segments their realized accuracy (:mod:`agent.labels.realized`); None without segments."""
    ids = batch.segments
    if sampled is None or ids is None or ids.ndim != 2 or ids.shape[1] != len(batch.predicted):
        return None
    return np.ascontiguousarray(ids[:, sampled].T)
