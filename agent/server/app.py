"""The sidecar's ASGI application (FastAPI): Open Inference Protocol V2, observe, estimates, metrics.

``create_app(settings, registry)`` loads the model and bundle (raising :class:`agent.errors.UserError`
on a bad file), and returns the app; background work (observe workers, state flushes, the optional
metrics port) starts in the lifespan. Other parts of the agent extend it: pass ``routers`` (e.g. the
audit endpoints under ``/v1/audits``) and register collectors on ``app.state.registry``; the admin
check is :func:`require_admin`, usable as a FastAPI dependency. ``app.state.agent`` is the
:class:`AgentService`.

Errors are always JSON ``{"error": "..."}`` (as V2 specifies); a client mistake is a 4xx and counts in
``icos_invalid_requests_total{reason}``, never a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent import __version__
from agent.config.settings import AgentSettings, admin_token, path_problem
from agent.core import logs
from agent.core.os_threads import name_os_thread_once
from agent.errors import UserError
from agent.estimation.estimators import RECOMMENDED_ESTIMATOR
from agent.judging.pipeline import DecodedRequest, JudgeWork, Pipeline, ServedRequest
from agent.judging.request_io import (
    OUTPUT_LABEL,
    OUTPUT_PROBABILITIES,
    OUTPUT_VERDICT,
    VERDICT_BYTES,
    new_request_id,
    prediction_ids,
    resolve_outputs,
    split_inputs,
)
from agent.judging.runtime import Runtime, load_runtime
from agent.judging.state import StateStore
from agent.judging.windows import WindowSet
from agent.labels.service import LabelService
from agent.model.classifier import InvalidInput, Prediction
from agent.model.source import fetch_model
from agent.protocol import v2
from agent.protocol.v2 import ProtocolError
from agent.server.audits import AuditService
from agent.server.observe import (
    REQUEST,
    EventPairer,
    ObserveItem,
    decode_observation,
    decode_request_event,
    decode_response_event,
    parse_cloudevent,
)
from agent.server.proxy import UpstreamClient, UpstreamError
from exporters.prometheus import AgentMetrics, EstimatePoint, EstimatesCollector, Snapshot, WindowPoint

log = logs.get("app")
JSON = "application/json"


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(json.dumps(obj, separators=(",", ":")), status_code=status, media_type=JSON)


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(v2.error_body(message), status_code=status, media_type=JSON, headers=headers)


class ClientError(Exception):
    """A request the client must fix: answered with ``status`` and counted under ``reason``."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """Rejects bodies over ``limit`` bytes with 413 (by Content-Length, or while streaming)."""

    def __init__(self, app: ASGIApp, limit: int, on_reject: Callable[[], None]) -> None:
        self.app = app
        self.limit = limit
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.limit:
                    await self._reject(send)
                    return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge()
            return message

        try:
            await self.app(scope, limited, send)
        except BodyTooLarge:
            await self._reject(send)

    async def _reject(self, send: Send) -> None:
        self.on_reject()
        await send_too_large(send, self.limit)


async def send_too_large(send: Send, limit: int) -> None:
    """Answer 413: the request body is over ``limit`` bytes."""
    body = v2.error_body(f"request body exceeds the limit of {limit} bytes (server.max_body_bytes)")
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")


def client_error_of(exc: Exception) -> tuple[int, str, str] | None:
    """``(status, reason, message)`` when ``exc`` is the client's mistake, else ``None``."""
    if isinstance(exc, ClientError):
        return exc.status, exc.reason, str(exc)
    if isinstance(exc, ProtocolError):
        return exc.status, exc.reason, str(exc)
    if isinstance(exc, InvalidInput):
        return (413 if exc.reason == "too_large" else 400), exc.reason, str(exc)
    return None


class InferFastPath:
    """Serve-mode ``POST /v2/models/{name}[/versions/{v}]/infer`` handled as plain ASGI.

    :class:`AgentApp` calls it ahead of FastAPI's middleware stack: routing, dependency, exception
    and telemetry layers cost more than a small model's inference. The same route stays declared
    for the OpenAPI document and serves the other modes (and serve mode when FastAPI's native
    OpenTelemetry is enabled, so that traced requests keep their spans). It applies the body limit
    itself, and answers errors exactly as the exception handlers and :class:`BodyLimitMiddleware` do.
    """

    def __init__(self, service: AgentService, limit: int) -> None:
        self.svc = service
        self.limit = limit

    def match(self, scope: Scope) -> re.Match[str] | None:
        if scope["type"] == "http" and scope["method"] == "POST" and self.svc.settings.mode == "serve":
            return _INFER_PATH.match(scope["path"])
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send, m: re.Match[str]) -> None:
        svc = self.svc
        headers = [(b"content-type", JSON.encode())]
        header_length = None
        for k, v in scope["headers"]:
            if k == b"inference-header-content-length":
                header_length = v.decode("latin-1")
            elif k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    declared = -1
                if declared > self.limit:
                    await self._reject(send)
                    return
        try:
            rt = _check_model(svc, m.group(1), m.group(2))
            chunks = []
            received = 0
            more = True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > self.limit:
                    await self._reject(send)
                    return
                chunks.append(chunk)
                more = message.get("more_body", False)
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            content, out_headers = await svc.infer(rt, body, header_length)
            status = 200
            headers = [(k.encode(), v.encode()) for k, v in out_headers.items()]
        except Exception as exc:
            err = client_error_of(exc)
            if err is None:
                log.exception("internal error", exc_info=exc)
                status, content = 500, v2.error_body(f"internal error: {type(exc).__name__}")
            else:
                status, reason, message_text = err
                svc.metrics.invalid(reason)
                content = v2.error_body(message_text)
        headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def _reject(self, send: Send) -> None:
        self.svc.metrics.invalid("too_large")
        await send_too_large(send, self.limit)


class AgentApp(FastAPI):
    """The agent's FastAPI app: serve-mode inference goes to :class:`InferFastPath` first."""

    infer_fast_path: InferFastPath | None = None
    _telemetry_checked = -1.0
    _telemetry_enabled = False

    def telemetry_enabled(self) -> bool:
        """Whether FastAPI's native OpenTelemetry is on (re-checked once a second: the check reads
        the global providers and the environment, which costs more than the rest of the routing)."""
        now = time.monotonic()
        if now - self._telemetry_checked > 1.0:
            telemetry = getattr(self, "_native_telemetry", None)
            self._telemetry_enabled = telemetry is not None and bool(telemetry.enabled())
            self._telemetry_checked = now
        return self._telemetry_enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = self.infer_fast_path
        if fast is not None:
            m = fast.match(scope)
            if m is not None and not self.telemetry_enabled():
                await fast(scope, receive, send, m)
                return
        await super().__call__(scope, receive, send)


#: Serve-mode requests up to this size run on the event loop while they stay cheap (see
#: :meth:`AgentService.infer`); a thread hop costs more than a small model's whole inference.
INLINE_MAX_BYTES = 64 * 1024
INLINE_BUDGET_SECONDS = 0.001
#: Binary-tensor requests up to this size are decoded and answered on the event loop and only their
#: model runs in a worker thread (decoding them is a few small Python steps and one pass over the
#: values); larger ones, and JSON bodies over :data:`INLINE_MAX_BYTES`, run wholly in the threads.
LOOP_DECODE_MAX_BYTES = 4 * 1024 * 1024
#: At most this many predictions are judged in one turn of the event loop (see :class:`LoopJudge`).
LOOP_JUDGE_MAX_SAMPLES = 128


class VerdictBatcher:
    """Judges, in one :meth:`Pipeline.judge_works` call, the works queued during one turn of the event
    loop (used only from the loop's thread).

    The first work of a turn schedules the judging with ``call_soon``, which runs after the
    callbacks and tasks that are already ready: requests whose bodies arrived in the same turn have
    decoded and run their model by then and join the call. A lone request is judged right after it
    queued, with no timer and no added wait. Up to ``max_samples`` predictions, judging runs on the
    loop, like the rest of a small request, and each waiting request gets its CPU share of it; a
    larger call is handed to a worker thread (``run``), so that the loop is not held for
    milliseconds. So is a call that would wait for the judging lock while the background thread
    judges.
    """

    def __init__(
        self, pipeline: Pipeline, run: Callable[..., Awaitable[Any]], max_samples: int = LOOP_JUDGE_MAX_SAMPLES
    ) -> None:
        self.pipeline = pipeline
        self.run = run
        self.max_samples = max_samples
        self._works: list[JudgeWork] = []
        self._waiting: list[asyncio.Future[float]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        #: Calls made, works judged (a work per request) and calls handed to a thread; the tests read them.
        self.calls = 0
        self.works = 0
        self.in_thread = 0

    def judge(self, work: JudgeWork) -> asyncio.Future[float]:
        """Queue a work; the future resolves (to this request's share of the CPU seconds) once judged."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        if not self._works:
            loop.call_soon(self._judge_queued)
        self._works.append(work)
        self._waiting.append(fut)
        return fut

    def _judge_queued(self) -> None:
        works, waiting = self._works, self._waiting
        self._works, self._waiting = [], []
        self.calls += 1
        self.works += len(works)
        if self.pipeline.busy() or sum(len(w.labels) for w in works) > self.max_samples:
            self.in_thread += 1
            task = asyncio.get_running_loop().create_task(self._judge_in_thread(works, waiting))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        _resolve(waiting, _judge_with_cost(self.pipeline, works))

    async def _judge_in_thread(self, works: list[JudgeWork], waiting: list[asyncio.Future[float]]) -> None:
        _resolve(waiting, await self.run(_judge_with_cost, self.pipeline, works))


def _judge_with_cost(pipeline: Pipeline, works: list[JudgeWork]) -> float:
    """Judge the works (each gets its verdicts or its error); each one's share of the CPU seconds."""
    t0 = time.thread_time()
    pipeline.judge_works(works)
    return (time.thread_time() - t0) / max(1, len(works))


def _resolve(waiting: list[asyncio.Future[float]], share: float) -> None:
    for fut in waiting:
        if not fut.done():  # the request may have been cancelled (client gone)
            fut.set_result(share)


def _in_worker(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` in a worker thread named ``icos-worker`` for the OS (see :mod:`agent.core.os_threads`)."""
    name_os_thread_once("icos-worker")
    return fn(*args)


def _model_with_cost(pipeline: Pipeline, decoded: DecodedRequest) -> tuple[Prediction, float, float]:
    """:meth:`Pipeline.serve_model` plus the CPU time it took on the calling (worker) thread."""
    t0 = time.thread_time()
    pred, seconds = pipeline.serve_model(decoded)
    return pred, seconds, time.thread_time() - t0


class LoopJudge:
    """Judges the predictions of small serve-mode requests that do not wait for their verdicts on the
    event loop, in one :meth:`Pipeline.try_judge_pending` call per ``pipeline.linger_seconds``
    (used only from the loop's thread).

    Such requests run on the loop already (see :meth:`AgentService.infer`). Judging their
    predictions there too, a few dozen at a time, spares the hand-over to the background thread:
    each wake-up of that thread and each contended GIL switch costs as much as judging a few
    predictions. At most ``max_samples`` predictions are judged in one loop turn (about 0.5 ms with
    the shipped CNN's bundle); when more wait, the background thread judges them, off the loop.
    The works sit in the pipeline's pending list, so :meth:`Pipeline.flush` (labels, shutdown)
    judges them like any other.
    """

    def __init__(self, pipeline: Pipeline, max_samples: int) -> None:
        self.pipeline = pipeline
        self.max_samples = max_samples
        self._timer: asyncio.TimerHandle | None = None
        #: Calls that judged on the loop, and hand-overs to the background thread (the tests read them).
        self.calls = 0
        self.handed_over = 0

    def add(self, work: JudgeWork) -> None:
        if self.pipeline.judge_soon(work) > self.max_samples:
            self.handed_over += 1
            self.pipeline.wake()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.pipeline.linger_seconds, self._run)

    def _run(self) -> None:
        self._timer = None
        if self.pipeline.pending_samples() > self.max_samples:  # e.g. large requests' work queued meanwhile
            self.handed_over += 1
            self.pipeline.wake()
        elif self.pipeline.try_judge_pending():
            self.calls += 1
        else:  # the background thread is judging: look again after another linger period
            self._timer = asyncio.get_running_loop().call_later(self.pipeline.linger_seconds, self._run)

    def close(self) -> None:
        """Cancel the pending call (what is queued stays pending for :meth:`Pipeline.flush`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


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
        registry.register(EstimatesCollector(self.snapshot))
        self.limiter = anyio.CapacityLimiter(settings.server.threads)
        #: Moving average of the cost of small serve-mode requests (see :meth:`infer`).
        self._inline_cost = 0.0
        #: Judges the verdict-requesting requests of one event-loop turn together (see :meth:`infer`).
        self.verdicts = VerdictBatcher(self.pipeline, self.run)
        #: Judges small requests' predictions on the loop (see :meth:`infer`).
        self.loop_judge = LoopJudge(self.pipeline, LOOP_JUDGE_MAX_SAMPLES)
        self.admin_token = admin_token()
        self.ready = False
        self.store: StateStore | None = None
        self.upstream: UpstreamClient | None = None
        self.queue: asyncio.Queue[ObserveItem] | None = None
        self.pairer = EventPairer(settings.observe.event_ttl_seconds, settings.observe.event_buffer)
        self._counted_unmatched = (0, 0, 0)
        self._tasks: list[asyncio.Task[None]] = []
        self._reload_lock = asyncio.Lock()
        self._metrics_server: Any = None
        self.accepting = True
        #: Observe workers judge only while this is set (cleared to hold judging, e.g. for maintenance).
        self.judging = asyncio.Event()
        self.judging.set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._state_ok = True
        #: Extra per-window sections of ``/v1/estimates``: each returns ``{window: {section: value}}``
        #: (e.g. the realized accuracy from delayed labels, :mod:`agent.labels.service`).
        self.estimate_sections: list[Callable[[Runtime, float], Mapping[str, Mapping[str, Any]]]] = []

    # -- threads ----------------------------------------------------------------------------------
    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in one of the worker threads (``server.threads`` at most)."""
        return await anyio.to_thread.run_sync(_in_worker, fn, *args, limiter=self.limiter)

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
        if small and self._inline_cost < INLINE_BUDGET_SECONDS:
            t0 = time.thread_time()
            served = self.pipeline.serve_predict(rt, body, header_length, self.loop_judge.add)
            return await self._answer(served, time.thread_time() - t0, small)
        if small or (header_length is not None and len(body) <= LOOP_DECODE_MAX_BYTES):
            return await self._infer_model_in_thread(rt, body, header_length, small)
        return await self.run(self.pipeline.serve_infer, rt, body, header_length)  # type: ignore[no-any-return]

    async def _infer_model_in_thread(
        self, rt: Runtime, body: bytes, header_length: str | None, small: bool
    ) -> tuple[bytes, dict[str, str]]:
        """Decode on the loop, run the model in a worker thread, judge (when asked) and answer on the
        loop. The worker threads then hold the GIL only to enter and leave onnxruntime: with many
        requests in flight, threads that also decoded and encoded would queue for the GIL behind each
        other and behind the loop. A small request's cost still feeds the inline moving average, so
        small requests return to the loop once the model is cheap again."""
        t0 = time.thread_time()
        decoded = self.pipeline.serve_decode(rt, body, header_length)
        cost = time.thread_time() - t0
        pred, seconds, model_cost = await self.run(_model_with_cost, self.pipeline, decoded)
        t1 = time.thread_time()
        served = self.pipeline.serve_accept(decoded, pred, seconds)
        return await self._answer(served, cost + model_cost + time.thread_time() - t1, small)

    async def _answer(self, served: ServedRequest, cost: float, small: bool) -> tuple[bytes, dict[str, str]]:
        """Judge the request (when it asked for verdicts, see :class:`VerdictBatcher`) and answer it.
        A small request's CPU time (``cost``, its CPU seconds so far, plus this) feeds the inline
        moving average; CPU times only, since other tasks run on the loop while it waits."""
        if served.work is not None:
            cost += await self.verdicts.judge(served.work)
        t0 = time.thread_time()
        try:
            return self.pipeline.serve_respond(served)
        finally:
            if small:
                self._inline_cost += 0.05 * (cost + time.thread_time() - t0 - self._inline_cost)

    # -- estimates --------------------------------------------------------------------------------
    def estimates(self) -> dict[str, Any]:
        rt = self.runtime
        now = time.time()
        windows = {}
        for name, (stats, ests) in self.windows.estimates(rt.calibration, now).items():
            windows[name] = {
                "n": stats.n,
                "fails": stats.fails,
                "fails_by_family": dict(stats.fails_by_family),
                "estimates": {k: e.to_dict() for k, e in ests.items()},
            }
        for section in self.estimate_sections:
            for name, extra in section(rt, now).items():
                if name in windows:
                    windows[name].update(extra)
        return {
            "model": {"name": rt.name, "version": rt.version, "sha256": rt.model_sha256},
            "headline": RECOMMENDED_ESTIMATOR,
            "total_judged": self.windows.total,
            "windows": windows,
            "oracle": {"tpr": rt.calibration.tpr, "fpr": rt.calibration.fpr},
            "timestamp": now,
        }

    def snapshot(self) -> Snapshot | None:
        rt = self.runtime
        points: list[EstimatePoint] = []
        wpoints: list[WindowPoint] = []
        for name, (stats, ests) in self.windows.estimates(rt.calibration, time.time()).items():
            wpoints.append(WindowPoint(name, stats.n, dict(stats.fails_by_family)))
            for est, e in ests.items():
                points.append(EstimatePoint(est, name, e.value, e.lower, e.upper, e.n))
        cal = rt.calibration
        return Snapshot(rt.name, rt.version, points, wpoints, cal.tpr, cal.fpr, cal.n_wrong, cal.n_right)

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
        saved = self.store.get_json(self._state_key())
        if saved and saved.get("identity") == self.runtime.identity:
            self.windows.restore(saved["windows"])
            log.info("restored estimator windows", extra={"judged": self.windows.total})
        elif saved:
            log.info("saved windows belong to another model or bundle; starting empty")

    # -- observe ----------------------------------------------------------------------------------
    def count_unmatched(self) -> None:
        p = self.pairer
        e0, v0, d0 = self._counted_unmatched
        for reason, new, old in (
            ("expired", p.expired, e0),
            ("evicted", p.evicted, v0),
            ("duplicate", p.duplicates, d0),
        ):
            if new > old:
                self.metrics.observe_unmatched.labels(reason).inc(new - old)
        self._counted_unmatched = (p.expired, p.evicted, p.duplicates)

    def enqueue(self, item: ObserveItem) -> None:
        assert self.queue is not None
        if not self.accepting:
            raise ClientError(503, "shutting_down", "the agent is shutting down; retry on another replica")
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.metrics.observe_rejected.inc()
            raise ClientError(
                429, "queue_full", f"observe queue is full ({self.queue.maxsize} batches); retry later"
            ) from None
        self.metrics.observe_queue_length.set(self.queue.qsize())

    def _judge_item(self, item: ObserveItem) -> None:
        rt = self.runtime
        probs = item.probabilities
        labels = probs.argmax(axis=1).astype(np.int64)
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
            self.store = StateStore(self.settings.state_dir)
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
            self.upstream = UpstreamClient(s.upstream.url, s.upstream.timeout_seconds, max_connections=64)
        if s.mode == "observe":
            self.queue = asyncio.Queue(maxsize=s.observe.queue_size)
            if self.store is not None:
                for _kind, arrays, meta in self.store.take_pending():
                    with contextlib.suppress(asyncio.QueueFull):
                        self.queue.put_nowait(ObserveItem.from_arrays(arrays, meta))
                if self.queue.qsize():
                    log.info("restored pending observed batches", extra={"batches": self.queue.qsize()})
            for _ in range(s.observe.workers):
                self._tasks.append(asyncio.create_task(self._observe_worker()))
            self._tasks.append(asyncio.create_task(self._expiry_loop()))
        if s.mode == "serve":
            self.pipeline.start_background()
        if s.state_dir is not None:
            self._tasks.append(asyncio.create_task(self._flush_loop()))
        if s.server.metrics_port is not None:
            from prometheus_client import start_http_server

            self._metrics_server = start_http_server(s.server.metrics_port, addr=s.server.host, registry=self.registry)
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
            server = self._metrics_server[0] if isinstance(self._metrics_server, tuple) else self._metrics_server
            with contextlib.suppress(Exception):
                server.shutdown()
                server.server_close()
        log.info("agent stopped; state flushed")

    async def reload(self, model_path: str | None, bundle_path: str | None, version: str | None) -> Runtime:
        async with self._reload_lock:
            new = await anyio.to_thread.run_sync(
                lambda: load_runtime(self.settings, model_path=model_path, bundle_path=bundle_path, version=version)
            )
            old = self.runtime
            if new.identity != old.identity:
                self.windows.reset()
            self.runtime = new  # atomic swap: requests in flight keep the runtime they started with
            self.metrics.set_model(new.name, new.version, new.model_sha256, new.classes)
            log.info(
                "reloaded", extra={"sha256": new.model_sha256, "bundle": new.bundle_digest, "version": new.version}
            )
            return new


def require_admin(request: Request) -> None:
    """FastAPI dependency: a valid ``Authorization: Bearer <ICOS_AGENT_ADMIN_TOKEN>`` header."""
    svc: AgentService = request.app.state.agent
    if svc.admin_token is None:
        raise ClientError(404, "admin_disabled", "admin endpoints are disabled: set ICOS_AGENT_ADMIN_TOKEN to enable")
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ClientError(401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)")
    if not hmac.compare_digest(token.strip().encode(), svc.admin_token.encode()):
        raise ClientError(403, "forbidden", "invalid bearer token")


def _check_model(svc: AgentService, name: str, version: str | None) -> Runtime:
    rt = svc.runtime
    if name != rt.name:
        raise ClientError(404, "unknown_model", f"unknown model {name!r}; this agent serves {rt.name!r}")
    if version is not None and version != rt.version:
        raise ClientError(
            404, "unknown_model", f"unknown version {version!r} of model {name!r}; serving {rt.version!r}"
        )
    return rt


def _model_metadata(rt: Runtime) -> dict[str, Any]:
    k = len(rt.classes)
    inputs = [{"name": rt.input_name or "input", "datatype": "FP32", "shape": [-1, *rt.input_shape]}]
    if rt.classifier is not None:
        inputs[0]["datatype"] = v2.datatype_of(np.zeros(0, dtype=rt.classifier.input.dtype))
    for f in sorted(rt.metadata_fields):
        inputs.append({"name": f, "datatype": "BYTES", "shape": [-1]})
    return {
        "name": rt.name,
        "versions": [rt.version],
        "platform": "onnxruntime_onnx" if rt.classifier is not None else f"icos_{rt.mode}",
        "inputs": inputs,
        "outputs": [
            {"name": OUTPUT_PROBABILITIES, "datatype": "FP32", "shape": [-1, k]},
            {"name": OUTPUT_LABEL, "datatype": "INT64", "shape": [-1]},
            {"name": OUTPUT_VERDICT, "datatype": "BYTES", "shape": [-1]},
        ],
        "parameters": {
            "icos_mode": rt.mode,
            "icos_model_sha256": rt.model_sha256,
            "icos_metadata_fields": ",".join(sorted(rt.metadata_fields)),
            "icos_classes": ",".join(rt.classes),
        },
    }


def _proxy_judge(
    svc: AgentService,
    rt: Runtime,
    req: v2.InferRequest,
    split_meta: dict[str, Any] | None,
    x: np.ndarray,
    body: bytes,
    header_length: str | None,
    seconds: float,
) -> tuple[bytes, dict[str, str]]:
    try:
        resp = v2.decode_response(body, header_length)
    except ProtocolError as exc:
        raise UpstreamError(502, "bad_response", f"upstream answered an unreadable response: {exc}") from None
    from agent.server.observe import _probabilities

    try:
        probs = _probabilities(rt, resp.outputs, svc.settings.upstream.scores_output, "upstream response")
    except ProtocolError as exc:
        raise UpstreamError(502, "bad_response", str(exc)) from None
    n = x.shape[0]
    if probs.shape[0] != n:
        raise UpstreamError(502, "bad_response", f"upstream returned {probs.shape[0]} predictions for {n} inputs")
    labels = probs.argmax(axis=1).astype(np.int64)
    rid = req.id or resp.id or new_request_id()
    verdicts = svc.pipeline.judge(rt, rt.features(x), probs, labels, split_meta, seconds, rid)
    upstream_outputs = {t.name: t for t in resp.outputs if t.name != OUTPUT_VERDICT}
    computed = {
        OUTPUT_PROBABILITIES: lambda: v2.tensor(OUTPUT_PROBABILITIES, probs, "FP32"),
        OUTPUT_LABEL: lambda: v2.tensor(OUTPUT_LABEL, labels, "INT64"),
    }
    available = [*upstream_outputs, *[k for k in computed if k not in upstream_outputs], OUTPUT_VERDICT]
    if req.outputs is None:
        wanted = [(name, req.binary_output) for name in [*upstream_outputs, OUTPUT_VERDICT]]
    else:
        wanted = resolve_outputs(req.outputs, available, req.binary_output)
    out = []
    for name, binary in wanted:
        if name == OUTPUT_VERDICT:
            out.append((v2.tensor(OUTPUT_VERDICT, VERDICT_BYTES[verdicts], "BYTES"), binary))
        elif name in upstream_outputs:
            t = upstream_outputs[name]
            out.append((v2.Tensor(t.name, t.datatype, t.shape, t.data), binary))
        else:
            out.append((computed[name](), binary))
    params = {k: v for k, v in resp.parameters.items() if isinstance(v, str | int | float | bool)}
    params["icos_prediction_ids"] = prediction_ids(rid, n)
    return v2.encode_response(rt.name, rt.version, rid, out, params)


def _proxy_prepare(rt: Runtime, body: bytes, header_length: str | None) -> tuple[Any, ...]:
    from agent.judging.request_io import attach_metadata

    req = v2.decode_request(body, header_length, max_elements=rt.max_elements)
    split = split_inputs(rt, req.inputs, req.parameters)
    x = rt.prepare(split.data.data)
    meta = attach_metadata(split, x.shape[0])
    # Forward only the model input, in the client's encoding; ask for every output.
    params = {k: v for k, v in req.parameters.items() if k not in rt.metadata_fields and k != "binary_data_output"}
    if req.used_binary:
        params["binary_data_output"] = True
    fwd_body, fwd_headers = v2.encode_request(
        [split.data], binary=req.used_binary, request_id=req.id, parameters=params
    )
    return req, meta, x, fwd_body, fwd_headers


def _ids(request_id: str, n: int) -> list[str]:
    """Prediction ids of an observed batch (as in ``icos_prediction_ids``), for delayed labels."""
    return [f"{request_id}:{i}" for i in range(n)]


def _build_router(svc: AgentService) -> APIRouter:
    r = APIRouter()

    @r.get("/v2", summary="V2 server metadata")
    async def server_metadata() -> Response:
        return json_response(
            {"name": "icos-agent", "version": __version__, "extensions": ["binary_tensor_data", "icos_verdict"]}
        )

    @r.get("/v2/health/live", summary="V2 liveness")
    async def live() -> Response:
        return json_response({"live": True})

    @r.get("/v2/health/ready", summary="V2 readiness: model and bundle loaded")
    async def ready() -> Response:
        return json_response({"ready": svc.ready}, 200 if svc.ready else 503)

    async def model_metadata(name: str, version: str | None = None) -> Response:
        return json_response(_model_metadata(_check_model(svc, name, version)))

    async def model_ready(name: str, version: str | None = None) -> Response:
        rt = _check_model(svc, name, version)
        return json_response({"name": rt.name, "ready": svc.ready}, 200 if svc.ready else 503)

    async def infer(request: Request, name: str, version: str | None = None) -> Response:
        rt = _check_model(svc, name, version)
        if svc.settings.mode == "observe":
            raise ClientError(
                404, "mode", "inference is not served in observe mode; send predictions to POST /v1/observe"
            )
        body = await request.body()
        header_length = request.headers.get(v2.HEADER_LENGTH)
        if svc.settings.mode == "serve":
            content, headers = await svc.run(svc.pipeline.serve_infer, rt, body, header_length)
            return Response(content, headers=headers)
        assert svc.upstream is not None
        req, meta, x, fwd_body, fwd_headers = await svc.run(_proxy_prepare, rt, body, header_length)
        t0 = time.perf_counter()
        up_body, up_len = await svc.upstream.infer(svc.settings.upstream_model_name, fwd_body, fwd_headers)
        seconds = time.perf_counter() - t0
        content, headers = await svc.run(_proxy_judge, svc, rt, req, meta, x, up_body, up_len, seconds)
        return Response(content, headers=headers)

    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        r.add_api_route(prefix, model_metadata, methods=["GET"], summary="V2 model metadata")
        r.add_api_route(prefix + "/ready", model_ready, methods=["GET"], summary="V2 model readiness")
        r.add_api_route(prefix + "/infer", infer, methods=["POST"], summary="V2 inference (JSON or binary tensors)")

    @r.post("/v1/observe", summary="Observe mode: judge predictions made elsewhere (JSON or CloudEvents)")
    async def observe(request: Request) -> Response:
        if svc.settings.mode != "observe":
            raise ClientError(
                404, "mode", f"/v1/observe is only available in observe mode (this agent: {svc.settings.mode})"
            )
        body = await request.body()
        rt = svc.runtime
        headers = {k.lower(): v for k, v in request.headers.items()}
        event = parse_cloudevent(headers, body)
        scores_output = svc.settings.upstream.scores_output
        if event is None:
            item = await svc.run(decode_observation, rt, body, scores_output)
            svc.enqueue(item)
            n = int(item.x.shape[0])
            return json_response({"id": item.id, "accepted": n, "prediction_ids": _ids(item.id, n)}, 202)
        svc.metrics.observe_events.labels(event.kind).inc()
        if event.kind == REQUEST:
            value = await svc.run(decode_request_event, rt, event.data)
        else:
            value = await svc.run(decode_response_event, rt, event.data, scores_output)
        pair = svc.pairer.add(event.id, event.kind, value, time.time())
        svc.count_unmatched()
        if pair is None:
            return json_response({"id": event.id, "paired": False}, 202)
        (x, meta), probs = pair
        if probs.shape[0] != x.shape[0]:
            raise ClientError(
                400, "shape_mismatch", f"event {event.id}: {x.shape[0]} inputs but {probs.shape[0]} probability vectors"
            )
        svc.enqueue(ObserveItem(event.id, x, probs, meta, time.time()))
        n = int(x.shape[0])
        return json_response({"id": event.id, "paired": True, "accepted": n, "prediction_ids": _ids(event.id, n)}, 202)

    @r.get("/v1/estimates", summary="Live accuracy estimates per window with 95% intervals")
    async def estimates() -> Response:
        return json_response(await svc.run(svc.estimates))

    @r.post("/v1/reload", summary="Admin: reload model and bundle atomically (bearer token)")
    async def reload(request: Request) -> Response:
        require_admin(request)
        body = await request.body()
        opts: dict[str, Any] = {}
        if body.strip():
            try:
                opts = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                raise ClientError(400, "malformed_json", "reload body must be JSON") from None
            if not isinstance(opts, dict) or set(opts) - {"model_path", "bundle_path", "version"}:
                raise ClientError(400, "malformed_json", "reload body may hold model_path, bundle_path and version")
        for key in ("model_path", "bundle_path", "version"):
            value = opts.get(key)
            if value is not None and not isinstance(value, str):
                raise ClientError(400, "malformed_json", f"reload: {key} must be a string")
            if value is None or key == "version":
                continue
            problem = path_problem(value, svc.settings.security.allowed_roots)
            if problem:
                raise ClientError(403, "forbidden_path", f"reload refused, still serving the previous model: {problem}")
        try:
            rt = await svc.reload(opts.get("model_path"), opts.get("bundle_path"), opts.get("version"))
        except UserError as exc:
            raise ClientError(400, "reload", f"reload failed, still serving the previous model: {exc}") from None
        return json_response({"reloaded": True, "model": rt.describe()})

    @r.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        data = await svc.run(generate_latest, svc.registry)
        return Response(data, media_type=CONTENT_TYPE_LATEST)

    return r


def _install_error_handlers(app: FastAPI, svc: AgentService) -> None:
    def client_error(status: int, reason: str, message: str) -> Response:
        svc.metrics.invalid(reason)
        return error_response(status, message)

    async def on_client(_r: Request, exc: Exception) -> Response:
        assert isinstance(exc, ClientError)
        return client_error(exc.status, exc.reason, str(exc))

    async def on_protocol(_r: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProtocolError)
        return client_error(exc.status, exc.reason, str(exc))

    async def on_invalid(_r: Request, exc: Exception) -> Response:
        assert isinstance(exc, InvalidInput)
        return client_error(413 if exc.reason == "too_large" else 400, exc.reason, str(exc))

    async def on_upstream(_r: Request, exc: Exception) -> Response:
        assert isinstance(exc, UpstreamError)
        if exc.reason == "client_error":
            return client_error(exc.status, "upstream_rejected", str(exc))
        svc.metrics.upstream_errors.labels(exc.reason).inc()
        return error_response(exc.status, str(exc))

    async def on_http(_r: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
        if exc.status_code < 500:
            svc.metrics.invalid(reason)
        return error_response(exc.status_code, str(exc.detail), dict(exc.headers or {}))

    async def on_other(_r: Request, exc: Exception) -> Response:
        log.exception("internal error", exc_info=exc)
        return error_response(500, f"internal error: {type(exc).__name__}")

    app.add_exception_handler(ClientError, on_client)
    app.add_exception_handler(ProtocolError, on_protocol)
    app.add_exception_handler(InvalidInput, on_invalid)
    app.add_exception_handler(UpstreamError, on_upstream)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_other)


def create_app(
    settings: AgentSettings,
    registry: CollectorRegistry | None = None,
    *,
    routers: Sequence[APIRouter] = (),
    on_startup: Sequence[Callable[[FastAPI], Awaitable[None]]] = (),
    on_shutdown: Sequence[Callable[[FastAPI], Awaitable[None]]] = (),
    runtime: Runtime | None = None,
) -> FastAPI:
    """Build the sidecar app; loads the model and bundle now (raises :class:`UserError`)."""
    registry = registry if registry is not None else CollectorRegistry()
    rt = runtime or load_runtime(fetch_model(settings))
    svc = AgentService(settings, registry, rt)
    audits = AuditService(settings.audits, svc, settings.state_dir)
    labels = LabelService(settings.labels, svc, settings.state_dir)
    routers = [*routers, audits.router(), labels.router()]
    on_startup = [*on_startup, audits.start, labels.start]
    on_shutdown = [labels.stop, audits.stop, *on_shutdown]

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await svc.start()
        for hook in on_startup:
            await hook(app)
        try:
            yield
        finally:
            for hook in on_shutdown:
                await hook(app)
            await svc.stop()

    app = AgentApp(
        title="icos-agent",
        version=__version__,
        description="Judges live predictions with ICOS likely invariants; Open Inference Protocol V2.",
        lifespan=lifespan,
    )
    app.state.agent = svc
    app.state.audits = audits
    app.state.labels = labels
    app.state.registry = registry
    app.state.settings = settings
    _install_error_handlers(app, svc)
    app.include_router(_build_router(svc))
    for router in routers:
        app.include_router(router)
    app.infer_fast_path = InferFastPath(svc, settings.server.max_body_bytes)
    app.add_middleware(
        BodyLimitMiddleware, limit=settings.server.max_body_bytes, on_reject=lambda: svc.metrics.invalid("too_large")
    )
    return app
