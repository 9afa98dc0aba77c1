"""A challenger beside the champion: a second version of the model run on a share of the same requests, off the
request path, judged with its own bundle and compared with the champion (``challenger:`` settings).

The recorder hands every judged request to :meth:`Challenger.on_judged` (a judged-batch sink, in any mode: the
champion's predictions come from the agent's model, the upstream or the observations, with the request's
inputs). A request is paired or not as a whole, by a keyed hash of its id (:attr:`ChallengerConfig.share`; the
key is the process's own, so no client chooses what is compared); a paired one waits in a bounded queue
(``challenger.queue_limit``; beyond it the request is dropped and counted) for the challenger's thread, which

1. runs the challenger's model on the requests' inputs (several requests in one call) and judges its
   predictions with the challenger's oracle;
2. adds, per time window (:class:`~agent.judging.paired_windows.PairedWindows`), the champion's statistics of
   the paired predictions, the challenger's and the pair's sums (:mod:`agent.estimation.paired`: its
   disagreements, their ``q_A``, ``q_B`` from the pair's calibration in the challenger's bundle);
3. with delayed labels, hands the champion's request on to the labeling sample, preferring its disagreements
   (:mod:`agent.labels.paired_labels`); unpaired requests go to the sample at once.

The champion's answer never waits for any of it: the sink only draws the hash and enqueues. The thread's CPU
time, the model's time and the queue are the challenger's own metrics (:mod:`exporters.challenger_metrics`).
A reload to another champion model restarts the paired windows; one the pair was not calibrated for is not
paired (``dropped{reason="other_champion"}``).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from agent.config.settings import AgentSettings
from agent.core import logs
from agent.core.os_threads import name_os_thread
from agent.errors import UserError
from agent.estimation.pair_calibration import Disagreements, PairCalibration, pair_of_bundle
from agent.estimation.paired import PairSums
from agent.estimation.statistics import WindowStats, extras_from_columns, sample_extras
from agent.judging.paired_windows import PairedStats, PairedWindows
from agent.judging.recorder import JudgedBatch
from agent.judging.runtime import Runtime, load_runtime
from agent.judging.verdicts import JudgeWork, judge
from agent.labels.paired_labels import DisagreementDraws
from agent.model.classifier import label_confidences
from agent.model.inputs import Inputs
from agent.results.paired import PairedEntry, PairedModel, challenger_json, paired_entry, paired_points
from exporters.challenger_metrics import ChallengerMetrics, ChallengerSnapshot

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


def load_challenger(settings: AgentSettings, champion: Runtime) -> tuple[Runtime, PairCalibration]:
    """The challenger's runtime (its model run here whatever the mode, judged by its bundle) and the pair's
    calibration, checked against ``champion``; raises :class:`UserError` naming the setting to fix."""
    cfg = settings.challenger
    assert cfg.model_path is not None and cfg.bundle_path is not None
    model = settings.model.model_copy(
        update={"path": cfg.model_path, "uri": None, "scores_output": cfg.scores_output, "scores_kind": cfg.scores_kind}
    )
    own = settings.model_copy(
        update={"mode": "serve", "model": model, "bundle": settings.bundle.model_copy(update={"path": cfg.bundle_path})}
    )
    rt = load_runtime(own, version=cfg.version)
    if len(rt.classes) != len(champion.classes):
        raise UserError(
            f"challenger.model_path: the challenger predicts {len(rt.classes)} classes, the champion "
            f"{len(champion.classes)}: compare versions of one model"
        )
    try:
        pair = pair_of_bundle(rt.bundle.pair, champion.model_sha256 or None)
    except ValueError as exc:
        raise UserError(f"challenger.bundle_path: {cfg.bundle_path}: {exc}") from None
    return rt, pair


def _stats(
    rt: Runtime,
    probabilities: np.ndarray,
    predicted: np.ndarray,
    verdicts: np.ndarray,
    extras: Any,
    per_class: bool,
) -> WindowStats:
    """A judged batch's statistics as the recorder adds them to the windows (``extras``: its per-sample
    inputs of ``shift_aware``, or None)."""
    conf = label_confidences(probabilities, predicted)
    shift = rt.calibration.shift
    stats = WindowStats.of_samples(
        verdicts, conf, rt.calibration.atc_threshold, extras, shift.reference if shift is not None else None
    )
    if per_class:
        stats.add_class_sums(probabilities, predicted)
    stats.add_predictor_sums(rt.calibration, conf, verdicts)
    return stats


class Challenger:
    """The challenger's queue, thread and windows (see the module docstring)."""

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
        self._held: Counter[str] = Counter()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._idle = False  # the thread waits for work (a new request must wake it)
        self._identity: str | None = None
        #: the champion (name, version) of the last paired request (the metrics' labels)
        self._champion = ("", "")

    # -- the judged-batch sink (on the recording path: only a hash and an enqueue) -------------------------
    def paired(self, request_id: str) -> bool:
        """Whether a request is paired: a keyed hash of its id below the share (all or none of its predictions)."""
        if self._threshold >= 2**64:
            return True
        digest = hashlib.blake2b(request_id.encode("utf-8", "surrogatepass"), key=self._key, digest_size=8).digest()
        return int.from_bytes(digest, "big") < self._threshold

    def on_judged(self, batch: JudgedBatch) -> None:
        """Judged-batch sink: queue a paired request for the challenger's thread; hand every other on."""
        if batch.inputs is None or not self.paired(batch.request_id):
            self._hand_on(batch, None)
            return
        expected = self.pair.champion_sha256
        if expected and batch.rt.model_sha256 and batch.rt.model_sha256 != expected:
            self.metrics.drop("other_champion")
            self._hand_on(batch, None)
            return
        with self._cond:
            if self._stopping or self._thread is None or len(self._queue) >= self.config.queue_limit:
                full = True
            else:
                full = False
                self._queue.append(batch)
                self._held[batch.request_id] += 1
                if self._idle or len(self._queue) >= MAX_BATCH_REQUESTS:  # a lingering thread needs no wake-up
                    self._idle = False
                    self._cond.notify()
            self.metrics.queue.set(len(self._queue))
        if full:
            self.metrics.drop("queue_full" if not self._stopping else "stopping")
            self._hand_on(batch, None)

    def _hand_on(self, batch: JudgedBatch, prefer: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
        if self.forward is None:
            return np.zeros(0, dtype=np.int64), None
        return self.forward(batch, prefer)

    # -- what the label intake asks (requests on their way to the store) ---------------------------------
    def holds(self, request_id: str) -> bool:
        with self._cond:
            return self._held.get(request_id, 0) > 0

    def held_ids(self) -> list[str]:
        with self._cond:
            return list(self._held)

    # -- the thread -----------------------------------------------------------------------------------
    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="icos-challenger", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Predict what is queued (bounded by ``timeout``), then stop; what is left is handed on unpaired."""
        with self._cond:
            thread, self._stopping = self._thread, True
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            left, self._queue = list(self._queue), deque()
            self._thread = None
        for batch in left:
            self.metrics.drop("stopping")
            self._hand_on(batch, None)
            self._release([batch])
        self.metrics.queue.set(0)

    def _run(self) -> None:
        name_os_thread("icos-challenger")
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._idle = True
                    self._cond.wait()
                self._idle = False
                if not self._queue:
                    return
                deadline = time.monotonic() + LINGER_SECONDS  # more requests per model and oracle call
                while not self._stopping and len(self._queue) < MAX_BATCH_REQUESTS:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                take = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_BATCH_REQUESTS))]
                self.metrics.queue.set(len(self._queue))
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
                left = self._held[b.request_id] - 1
                if left > 0:
                    self._held[b.request_id] = left
                else:
                    self._held.pop(b.request_id, None)

    # -- the work --------------------------------------------------------------------------------------
    def _predict(self, batches: Sequence[JudgedBatch]) -> list[JudgeWork]:
        """The challenger's model on every request's inputs (one call where their shapes allow), its oracle on
        the predictions (one call for the requests without metadata); one judged work per request."""
        rt = self.runtime
        classifier = rt.classifier
        assert classifier is not None
        x = Inputs.concatenate([b.inputs for b in batches if b.inputs is not None])
        t0 = time.perf_counter()
        pred = classifier.predict_prepared(x)
        self.metrics.inference.observe(time.perf_counter() - t0)
        features = classifier.features(x, pred)
        works, start = [], 0
        for b in batches:
            rows = slice(start, start + len(b.predicted))
            start += len(b.predicted)
            works.append(
                JudgeWork(rt, features[rows], pred.probabilities[rows], pred.predicted[rows], b.metadata, None)
            )
        judge(works)
        return works

    def process(self, batches: Sequence[JudgedBatch]) -> None:
        """Predict, judge and record paired requests (the thread's work; called directly by tests): their
        statistics added once per champion runtime, then each request handed on to the labeling sample. Requests
        whose prediction or recording fails are handed on unpaired, never twice."""
        try:
            works = self._predict(batches)
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
        bs, ws = [b for b, _ in group], [w for _, w in group]
        offsets = np.cumsum([0, *(len(b.predicted) for b in bs)])
        pa, la = np.concatenate([b.probabilities for b in bs]), np.concatenate([b.predicted for b in bs])
        pb, lb = np.concatenate([w.probabilities for w in ws]), np.concatenate([w.predicted for w in ws])
        dis = self.pair.disagreements(pa, pb, la, lb)
        per_class = len(self.runtime.classes) <= self.per_class_cap
        extras_a = None
        if all(b.extras is not None for b in bs):
            cols = np.concatenate([b.extras for b in bs if b.extras is not None])
            extras_a = replace(extras_from_columns(cols), label=np.asarray(la, dtype=np.int64))
        verdicts_a = np.concatenate([np.asarray(b.verdicts, dtype=np.int8) for b in bs])
        champion = _stats(rt, pa, la, verdicts_a, extras_a, per_class)
        rules = [w.tdi_rules for w in ws if w.tdi_rules is not None]
        tdi: np.ndarray | None = np.concatenate(rules) if len(rules) == len(ws) else None
        features = np.concatenate([w.features for w in ws])
        extras_b = sample_extras(self.runtime.calibration, pb, lb, features, tdi)
        verdicts_b = np.concatenate([np.asarray(w.verdicts_or_raise(), dtype=np.int8) for w in ws])
        challenger = _stats(self.runtime, pb, lb, verdicts_b, extras_b, per_class)
        sums = PairSums.of_disagreements(len(pa), dis)
        self.windows.record(PairedStats(champion, challenger, sums), max(b.timestamp for b in bs))
        self.metrics.predictions.labels(rt.name, rt.version, self.config.version).inc(len(pa))
        self.metrics.stats.add((rt.name, rt.version, self.runtime.bundle_label), sums.items())
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

    def snapshot(self, champion: Runtime, now: float) -> ChallengerSnapshot:
        """What the ``icos_challenger_*`` collector exports at a scrape."""
        points = paired_points(self.entries(champion, now))
        return ChallengerSnapshot(champion.name, champion.version, self.config.version, points)


class PendingWithChallenger:
    """Where judged predictions wait before the store, a challenger included: a label that names a paired
    request the challenger still holds waits for it as for the judge queue
    (:class:`~agent.labels.intake.PendingJudgement`)."""

    def __init__(self, queue: Any, challenger: Challenger) -> None:
        self.queue = queue
        self.challenger = challenger

    def holds(self, request_id: str) -> bool:
        return bool(self.queue.holds(request_id)) or self.challenger.holds(request_id)

    def held_ids(self) -> list[str]:
        return list(dict.fromkeys([*self.queue.held_ids(), *self.challenger.held_ids()]))

    def wake(self, hurry: bool = False) -> None:
        self.queue.wake(hurry)  # the challenger's thread does not linger
