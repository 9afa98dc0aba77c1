"""The request pipeline: validate → predict (serve mode) → judge → update windows and metrics.

:class:`Pipeline` judges batches of a :class:`~agent.judging.runtime.Runtime` and feeds the
estimator windows and the metrics; its methods are synchronous and run in the server's thread pool
(onnxruntime releases the GIL), one call per request. The request's ids, inputs and outputs are
handled by :mod:`agent.judging.request_io`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.core.os_threads import name_os_thread
from agent.estimation.statistics import WindowStats, extras_columns, sample_extras, stat_items
from agent.judging.request_io import (
    OUTPUT_LABEL,
    OUTPUT_PROBABILITIES,
    OUTPUT_VERDICT,
    PREDICTION_COUNT,
    SERVE_OUTPUTS,
    VERDICT_BYTES,
    attach_metadata,
    new_request_id,
    resolve_outputs,
    split_inputs,
)
from agent.judging.runtime import Runtime
from agent.judging.windows import WindowSet
from agent.model.classifier import Prediction, label_confidences
from agent.protocol import v2
from exporters.prometheus import AgentMetrics
from invariants.oracle import VERDICTS


@dataclass(eq=False)
class JudgeWork:
    """One request's predictions waiting for the oracle."""

    rt: Runtime
    features: np.ndarray
    probabilities: np.ndarray
    labels: np.ndarray
    metadata: Mapping[str, Any] | None
    inference_seconds: float | None
    verdicts: np.ndarray | None = None
    error: BaseException | None = None
    done: bool = False
    #: The request id: its predictions are ``<request_id>:<index>`` (``None``: not recorded for labels).
    request_id: str | None = None
    #: The TDI leaf (rule) index of each prediction, set with ``verdicts`` by the oracle.
    tdi_rules: np.ndarray | None = None
    #: Wall seconds of the oracle call that judged this work, on the first work of that call only.
    oracle_seconds: float | None = None


@dataclass(frozen=True)
class JudgedBatch:
    """One request's judged predictions, as handed to :attr:`Pipeline.judged_taps`."""

    rt: Runtime
    request_id: str
    timestamp: float
    probabilities: np.ndarray
    labels: np.ndarray
    verdicts: np.ndarray
    #: The inputs of the full ``shift_aware`` model for these predictions as float64 ``[n, 5]``
    #: columns (:func:`agent.estimation.statistics.extras_columns`; None without a shift calibration).
    extras: np.ndarray | None = None


class Pipeline:
    """Judges batches and records them in the windows and the metrics (thread-safe).

    Judging is *combined*: requests that reach the oracle while it is busy are judged together in
    one call (the oracle's cost is mostly per call, not per sample), by whichever request thread
    takes the judging lock next. ``judge`` returns the verdicts of one batch; ``judge_later``
    queues a batch for a background thread (used when the client did not ask for the verdicts; at
    most ``deferred_limit`` batches wait, beyond that the caller judges inline). ``flush`` judges
    everything pending (at shutdown).

    The background thread *lingers*: once work arrives it waits up to ``linger_seconds`` (or until
    ``linger_samples`` predictions wait) and judges everything in one call, so that a stream of
    small requests costs one oracle call, one window update and one wake-up per linger period
    instead of one per request (each wake-up also contends with the request threads for the GIL).
    Verdicts are recorded at most ``linger_seconds`` late; windows have buckets of a second or more.
    """

    def __init__(
        self,
        windows: WindowSet,
        metrics: AgentMetrics,
        deferred_limit: int = 256,
        linger_seconds: float = 0.05,
        linger_samples: int = 512,
    ) -> None:
        self.windows = windows
        self.metrics = metrics
        #: Called with the features of every judged batch (e.g. the audits' live-input reservoir).
        self.taps: list[Callable[[np.ndarray], None]] = []
        #: Called with every judged request that has an id (e.g. the prediction store for delayed
        #: labels); runs under the judging lock, so it must only enqueue.
        self.judged_taps: list[Callable[[JudgedBatch], None]] = []
        self.deferred_limit = deferred_limit
        self.linger_seconds = linger_seconds
        self.linger_samples = linger_samples
        self._pending: list[JudgeWork] = []
        self._pending_samples = 0  # predictions queued by judge_later since the last take
        self._idle = False  # the background thread waits for work (judge_later must wake it)
        self._pending_lock = threading.Lock()
        self._wakeup = threading.Condition(self._pending_lock)
        self._judge_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._stopping = False

    # -- public API -----------------------------------------------------------------------------
    def judge(
        self,
        rt: Runtime,
        features: np.ndarray,
        probabilities: np.ndarray,
        labels: np.ndarray,
        metadata: Mapping[str, Any] | None,
        inference_seconds: float | None,
        request_id: str | None = None,
    ) -> np.ndarray:
        """Verdict indices (int8 ``[N]``) into :data:`invariants.oracle.VERDICTS`; windows/metrics updated."""
        work = JudgeWork(rt, features, probabilities, labels, metadata, inference_seconds, request_id=request_id)
        self.judge_works([work])
        if work.error is not None:
            raise work.error
        assert work.verdicts is not None
        return work.verdicts

    def judge_works(self, works: Sequence[JudgeWork]) -> None:
        """Judge these works now, together with whatever else is pending, in as few oracle calls as
        possible (one per runtime for works without per-request metadata). Each work gets its
        ``verdicts`` or its ``error``; nothing is raised."""
        with self._pending_lock:
            self._pending.extend(works)
        self._judge_pending_until_done(works)

    def verdicts_now(self, works: Sequence[JudgeWork]) -> None:
        """Give each work its ``verdicts`` (or its ``error``) now, in one oracle call per runtime,
        *without* recording them: the caller queues them for recording afterwards (:meth:`defer`,
        :meth:`judge_soon`), where the windows, metrics and taps of many requests are updated in one
        batch. The oracle is stateless, so this takes no lock."""
        groups: dict[int, list[JudgeWork]] = {}
        for w in works:
            groups.setdefault(id(w.rt) if w.metadata is None else id(w), []).append(w)
        for group in groups.values():
            try:
                self._oracle(group)
            except Exception as exc:  # delivered to the waiting requests; such works are not recorded
                for w in group:
                    w.error = exc
                    w.done = True

    def judge_later(
        self,
        rt: Runtime,
        features: np.ndarray,
        probabilities: np.ndarray,
        labels: np.ndarray,
        metadata: Mapping[str, Any] | None,
        inference_seconds: float | None,
        request_id: str | None = None,
    ) -> None:
        """Queue a batch for the background judge (or judge it now when the queue is full)."""
        self.defer(JudgeWork(rt, features, probabilities, labels, metadata, inference_seconds, request_id=request_id))

    def defer(self, work: JudgeWork) -> None:
        """:meth:`judge_later` for a work already made."""
        with self._wakeup:
            self._pending.append(work)
            self._pending_samples += len(work.labels)
            if self._worker is not None and len(self._pending) <= self.deferred_limit:
                if self._idle or self._enough_pending():
                    self._idle = False
                    self._wakeup.notify()
                return
        self._judge_pending_until_done([work])

    def judge_soon(self, work: JudgeWork) -> int:
        """Queue a work *without* waking the background thread: the caller judges it soon
        (:meth:`try_judge_pending`) or wakes the thread (:meth:`wake`). Returns the predictions now
        pending. :meth:`flush` judges it like any pending work."""
        with self._pending_lock:
            self._pending.append(work)
            self._pending_samples += len(work.labels)
            return self._pending_samples

    def pending_samples(self) -> int:
        """Predictions queued and not yet taken by a judging call."""
        with self._pending_lock:
            return self._pending_samples

    def busy(self) -> bool:
        """Whether a judging call is running now (a caller that must not wait can go elsewhere)."""
        return self._judge_lock.locked()

    def try_judge_pending(self) -> bool:
        """Judge everything pending now, unless a judging call is running (then False, at once)."""
        if not self._judge_lock.acquire(blocking=False):
            return False
        try:
            self._run(self._take())
        finally:
            self._judge_lock.release()
        return True

    def wake(self) -> None:
        """Have the background thread judge what is pending (judged here without that thread)."""
        with self._wakeup:
            if self._worker is not None:
                self._idle = False
                self._wakeup.notify()
                return
        self.flush()

    def flush(self) -> None:
        """Judge everything pending now."""
        with self._judge_lock:
            self._run(self._take())

    def start_background(self) -> None:
        if self._worker is None:
            self._stopping = False
            self._worker = threading.Thread(target=self._background, name="icos-judge", daemon=True)
            self._worker.start()

    def stop_background(self) -> None:
        worker = self._worker
        if worker is not None:
            with self._wakeup:
                self._stopping = True
                self._wakeup.notify_all()
            worker.join(timeout=60)
            self._worker = None
        self.flush()

    # -- internals --------------------------------------------------------------------------------
    def _take(self) -> list[JudgeWork]:
        with self._pending_lock:
            batch, self._pending = self._pending, []
            self._pending_samples = 0
        return batch

    def _enough_pending(self) -> bool:
        """Whether the background thread should stop lingering (called holding the pending lock)."""
        return self._pending_samples >= self.linger_samples or 2 * len(self._pending) >= self.deferred_limit

    def _judge_pending_until_done(self, works: Sequence[JudgeWork]) -> None:
        """Judge everything pending, unless another thread already judged these works meanwhile."""
        with self._judge_lock:
            if not all(w.done for w in works):
                self._run(self._take())

    def _background(self) -> None:
        name_os_thread("icos-judge")
        while True:
            with self._wakeup:
                while not self._pending and not self._stopping:
                    self._idle = True
                    self._wakeup.wait()
                self._idle = False
                if self._stopping and not self._pending:
                    return
                deadline = time.monotonic() + self.linger_seconds
                while not self._stopping and not self._enough_pending():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._wakeup.wait(left)
            with self._judge_lock:
                self._run(self._take())

    def _run(self, batch: list[JudgeWork]) -> None:
        groups: dict[int, list[JudgeWork]] = {}
        for w in batch:
            if w.metadata is None:
                groups.setdefault(id(w.rt), []).append(w)
            else:
                groups[id(w)] = [w]
        for works in groups.values():
            try:
                self._judge_group(works)
            except BaseException as exc:  # delivered to the waiting request threads
                for w in works:
                    w.error = exc
            finally:
                for w in works:
                    w.done = True

    @staticmethod
    def _oracle(works: list[JudgeWork]) -> None:
        """Judge works of one runtime (several only without per-request metadata) in one oracle call:
        sets each work's ``verdicts`` and ``tdi_rules``."""
        rt = works[0].rt
        if len(works) == 1:
            w = works[0]
            features, probabilities, labels, metadata = w.features, w.probabilities, w.labels, w.metadata
        else:
            features = np.concatenate([w.features for w in works])
            probabilities = np.concatenate([w.probabilities for w in works])
            labels = np.concatenate([w.labels for w in works])
            metadata = None
        t0 = time.perf_counter()
        oracle = rt.oracle if metadata is not None or rt.oracle_no_metadata is None else rt.oracle_no_metadata
        result, tdi_rules = oracle.judge_with_rules(
            features, probabilities, labels, metadata=metadata, feature_names=rt.bundle.feature_names
        )
        works[0].oracle_seconds = time.perf_counter() - t0
        verdicts = np.asarray(result.verdict, dtype=np.int8)
        start = 0
        for w in works:
            n = len(w.labels)
            w.verdicts = verdicts[start : start + n]
            w.tdi_rules = tdi_rules[start : start + n] if tdi_rules is not None else None
            start += n

    def _judge_group(self, works: list[JudgeWork]) -> None:
        """Judge the works still without verdicts (one oracle call), then record them all at once."""
        rt = works[0].rt
        todo = [w for w in works if w.verdicts is None]
        if todo:
            self._oracle(todo)
        if len(works) == 1:
            w = works[0]
            features, probabilities, labels = w.features, w.probabilities, w.labels
            verdicts = np.asarray(w.verdicts, dtype=np.int8)
            tdi_rules = w.tdi_rules
        else:
            features = np.concatenate([w.features for w in works])
            probabilities = np.concatenate([w.probabilities for w in works])
            labels = np.concatenate([w.labels for w in works])
            verdicts = np.concatenate([np.asarray(w.verdicts, dtype=np.int8) for w in works])
            rules = [w.tdi_rules for w in works]
            tdi_rules = None if any(r is None for r in rules) else np.concatenate(rules)  # type: ignore[arg-type]
        oracle_seconds = [w.oracle_seconds for w in works if w.oracle_seconds is not None]
        for tap in self.taps:
            tap(features)
        conf = label_confidences(probabilities, labels)
        # the inputs of the full shift_aware model (margins, TDI leaves, input PCA error), O(N)
        extras = sample_extras(rt.calibration, probabilities, labels, features, tdi_rules)
        shift = rt.calibration.shift
        stats = WindowStats.of_samples(
            verdicts, conf, rt.calibration.atc_threshold, extras, shift.reference if shift is not None else None
        )
        stats.add_class_sums(probabilities, labels)  # per-class CBPE figures of the time windows
        # the count window keeps the vectors themselves (size × K floats): only within the class cap
        per_class = len(rt.classes) <= self.metrics.per_class_label_cap
        self.windows.record(
            verdicts,
            conf,
            rt.calibration,
            time.time(),
            stats=stats,
            extras=extras,
            probabilities=probabilities if per_class else None,
            labels=labels,
        )
        counts = np.bincount(verdicts.astype(np.int64), minlength=len(VERDICTS)).tolist()
        class_counts = np.bincount(labels.astype(np.int64), minlength=len(rt.classes)).tolist() if per_class else None
        self.metrics.record_window_stats(
            rt.name,
            rt.version,
            rt.bundle_label,
            stat_items(
                stats,
                classes=per_class,
                inputs=shift is None or shift.reference.leaf_bins > 0,
            ),
        )
        self.metrics.record_batch(
            rt.name,
            rt.version,
            counts,
            class_counts,
            rt.classes,
            [w.inference_seconds for w in works if w.inference_seconds is not None],
            oracle_seconds,
        )
        if self.judged_taps:
            now = time.time()
            start = 0
            cols = extras_columns(extras) if extras is not None else None  # [N, 5], sliced per request
            for w in works:
                n = len(w.labels)
                part = cols[start : start + n] if cols is not None else None
                start += n
                if w.request_id is not None and w.verdicts is not None:
                    batch = JudgedBatch(rt, w.request_id, now, w.probabilities, w.labels, w.verdicts, part)
                    for judged_tap in self.judged_taps:
                        judged_tap(batch)

    # serve mode: one call does everything for a request
    def serve_infer(self, rt: Runtime, body: bytes, header_length: str | None) -> tuple[bytes, dict[str, str]]:
        served = self.serve_predict(rt, body, header_length)
        if served.work is not None:
            self.verdicts_now([served.work])
            if served.work.error is None:
                self.defer(served.work)  # recorded off the request path, with other requests' predictions
        return self.serve_respond(served)

    def serve_predict(
        self, rt: Runtime, body: bytes, header_length: str | None, defer: Callable[[JudgeWork], None] | None = None
    ) -> ServedRequest:
        """Decode, validate and run the model. When the client asked for ``icos_verdict`` the returned
        request carries a :class:`JudgeWork` to judge (:meth:`judge_works`) before
        :meth:`serve_respond`; otherwise its predictions are already queued for the background judge.

        The same as :meth:`serve_decode`, :meth:`serve_model` and :meth:`serve_accept` in a row (the
        agent runs the first and the last on its event loop and only the model in a worker thread)."""
        decoded = self.serve_decode(rt, body, header_length)
        pred, seconds = self.serve_model(decoded)
        return self.serve_accept(decoded, pred, seconds, defer)

    def serve_decode(self, rt: Runtime, body: bytes, header_length: str | None) -> DecodedRequest:
        """Decode and validate a request: everything before the model (raises the client's errors)."""
        assert rt.classifier is not None
        req = v2.decode_request(body, header_length, max_elements=rt.max_elements)
        split = split_inputs(rt, req.inputs, req.parameters)
        wanted = resolve_outputs(req.outputs, SERVE_OUTPUTS, req.binary_output)
        x = rt.prepare(split.data.data)
        meta = attach_metadata(split, x.shape[0])
        return DecodedRequest(rt, req.id or new_request_id(), wanted, x, meta)

    @staticmethod
    def serve_model(decoded: DecodedRequest) -> tuple[Prediction, float]:
        """Run the model on a decoded request: its predictions and the inference wall time."""
        classifier = decoded.rt.classifier
        assert classifier is not None
        t0 = time.perf_counter()
        pred = classifier.predict_prepared(decoded.x)
        return pred, time.perf_counter() - t0

    def serve_accept(
        self,
        decoded: DecodedRequest,
        pred: Prediction,
        inference_seconds: float,
        defer: Callable[[JudgeWork], None] | None = None,
    ) -> ServedRequest:
        """Hand the predictions to the judge: as the returned request's work when the client asked for
        ``icos_verdict``, else to ``defer`` (the caller judges them later) or, without it, to the
        background judge (:meth:`defer`)."""
        rt, rid = decoded.rt, decoded.request_id
        assert rt.classifier is not None
        features = rt.classifier.features(decoded.x)
        meta = decoded.metadata
        work = JudgeWork(rt, features, pred.probabilities, pred.labels, meta, inference_seconds, request_id=rid)
        if any(name == OUTPUT_VERDICT for name, _ in decoded.wanted):
            return ServedRequest(rt, rid, decoded.wanted, pred.probabilities, pred.labels, work)
        (defer or self.defer)(work)  # the client does not wait for the verdicts: judge off the request path
        return ServedRequest(rt, rid, decoded.wanted, pred.probabilities, pred.labels, None)

    def serve_respond(self, served: ServedRequest) -> tuple[bytes, dict[str, str]]:
        """The V2 response of a request from :meth:`serve_predict` (its work, if any, judged)."""
        work = served.work
        if work is not None:
            if work.error is not None:
                raise work.error
            assert work.verdicts is not None
        verdicts = work.verdicts if work is not None else None
        produced = {
            OUTPUT_PROBABILITIES: lambda: v2.tensor(OUTPUT_PROBABILITIES, served.probabilities, "FP32"),
            OUTPUT_LABEL: lambda: v2.tensor(OUTPUT_LABEL, served.labels.astype(np.int64), "INT64"),
            OUTPUT_VERDICT: lambda: v2.tensor(OUTPUT_VERDICT, VERDICT_BYTES[verdicts], "BYTES"),
        }
        outputs = [(produced[name](), binary) for name, binary in served.wanted]
        rt, rid = served.rt, served.request_id
        return v2.encode_response(rt.name, rt.version, rid, outputs, {PREDICTION_COUNT: len(served.labels)})


@dataclass
class DecodedRequest:
    """A serve-mode request decoded and validated, before the model (see :meth:`Pipeline.serve_decode`)."""

    rt: Runtime
    request_id: str
    wanted: list[tuple[str, bool]]
    #: The model input, validated and in the model's shape and dtype.
    x: np.ndarray
    metadata: dict[str, Any] | None


@dataclass
class ServedRequest:
    """A serve-mode request between inference and response (see :meth:`Pipeline.serve_predict`)."""

    rt: Runtime
    request_id: str
    wanted: list[tuple[str, bool]]
    probabilities: np.ndarray
    labels: np.ndarray
    #: The predictions to judge before answering (the client asked for ``icos_verdict``), else None.
    work: JudgeWork | None
