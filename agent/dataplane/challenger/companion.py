"""The challenger as a companion of the serving agent: the hand-over of judged requests (pairing by a keyed
hash, the bounded queue), its thread, its paired windows and what it reports (see the package docstring)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from prometheus_client.registry import Collector

from agent.config.settings import AgentSettings
from agent.core import logs
from agent.core.held_requests import HeldRequests
from agent.dataplane.challenger.pairing import BadOutput, paired_stats, predict
from agent.estimation.pairs.calibration import Disagreements, PairCalibration
from agent.judging.companions import CompanionBase
from agent.judging.linger import LingerLoop
from agent.judging.paired_windows import PairedWindows
from agent.judging.recorder import JudgedBatch
from agent.judging.runtime import Runtime
from agent.judging.verdicts import JudgeWork
from agent.labels.paired_labels import DisagreementDraws
from agent.results.paired import PairedEntry, PairedModel, challenger_json, paired_entry, paired_points
from exporters.challenger_metrics import ChallengerCollector, ChallengerMetrics, ChallengerSnapshot

log = logs.get("challenger")

#: Requests the challenger's thread takes at most per model call.
MAX_BATCH_REQUESTS = 64
#: Seconds the thread waits, once a request arrived, for more to predict and record together (as the judge
#: queue lingers): a model, oracle and window update per call, not per request.
LINGER_SECONDS = 0.05
#: Seconds the thread takes at most to predict what is queued when the agent stops.
STOP_SECONDS = 10.0
#: Hands a champion's judged request on to the labeling sample (with a preference per prediction); returns
#: the indices drawn and their probabilities.
Forward = Callable[[JudgedBatch, np.ndarray | None], tuple[np.ndarray, np.ndarray | None]]


class Challenger(CompanionBase):
    """The challenger's queue, thread and windows (see the package docstring)."""

    def __init__(
        self,
        settings: AgentSettings,
        runtime: Runtime,
        pair: PairCalibration,
        metrics: ChallengerMetrics,
        *,
        forward: Forward | None = None,
        draws: DisagreementDraws | None = None,
    ) -> None:
        cfg = settings.challenger
        self.config = cfg
        self.runtime = runtime
        self.pair = pair
        self.metrics = metrics
        self.forward = forward
        self.draws = draws
        self.per_class_cap = settings.metrics.per_class_label_cap
        self.windows = PairedWindows(settings.window_seconds)
        self._key = os.urandom(16)
        self._threshold = int(cfg.share * 2**64)
        self._queue: deque[JudgedBatch] = deque()
        self._held = HeldRequests()
        self._cond = threading.Condition()
        self._loop = LingerLoop(
            self._cond,
            "icos-challenger",
            LINGER_SECONDS,
            pending=lambda: bool(self._queue),
            enough=lambda: len(self._queue) >= MAX_BATCH_REQUESTS,
            work=self._work,
        )
        self._identity: str | None = None
        #: the champion (name, version) of the last paired request (the metrics' labels)
        self._champion = ("", "")

    # -- the judged requests' hand-over (on the recording path: only a hash and an enqueue) ----------------
    def paired(self, request_id: str) -> bool:
        """Whether a request is paired: a keyed hash of its id below the share (all or none of its predictions)."""
        if self._threshold >= 2**64:
            return True
        digest = hashlib.blake2b(request_id.encode("utf-8", "surrogatepass"), key=self._key, digest_size=8).digest()
        return int.from_bytes(digest, "big") < self._threshold

    def take_judged(self, batches: Sequence[JudgedBatch]) -> Sequence[JudgedBatch]:
        """Every judged request is the challenger's: paired ones queued, the others handed on at once."""
        for batch in batches:
            self.on_judged(batch)
        return ()

    def on_judged(self, batch: JudgedBatch) -> None:
        """Queue a paired request for the challenger's thread; hand every other on."""
        if batch.inputs is None or not self.paired(batch.request_id):
            self._hand_on(batch, None)
            return
        expected = self.pair.champion_sha256
        if expected and batch.rt.model_sha256 and batch.rt.model_sha256 != expected:
            self.metrics.drop("other_champion")
            self._hand_on(batch, None)
            return
        with self._cond:
            stopping = self._loop.stopping
            if stopping or not self._loop.running or len(self._queue) >= self.config.queue_limit:
                full = True
            else:
                full = False
                self._queue.append(batch)
                self._held.add(batch.request_id)
                if self._loop.idle or len(self._queue) >= MAX_BATCH_REQUESTS:  # a lingering thread needs no wake-up
                    self._loop.notify()
            self.metrics.queue.set(len(self._queue))
        if full:
            self.metrics.drop("queue_full" if not stopping else "stopping")
            self._hand_on(batch, None)

    def _hand_on(self, batch: JudgedBatch, prefer: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
        if self.forward is None:
            return np.zeros(0, dtype=np.int64), None
        return self.forward(batch, prefer)

    # -- what the label intake asks (requests on their way to the store) ---------------------------------
    def holds(self, request_id: str) -> bool:
        with self._cond:
            return self._held.holds(request_id)

    def held_ids(self) -> list[str]:
        with self._cond:
            return self._held.ids()

    # -- the thread -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Predict what is queued (bounded by ``timeout``), then stop; what is left is handed on unpaired."""
        self._loop.stop(timeout)
        with self._cond:
            left, self._queue = list(self._queue), deque()
        for batch in left:
            self.metrics.drop("stopping")
            self._hand_on(batch, None)
            self._release([batch])
        self.metrics.queue.set(0)

    def _work(self) -> None:
        """The thread's turn: up to :data:`MAX_BATCH_REQUESTS` queued requests predicted and recorded together."""
        with self._cond:
            take = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_BATCH_REQUESTS))]
            self.metrics.queue.set(len(self._queue))
        if not take:  # a stop that gave up waiting took them meanwhile
            return
        t0 = time.thread_time()
        try:
            self.process(take)
        except Exception:  # a bug: the thread goes on with the next requests
            log.exception("the challenger's thread raised on %d request(s)", len(take))
        finally:
            self.metrics.cpu.inc(time.thread_time() - t0)
            self._release(take)

    def _release(self, batches: Sequence[JudgedBatch]) -> None:
        with self._cond:
            for b in batches:
                self._held.release(b.request_id)

    # -- the work --------------------------------------------------------------------------------------
    def process(self, batches: Sequence[JudgedBatch]) -> None:
        """Predict, judge and record paired requests (the thread's work; called directly by tests): their
        statistics added once per champion runtime, then each request handed on to the labeling sample. Requests
        whose prediction or recording fails are handed on unpaired, never twice."""
        try:
            works = predict(self.runtime, batches, self.metrics)
        except BadOutput as exc:  # counted apart from a failure: the model ran, its answer cannot be compared
            log.warning("the challenger's answer to %d request(s) is refused: %s", len(batches), exc)
            self.metrics.drop("bad_output", len(batches))
            for batch in batches:
                self._hand_on(batch, None)
            return
        except Exception:  # the challenger fails alone: its requests go on to the store unpaired
            log.exception("the challenger failed on %d request(s); they are not paired", len(batches))
            self.metrics.drop("error", len(batches))
            for batch in batches:
                self._hand_on(batch, None)
            return
        groups: dict[int, list[int]] = {}
        for i, b in enumerate(batches):  # one group per champion runtime (a reload may fall in between)
            groups.setdefault(id(b.rt), []).append(i)
        for rows in groups.values():
            group = [(batches[i], works[i]) for i in rows]
            try:
                dis, offsets = self._record(group)
            except Exception:
                log.exception("the challenger could not record %d request(s); they are not paired", len(group))
                self.metrics.drop("error", len(group))
                for b, _ in group:
                    self._hand_on(b, None)
                continue
            for k, (b, w) in enumerate(group):
                try:
                    self._label(b, w, dis, int(offsets[k]))
                except Exception:  # in the windows already; its disagreements are not preferred for labels
                    log.exception("the challenger could not hand request %s on to the labeling sample", b.request_id)

    def _record(self, group: Sequence[tuple[JudgedBatch, JudgeWork]]) -> tuple[Disagreements, np.ndarray]:
        """Add paired requests of one champion runtime to the windows and the metrics, together; their
        disagreements and where each request starts in them."""
        rt = group[0][0].rt
        if self._identity != rt.identity:  # a reload to another champion model or bundle
            if self._identity is not None:
                self.windows.reset()
                if self.draws is not None:
                    self.draws.reset()
            self._identity = rt.identity
        per_class = len(self.runtime.classes) <= self.per_class_cap
        stats, dis, offsets = paired_stats(self.runtime, self.pair, group, per_class)
        self.windows.record(stats, max(b.timestamp for b, _ in group))
        n = int(offsets[-1])
        self.metrics.predictions.labels(rt.name, rt.version, self.config.version).inc(n)
        self.metrics.stats.add((rt.name, rt.version, self.runtime.bundle_label), stats.pair.items())
        return dis, offsets

    def _label(self, b: JudgedBatch, w: JudgeWork, dis: Disagreements, start: int) -> None:
        """Hand one champion request on to the labeling sample, preferring its disagreements (those of ``dis``
        from ``start`` on, within the request), and remember those drawn."""
        inside = (dis.rows >= start) & (dis.rows < start + w.n)
        rows, g = dis.rows[inside] - start, dis.g[inside]
        prefer = self.draws.preference(w.n, rows) if self.draws is not None and self.forward else None
        drawn, pi = self._hand_on(b, prefer)
        if self.draws is not None:
            self.draws.remember(b.request_id, b.timestamp, drawn, pi, rows, b.predicted[rows], w.predicted[rows], g)

    def on_labels(self, labels: list[tuple[str, int]], outcome: Any) -> None:
        """Labels applied by the label intake: those of drawn disagreements give them their outcome."""
        if self.draws is not None:
            self.draws.on_labels(labels, outcome)

    # -- what is reported -------------------------------------------------------------------------------
    def entries(self, champion: Runtime, now: float) -> list[PairedEntry]:
        """Every time window of the paired predictions estimated once (labeled disagreements included)."""
        labeled = self.draws.labeled_sums(self.windows.seconds, now) if self.draws is not None else {}
        a = PairedModel(champion.calibration, champion.headline)
        b = PairedModel(self.runtime.calibration, self.runtime.headline)
        out = []
        for name, stats in self.windows.stats(now).items():
            pair = stats.pair + labeled[name] if name in labeled else stats.pair
            out.append(paired_entry(name, pair, self.pair, (stats.champion, a), (stats.challenger, b)))
        return out

    def info(self) -> dict[str, Any]:
        """What the challenger is, in the ``challenger`` section."""
        rt = self.runtime
        return {
            "model": {"name": rt.name, "version": self.config.version, "sha256": rt.model_sha256},
            "bundle": rt.bundle_label,
            "share": self.config.share,
            "paired_total": self.windows.total,
            "dropped": self.metrics.dropped_counts(),
        }

    def section(self, champion: Runtime, now: float) -> dict[str, Any]:
        """The ``challenger`` section of ``/v1/estimates``."""
        return challenger_json(self.info(), self.entries(champion, now))

    def sections(self, champion: Runtime, now: float) -> Mapping[str, Any]:
        return {"challenger": self.section(champion, now)}

    def snapshot(self, champion: Runtime, now: float) -> ChallengerSnapshot:
        """What the ``icos_challenger_*`` collector exports at a scrape."""
        points = paired_points(self.entries(champion, now))
        return ChallengerSnapshot(champion.name, champion.version, self.config.version, points)

    def collectors(self, champion: Callable[[], Runtime]) -> Sequence[Collector]:
        """The ``icos_challenger_*`` collector of the paired windows' estimates (its counters are in
        :attr:`metrics`, registered with them)."""
        return [ChallengerCollector(lambda: self.snapshot(champion(), time.time()))]
