"""The sidecar's state shared by the endpoints: :class:`AgentService` (runtime, windows, metrics,
worker threads, observe queue, state store) and its lifecycle.

:meth:`AgentService.infer` is the one serve-mode path from a request body to its answer (decode, run,
judge, encode); both the fast ASGI path and the FastAPI route call it. :meth:`AgentService.answer_infer`
answers an inference request in the agent's mode (serve, or proxy: forward and judge); the FastAPI route
and the gRPC service call it. :meth:`AgentService.swap_runtime`
is the one place the runtime is replaced (reload, recalibration from labels).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import anyio
import anyio.to_thread
from prometheus_client import CollectorRegistry

from agent.config.settings import AgentSettings, admin_token
from agent.core import logs
from agent.errors import ClientError
from agent.estimation.statistics import WindowStats, stat_items
from agent.judging.batching import (
    LOOP_JUDGE_MAX_SAMPLES,
    LoopJudge,
    VerdictBatcher,
    in_worker,
    model_with_cost,
)
from agent.judging.pipeline import JudgeWork, Pipeline, ServedRequest
from agent.judging.runtime import EstimatorExtension, Runtime, load_runtime
from agent.judging.state import StateStore
from agent.judging.windows import WindowSet
from agent.server.metrics_port import MetricsPortServer
from agent.server.observe import EventPairer, ObserveItem
from agent.server.proxy import proxy_judge, proxy_prepare
from agent.server.upstream import UpstreamClient, UpstreamError, UpstreamModel
from agent.server.window_report import EstimateSection, WindowReport
from exporters.prometheus import AgentMetrics, EstimatesCollector, Snapshot

log = logs.get("app")

#: Serve-mode requests up to this size run on the event loop while they stay cheap (see
#: :meth:`AgentService.infer`); a thread hop costs more than a small model's whole inference.
INLINE_MAX_BYTES = 64 * 1024
INLINE_BUDGET_SECONDS = 0.001
#: Binary-tensor requests up to this size are decoded and answered on the event loop and only their
#: model runs in a worker thread (decoding them is a few small Python steps and one pass over the
#: values); larger ones, and JSON bodies over :data:`INLINE_MAX_BYTES`, run wholly in the threads.
LOOP_DECODE_MAX_BYTES = 4 * 1024 * 1024
#: One small request in this many has its CPU time measured for the inline moving average, which
#: moves by :data:`COST_WEIGHT` of the difference per measurement.
COST_SAMPLE_EVERY = 8
COST_WEIGHT = 0.2


class AgentService:
    """The sidecar's state shared by the endpoints: runtime, windows, metrics, queues, state store."""

    def __init__(self, settings: AgentSettings, registry: CollectorRegistry, runtime: Runtime) -> None:
        self.settings = settings
        self.registry = registry
        self.metrics = AgentMetrics(registry, per_class_label_cap=settings.metrics.per_class_label_cap)
        self.windows = WindowSet(settings.window_seconds, settings.windows.count)
        self.pipeline = Pipeline(self.windows, self.metrics)
        self.runtime = runtime
        self.metrics.set_model(runtime.name, runtime.version, runtime.model_sha256, runtime.classes)
        self.metrics.record_window_stats(runtime.name, runtime.version, runtime.bundle_label, stat_items(WindowStats()))
        registry.register(EstimatesCollector(self.snapshot))
        self.limiter = anyio.CapacityLimiter(settings.server.threads)
        #: Moving average of the cost of small serve-mode requests (see :meth:`infer`), measured on
        #: one request in :data:`COST_SAMPLE_EVERY` (``_cost_tick`` counts them).
        self._inline_cost = 0.0
        self._cost_tick = 0
        #: Judges small requests' predictions on the loop (see :meth:`infer`).
        self.loop_judge = LoopJudge(self.pipeline, LOOP_JUDGE_MAX_SAMPLES)
        #: Judges the verdict-requesting requests of one event-loop turn together (see :meth:`infer`);
        #: their recording lingers with the others' (see :meth:`_answer`).
        self.verdicts = VerdictBatcher(self.pipeline, self.run)
        self.admin_token = admin_token()
        self.ready = False
        self.store: StateStore | None = None
        self.upstream: UpstreamClient | None = None
        #: What the upstream's metadata says (proxy mode); ``None`` until it has been read.
        self.upstream_model: UpstreamModel | None = None
        self.queue: asyncio.Queue[ObserveItem] | None = None
        self.pairer = EventPairer(
            settings.observe.event_ttl_seconds, settings.observe.event_buffer, settings.observe.max_pending_bytes
        )
        self._counted_unmatched = (0, 0, 0, 0)
        self._tasks: list[asyncio.Task[None]] = []
        self._reload_lock = asyncio.Lock()
        self._metrics_server: MetricsPortServer | None = None
        self.accepting = True
        #: Observe workers judge only while this is set (cleared to hold judging, e.g. for maintenance).
        self.judging = asyncio.Event()
        self.judging.set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._state_ok = True
        #: Extra per-window sections of ``/v1/estimates``: each returns ``{window: {section: value}}``
        #: (e.g. the realized accuracy from delayed labels, :mod:`agent.labels.service`).
        self.estimate_sections: list[EstimateSection] = []
        #: estimators computed beside the label-free ones, per window (e.g. ``with_labels``)
        self.estimator_extensions: list[EstimatorExtension] = []
        self.report = WindowReport(
            self.windows, self.estimator_extensions, self.estimate_sections, self.metrics.per_class_label_cap
        )
        #: Awaited with a request's id before it is answered: ``labels.durability: commit`` answers
        #: only once the request's predictions are committed (:meth:`acknowledge`).
        self.ack_gates: list[Callable[[str], Awaitable[None]]] = []

    # -- threads ----------------------------------------------------------------------------------
    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in one of the worker threads (``server.threads`` at most)."""
        return await anyio.to_thread.run_sync(in_worker, fn, *args, limiter=self.limiter)

    async def acknowledge(self, request_id: str) -> None:
        """Pass the request's id through every acknowledgement gate (each may raise a client error)."""
        for gate in self.ack_gates:
            await gate(request_id)

    async def infer(self, rt: Runtime, body: bytes, header_length: str | None) -> tuple[bytes, dict[str, str]]:
        """Serve-mode inference of one request body.

        Small requests run right on the event loop while their recent cost (a moving average) stays
        under :data:`INLINE_BUDGET_SECONDS`: a hop to a worker thread and back costs 50-100 µs, as
        much as a small CNN's inference, and the loop is blocked for less than that budget. Larger
        or costlier requests run their model in the worker threads (onnxruntime releases the GIL
        there; see :meth:`_infer_model_in_thread`). The cost is CPU time, so time spent waiting for
        the GIL behind other threads does not keep small requests off the loop once they went to the
        threads. Small requests' predictions that nobody waits for are judged on the loop
        (:class:`LoopJudge`).

        On the loop, requests that ask for ``icos_verdict`` are judged together: each one queues its
        predictions with the :class:`VerdictBatcher` and waits, the batcher judges everything queued
        in one oracle call at the end of the loop's current turn (no added wait when a request is
        alone), and each request then answers with its own verdicts.
        """
        small = len(body) <= INLINE_MAX_BYTES
        measure = small and self._measure_cost()
        if small and self._inline_cost < INLINE_BUDGET_SECONDS:
            t0 = time.thread_time() if measure else 0.0
            if self.ack_gates:
                kept: list[JudgeWork] = []
                served = _with_work(self.pipeline.serve_predict(rt, body, header_length, kept.append), kept)
            else:
                served = self.pipeline.serve_predict(rt, body, header_length, self.loop_judge.add)
            return await self._answer(served, time.thread_time() - t0 if measure else None, inline=True)
        if small or (header_length is not None and len(body) <= LOOP_DECODE_MAX_BYTES):
            return await self._infer_model_in_thread(rt, body, header_length, measure)
        if not self.ack_gates:
            return await self.run(self.pipeline.serve_infer, rt, body, header_length)  # type: ignore[no-any-return]
        held: list[JudgeWork] = []
        served = await self.run(self.pipeline.serve_predict, rt, body, header_length, held.append)
        return await self._answer(_with_work(served, held), None, inline=False)

    def _record_now(self, work: JudgeWork) -> None:
        """Record ``work`` (already judged) in the windows, metrics and prediction store right away."""
        self.pipeline.judge_works([work])

    def _measure_cost(self) -> bool:
        """Whether to measure this small request's CPU time for the moving average: one in
        :data:`COST_SAMPLE_EVERY`, since reading a thread's CPU clock is a system call (several µs in
        a virtual machine, a few times per request)."""
        self._cost_tick = (self._cost_tick + 1) % COST_SAMPLE_EVERY
        return self._cost_tick == 1 or COST_SAMPLE_EVERY == 1

    async def answer_infer(self, rt: Runtime, body: bytes, header_length: str | None) -> tuple[bytes, dict[str, str]]:
        """The V2 answer to an inference request body in this agent's mode: serve mode infers
        (:meth:`infer`), proxy mode forwards to the upstream and judges its answer (:meth:`proxy_infer`),
        observe mode refuses (predictions come to ``/v1/observe`` there)."""
        mode = self.settings.mode
        if mode == "serve":
            return await self.infer(rt, body, header_length)
        if mode == "proxy":
            return await self.proxy_infer(rt, body, header_length)
        raise ClientError(
            "inference is not served in observe mode; send predictions to POST /v1/observe", status=404, reason="mode"
        )

    async def proxy_infer(self, rt: Runtime, body: bytes, header_length: str | None) -> tuple[bytes, dict[str, str]]:
        """Proxy mode: forward the request's model input to the upstream and judge its answer. Small
        binary requests are decoded and answered on the loop: a thread hop costs more than their work
        (JSON bodies cost milliseconds to parse: they stay in the threads, off the loop)."""
        assert self.upstream is not None
        up = await self.upstream_info()
        small = header_length is not None and len(body) <= INLINE_MAX_BYTES
        prepare_args = (rt, up, body, header_length)
        prepared = proxy_prepare(*prepare_args) if small else await self.run(proxy_prepare, *prepare_args)
        req, meta, x, fwd_body, fwd_headers = prepared
        t0 = time.perf_counter()
        up_body, up_len = await self.upstream.infer(self.settings.upstream_model_name, fwd_body, fwd_headers)
        seconds = time.perf_counter() - t0
        judge_args = (self.pipeline, up, rt, req, meta, x, up_body, up_len, seconds)
        record_now = bool(self.ack_gates)
        if small:
            content, headers, rid = proxy_judge(*judge_args, record_now=record_now)
        else:
            judged = functools.partial(proxy_judge, record_now=record_now)
            content, headers, rid = await self.run(judged, *judge_args)
        await self.acknowledge(rid)
        return content, headers

    async def _infer_model_in_thread(
        self, rt: Runtime, body: bytes, header_length: str | None, measure: bool
    ) -> tuple[bytes, dict[str, str]]:
        """Decode on the loop, run the model in a worker thread, judge (when asked) and answer on the
        loop. The worker threads then hold the GIL only to enter and leave onnxruntime: with many
        requests in flight, threads that also decoded and encoded would queue for the GIL behind each
        other and behind the loop. A small request's cost (when ``measure``) still feeds the inline
        moving average, so small requests return to the loop once the model is cheap again."""
        t0 = time.thread_time() if measure else 0.0
        decoded = self.pipeline.serve_decode(rt, body, header_length)
        cost = time.thread_time() - t0 if measure else 0.0
        pred, seconds, model_cost = await self.run(model_with_cost, self.pipeline, decoded, measure)
        t1 = time.thread_time() if measure else 0.0
        if self.ack_gates:
            kept: list[JudgeWork] = []
            served = _with_work(self.pipeline.serve_accept(decoded, pred, seconds, kept.append), kept)
        else:
            served = self.pipeline.serve_accept(decoded, pred, seconds)
        return await self._answer(
            served, cost + model_cost + time.thread_time() - t1 if measure else None, inline=False
        )

    async def _answer(self, served: ServedRequest, cost: float | None, *, inline: bool) -> tuple[bytes, dict[str, str]]:
        """Judge the request (when it asked for verdicts, see :class:`VerdictBatcher`) and answer it.
        Its predictions are recorded by the loop judge when the request ran on the loop (``inline``),
        else by the background thread, like those of requests without verdicts. A measured small
        request's CPU time (``cost``, its CPU seconds so far, plus this) feeds the inline moving
        average; CPU times only, since other tasks run on the loop while it waits."""
        if served.work is not None:
            # With acknowledgement gates (commit durability) every request's work is judged and
            # recorded here, before the answer: its predictions must reach the store first.
            record = self._record_now if self.ack_gates else self.loop_judge.add if inline else self.pipeline.defer
            share = await self.verdicts.judge(served.work, record)
            if cost is not None:
                cost += share
        if cost is None:
            answer = self.pipeline.serve_respond(served)
            if self.ack_gates:
                await self.acknowledge(served.request_id)
            return answer
        t0 = time.thread_time()
        try:
            answer = self.pipeline.serve_respond(served)
        finally:
            self._inline_cost += COST_WEIGHT * (cost + time.thread_time() - t0 - self._inline_cost)
        if self.ack_gates:
            await self.acknowledge(served.request_id)
        return answer

    # -- estimates --------------------------------------------------------------------------------
    def estimates(self) -> dict[str, Any]:
        return self.report.document(self.runtime, time.time())

    def snapshot(self) -> Snapshot | None:
        return self.report.snapshot(self.runtime, time.time())

    # -- state ------------------------------------------------------------------------------------
    def _state_key(self) -> str:
        return f"windows:{self.settings.model.name}"

    def save_state(self) -> None:
        if self.store is None:
            return
        self.store.put_json(self._state_key(), {"identity": self.runtime.identity, "windows": self.windows.to_dict()})

    def restore_state(self) -> None:
        if self.store is None:
            return
        saved = self.store.get_json(self._state_key(), self._check_saved_windows, "windows")
        if saved and saved.get("identity") == self.runtime.identity:
            self.windows.restore(saved["windows"])
            log.info("restored estimator windows", extra={"judged": self.windows.total})
        elif saved:
            log.info("saved windows belong to another model or bundle; starting empty")

    def _check_saved_windows(self, saved: Any) -> None:
        """Raise when saved windows cannot be restored: tried on a scratch set, so the live windows are
        never half restored (the store quarantines what this refuses and the agent starts empty)."""
        if not isinstance(saved, dict) or not isinstance(saved.get("identity"), str):
            raise ValueError("not a saved windows document")
        if saved["identity"] == self.runtime.identity:
            WindowSet(self.settings.window_seconds, self.settings.windows.count).restore(saved["windows"])

    # -- observe ----------------------------------------------------------------------------------
    def count_unmatched(self) -> None:
        p = self.pairer
        e0, v0, d0, o0 = self._counted_unmatched
        for reason, new, old in (
            ("expired", p.expired, e0),
            ("evicted", p.evicted, v0),
            ("duplicate", p.duplicates, d0),
            ("overflow", p.overflow, o0),
        ):
            if new > old:
                self.metrics.observe_unmatched.labels(reason).inc(new - old)
        self._counted_unmatched = (p.expired, p.evicted, p.duplicates, p.overflow)

    def enqueue(self, item: ObserveItem) -> None:
        assert self.queue is not None
        if not self.accepting:
            raise ClientError(
                "the agent is shutting down; retry on another replica", status=503, reason="shutting_down"
            )
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.metrics.observe_rejected.inc()
            raise ClientError(
                f"observe queue is full ({self.queue.maxsize} batches); retry later",
                status=429,
                reason="queue_full",
                headers={"Retry-After": "1"},
            ) from None
        self.metrics.observe_queue_length.set(self.queue.qsize())

    def _judge_item(self, item: ObserveItem) -> None:
        rt = self.runtime
        probs = item.probabilities
        labels = rt.labels_of(probs)
        self.pipeline.judge(rt, rt.features(item.x), probs, labels, item.metadata, None, item.id)

    async def _observe_worker(self) -> None:
        assert self.queue is not None
        while True:
            await self.judging.wait()
            item = await self.queue.get()
            try:
                await self.run(self._judge_item, item)
            except Exception:
                log.exception("judging an observed batch failed", extra={"id": item.id})
            finally:
                self.queue.task_done()
                self.metrics.observe_queue_length.set(self.queue.qsize())

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.settings.observe.event_ttl_seconds / 4))
            self.pairer.expire(time.time())
            self.count_unmatched()

    def _state_failed(self, what: str, exc: BaseException) -> None:
        self.metrics.state_write(False, time.time())
        if self._state_ok:
            log.error(
                f"{what}; serving goes on, retrying every flush interval",
                extra={"state_dir": str(self.settings.state_dir), "error": f"{type(exc).__name__}: {exc}"},
            )
        self._state_ok = False

    def _open_store(self) -> bool:
        """Open the state database; a read-only or full directory is counted and logged, not raised."""
        assert self.settings.state_dir is not None
        try:
            self.store = StateStore(
                self.settings.state_dir, lambda what: self.metrics.state_quarantined.labels(what).inc()
            )
        except Exception as exc:
            self.store = None
            self._state_failed("saving state failed: cannot open the state directory", exc)
            return False
        return True

    def save_state_guarded(self) -> bool:
        """Save the windows; a failure (read-only or full state directory) is counted and logged once
        per outage, never raised: serving goes on and the next flush retries."""
        if self.store is None:
            if self.settings.state_dir is None or not self._open_store():
                return False
            if self.windows.total == 0:
                self.restore_state()
        try:
            self.save_state()
        except Exception as exc:
            self._state_failed("saving state failed", exc)
            return False
        self.metrics.state_write(True, time.time())
        if not self._state_ok:
            log.warning("saving state recovered", extra={"state_dir": str(self.settings.state_dir)})
        self._state_ok = True
        return True

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.state.flush_interval_seconds)
            await self.run(self.save_state_guarded)

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        self.loop = asyncio.get_running_loop()
        if s.state_dir is not None and self._open_store():
            self.restore_state()
        if s.mode == "proxy":
            assert s.upstream.url is not None
            self.upstream = UpstreamClient(
                s.upstream.url,
                s.upstream.timeout_seconds,
                max_connections=64,
                max_response_bytes=s.upstream.max_response_bytes,
            )
            await self.refresh_upstream_model(at_start=True)
        if s.mode == "observe":
            self.queue = asyncio.Queue(maxsize=s.observe.queue_size)
            if self.store is not None:
                restored = self.store.take_pending(
                    lambda _kind, a, m: ObserveItem.from_arrays(a, m), s.observe.queue_size
                )
                for item in restored:  # at most the queue's size taken: the rest stays for the next start
                    self.queue.put_nowait(item)
                if self.queue.qsize():
                    log.info(
                        "restored pending observed batches",
                        extra={"batches": self.queue.qsize(), "left_for_next_start": self.store.count_pending()},
                    )
            for _ in range(s.observe.workers):
                self._tasks.append(asyncio.create_task(self._observe_worker()))
            self._tasks.append(asyncio.create_task(self._expiry_loop()))
        if s.mode in ("serve", "proxy"):
            self.pipeline.start_background()
        if s.state_dir is not None:
            self._tasks.append(asyncio.create_task(self._flush_loop()))
        if s.server.metrics_port is not None:
            self._metrics_server = MetricsPortServer(self.registry, self.run)
            await self._metrics_server.start(s.server.host, s.server.metrics_port)
        self.ready = True
        log.info(
            "agent ready",
            extra={
                "mode": s.mode,
                "model": self.runtime.name,
                "version": self.runtime.version,
                "sha256": self.runtime.model_sha256,
            },
        )

    async def stop(self) -> None:
        self.ready = False
        self.accepting = False
        if self.queue is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.queue.join(), timeout=self.settings.server.graceful_timeout_seconds)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self.loop_judge.close()
        await anyio.to_thread.run_sync(self.pipeline.stop_background)  # judge what is still pending
        if self.queue is not None and self.store is not None:
            left = 0
            while not self.queue.empty():
                item = self.queue.get_nowait()
                arrays, meta = item.to_arrays()
                try:
                    self.store.add_pending("observe", arrays, meta)
                except Exception as exc:
                    self.metrics.state_write(False, time.time())
                    log.error("an observed batch could not be saved", extra={"id": item.id, "error": str(exc)})
                    continue
                left += 1
            if left:
                log.info("saved pending observed batches", extra={"batches": left})
        if self.upstream is not None:
            await self.upstream.aclose()
        if self.settings.state_dir is not None:
            self.save_state_guarded()
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.close()
            self.store = None
        if self._metrics_server is not None:
            await self._metrics_server.stop()
            self._metrics_server = None
        log.info("agent stopped; state flushed")

    # -- proxy ------------------------------------------------------------------------------------
    async def refresh_upstream_model(self, at_start: bool = False) -> UpstreamModel:
        """Read the upstream's server and model metadata (at start, on reload, and on the first request
        after a start that could not reach it). At start an unreachable upstream is logged, not raised:
        a sidecar may start before its model server."""
        assert self.upstream is not None
        s = self.settings
        try:
            info = await self.upstream.metadata(s.upstream_model_name, s.upstream.scores_output)
        except UpstreamError as exc:
            if not at_start:
                raise
            log.warning("upstream metadata not read yet; retried on the first request", extra={"error": str(exc)})
            return UpstreamModel()
        if self.upstream_model != info:
            log.info(
                "upstream metadata",
                extra={
                    "server": info.server_name or "unknown",
                    "binary_tensors": info.binary,
                    "inputs": [i["name"] for i in info.inputs],
                    "outputs": info.output_names,
                    "scores_output": info.scores_output,
                },
            )
        self.upstream_model = info
        return info

    async def upstream_info(self) -> UpstreamModel:
        """The upstream's metadata, read now if it could not be read before."""
        info = self.upstream_model
        return info if info is not None else await self.refresh_upstream_model()

    async def reload(self, model_path: str | None, bundle_path: str | None, version: str | None) -> Runtime:
        async with self._reload_lock:
            new = await anyio.to_thread.run_sync(
                lambda: load_runtime(self.settings, model_path=model_path, bundle_path=bundle_path, version=version)
            )
            self.swap_runtime(new)
            if self.upstream is not None:
                await self.refresh_upstream_model(at_start=True)
            log.info(
                "reloaded", extra={"sha256": new.model_sha256, "bundle": new.bundle_digest, "version": new.version}
            )
            return new

    def swap_runtime(self, new: Runtime) -> None:
        """Serve ``new`` from now on: the one place the runtime is replaced (an atomic swap: requests in
        flight keep the runtime they started with). The windows restart when the model or the bundle
        changed (not for a new calibration of the same ones); the model metrics follow."""
        if new.identity != self.runtime.identity:
            self.windows.reset()
        self.runtime = new
        self.metrics.set_model(new.name, new.version, new.model_sha256, new.classes)
        self.metrics.record_window_stats(new.name, new.version, new.bundle_label, stat_items(WindowStats()))


def _with_work(served: ServedRequest, kept: list[JudgeWork]) -> ServedRequest:
    """``served`` carrying the work its ``defer`` kept, to be judged before the answer (commit durability)."""
    return replace(served, work=kept[0]) if kept and served.work is None else served
