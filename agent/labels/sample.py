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

A challenger run beside the champion (:mod:`agent.dataplane.challenger`) hands the sample the requests it
paired once it has predicted them, with a *preference*: a probability each disagreement of the two versions
is drawn with at least (where a label decides which is right). A prediction is still drawn once, with the
larger of the two probabilities, and every draw then keeps its probability (in ``uniform`` sampling too), so
``with_labels`` and the paired difference both weight each label by the inverse of its probability.
* ``stratified`` — as ``active``, with each prediction's uncertainty replaced by the residual spread of its
  strata (its bin of predicted correctness and its segments) as the labels received so far show it
  (:mod:`agent.labels.strata_draws`, :mod:`agent.estimation.strata`): the budget goes where the labels say the
  predictor is wrong. Probabilities are fixed before each draw and kept, so ``with_labels`` is the same
  inverse-probability-weighted estimate.
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
from agent.estimation.active import spread_probabilities, uncertainty
from agent.judging.recorder import JudgedBatch
from agent.labels.kept_inputs import KeptInputsPolicy
from agent.labels.rows import PendingBatch
from agent.labels.segment_labels import SampleSegmentLabels
from agent.labels.store import PredictionStore
from agent.labels.strata_draws import StratifiedDraws
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

    def probabilities(
        self, predicted_correct: np.ndarray, now: float, boost: float = 1.0, spread: np.ndarray | None = None
    ) -> np.ndarray:
        """The draw probabilities of one batch, and the batch counted into the smoothed figures. ``spread``:
        each prediction's residual standard deviation as stratified draws learn it (default: the calibrated
        uncertainty of ``f``)."""
        f = np.asarray(predicted_correct, dtype=np.float64).reshape(-1)
        u = uncertainty(f) if spread is None else np.asarray(spread, dtype=np.float64).reshape(-1)
        self._decay(now)
        self._count += len(f)
        self._u += float(u.sum())
        expected = self.traffic_rate(now) * self.window
        goal = min(self.per_window * boost / expected, 1.0) if expected > 0 else 1.0
        kept = self._drawn / self._asked if self._asked > 0 else 1.0
        rate = min(goal / max(kept, 1e-3), 1.0 / self.floor)
        pi = spread_probabilities(u, rate, self._u / self._count, self.floor)
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
        keep_probabilities: bool = False,
        strata: StratifiedDraws | None = None,
    ) -> None:
        self.store = store
        self.rate = rate
        self.metrics = metrics
        self.budget = budget
        self.boost_factor = float(boost_factor)
        #: every draw keeps its probability (a challenger's preference makes uniform draws unequal)
        self.keep_probabilities = keep_probabilities
        #: stratified draws' learnt allocation (``labels.sampling: stratified``; needs ``budget``)
        self.strata = strata
        #: the sample's labels by segment (every segment's realized accuracy in a window)
        self.segment_labels = SampleSegmentLabels()
        self._boost_until = 0.0
        self._lock = threading.Lock()
        self._rng = np.random.default_rng()  # drawn from OS entropy, never from the request

    @classmethod
    def of(
        cls, config: LabelsConfig, store: PredictionStore, metrics: LabelMetrics, keep_probabilities: bool = False
    ) -> LabelingSample:
        """The sample of ``labels`` settings (``keep_probabilities``: a challenger prefers disagreements)."""
        if config.sampling in ("active", "stratified"):
            budget = ActiveBudget(config.per_window, config.budget_seconds, config.active_floor)
            strata = StratifiedDraws(config.budget_seconds) if config.sampling == "stratified" else None
            return cls(store, 0.0, metrics, budget, config.boost_factor, keep_probabilities, strata)
        return cls(store, config.sample_rate, metrics, keep_probabilities=keep_probabilities)

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

    def _draw(
        self, batches: Sequence[JudgedBatch], prefer: np.ndarray | None = None
    ) -> list[tuple[np.ndarray | None, np.ndarray | None]]:
        """Every batch's drawn predictions and their draw probabilities (None: not kept), in one draw over the
        batches' predictions one after the other. ``prefer``: per prediction of all the batches, the
        probability it is drawn with at least (a challenger's preference for its disagreements)."""
        offsets = list(itertools.accumulate((len(b.predicted) for b in batches), initial=0))
        total = offsets[-1]
        fs: list[np.ndarray] = []
        strata: list[np.ndarray] | None = None
        if self.budget is None:
            if self.rate <= 0 and prefer is None:
                return [(None, None)] * len(batches)
            if prefer is None and not self.keep_probabilities:
                # uniform draws keep no probability: with_labels is then the unweighted PPI++ of equal draws
                drawn = np.flatnonzero(self._rng.random(total) < self.rate)
                cuts = np.searchsorted(drawn, offsets).tolist()  # each batch's draws: one slice of them
                return [(drawn[cuts[i] : cuts[i + 1]] - offsets[i], None) for i in range(len(batches))]
            pi = np.full(total, self.rate) if prefer is None else np.maximum(self.rate, prefer)
            hit = self._rng.random(total) < pi
        else:
            fs = [_predicted_correct(b) for b in batches]
            f = np.concatenate(fs) if len(fs) > 1 else fs[0]
            spread = None
            if self.strata is not None:
                strata = [self.strata.strata(b, fb) for b, fb in zip(batches, fs, strict=True)]
                parts = [self.strata.spread(b, fb, sb) for b, fb, sb in zip(batches, fs, strata, strict=True)]
                spread = np.concatenate(parts) if len(parts) > 1 else parts[0]
            now = time.monotonic()
            with self._lock:
                boost = self.boost_factor if now < self._boost_until else 1.0
                pi = self.budget.probabilities(f, now, boost, spread)
                if prefer is not None:
                    pi = np.maximum(pi, prefer)
                hit = self._rng.random(total) < pi
        drawn = np.flatnonzero(hit)
        cuts = np.searchsorted(drawn, offsets).tolist()  # each batch's draws: one slice of them
        out: list[tuple[np.ndarray | None, np.ndarray | None]] = []
        for i, batch in enumerate(batches):
            mine = drawn[cuts[i] : cuts[i + 1]]
            if self.strata is not None and strata is not None:
                self.strata.remember(batch, mine - offsets[i], fs[i], strata[i])
            out.append((mine - offsets[i], pi[mine]))
        return out

    def labeled(self, labels: list[tuple[str, int]]) -> None:
        """Accepted labels ``(prediction id, true class)`` (from the label intake): the stratified
        allocation learns from them, and they join their segments' realized figures."""
        if self.strata is not None:
            self.strata.learn(labels)
        self.segment_labels.learn(labels)

    def on_judged(self, batch: JudgedBatch, prefer: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Judged-batch sink (called while recording, so it only enqueues). ``prefer``: per prediction, the
        probability it is drawn with at least (a challenger's preference for the disagreements). Returns the
        indices drawn and their draw probabilities (None: not kept)."""
        ((sampled, probability),) = self._queue((batch,), prefer)
        return (sampled, probability) if sampled is not None else (np.zeros(0, dtype=np.int64), None)

    def on_judged_group(self, batches: Sequence[JudgedBatch]) -> None:
        """Judged-group sink: the requests of one recording call drawn together, then queued one by one."""
        self._queue(batches, None)

    def _queue(
        self, batches: Sequence[JudgedBatch], prefer: np.ndarray | None
    ) -> list[tuple[np.ndarray | None, np.ndarray | None]]:
        out: list[tuple[np.ndarray | None, np.ndarray | None]] = []
        drawn = 0
        for batch, (sampled, probability) in zip(batches, self._draw(batches, prefer), strict=True):
            if sampled is not None and len(sampled):
                drawn += len(sampled)
                self.segment_labels.remember(batch, sampled, probability)
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
            out.append((sampled, probability))
        if drawn:
            self.metrics.label_sample.inc(drawn)
        return out


def _predicted_correct(batch: JudgedBatch) -> np.ndarray:
    """The batch's calibrated probabilities of being correct: the recorder's, else computed here from
    the confidences as the windows take them."""
    if batch.predicted_correct is not None:
        return batch.predicted_correct
    conf = label_confidences(batch.probabilities, batch.predicted)
    return batch.rt.calibration.predicted_correct(conf, batch.verdicts)
