"""The composition root of a serving agent: every part built once, its collaborators passed at
construction, and the order in which the parts start and stop.

Read top to bottom, :class:`Agent` says who sees what: the recorder hands judged predictions to the
prediction store's sampler and live inputs to the audits' reservoir; the dataplane runs the mode
(serve, proxy, observe) under the serving policy (placement, and recording batched or committed);
observe mode's intake records through the same judge queue; the report reads the windows and the
realized windows of delayed labels; the companions (:mod:`agent.judging.companions`: a challenger, when
configured, :mod:`agent.dataplane.challenger`) see the judged requests first and hand on to the sample those
they keep; the composition iterates them, never asking which kind it holds. What differs between the modes
is asked of the mode (:class:`~agent.dataplane.modes.Mode`: what it starts and stops, what follows a reload,
whether the agent runs the model), never which mode it is; the label budget's boost runs on its own timer
(:mod:`agent.labels.boost`), not inside a scrape.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from prometheus_client import CollectorRegistry

from agent.config.settings import AgentSettings, admin_token, labels_token
from agent.core import logs, memory
from agent.core.os_threads import name_os_thread_once
from agent.core.tasks import cancel_all
from agent.dataplane.challenger import challengers_of
from agent.dataplane.modes import Mode, ObserveMode, ServeMode
from agent.dataplane.observe_intake import ObserveIntake
from agent.dataplane.plane import DataPlane
from agent.dataplane.policy import BatchedRecording, CommitRecording, Recording, ServingPolicy
from agent.dataplane.proxy import ProxyMode
from agent.dataplane.runtimes import RuntimeHolder
from agent.judging.companions import Companion, PendingBeside
from agent.judging.loop import LoopRecorder, VerdictBatcher
from agent.judging.queue import JudgeQueue
from agent.judging.recorder import JudgedBatch, Recorder
from agent.judging.runtime import Runtime
from agent.judging.window_state import WindowState
from agent.judging.windows import WindowSet
from agent.labels.boost import BudgetBoost
from agent.labels.intake import LabelIntake
from agent.labels.recalibration import Recalibrator
from agent.labels.rows import LabelOutcome
from agent.labels.sample import LabelingSample, open_prediction_store
from agent.labels.service import LabelService
from agent.labels.tracker import RealizedTracker
from agent.server.access import FailureThrottle, TokenGate
from agent.server.audit_jobs import AuditJobs
from agent.server.body_budget import BodyBudget
from agent.server.listeners import Listeners
from agent.server.metrics_port import MetricsPortServer
from agent.server.window_report import WindowReport
from exporters.label_metrics import LabelMetrics, RealizedCollector
from exporters.prometheus import AgentMetrics, EstimatesCollector, Snapshot
from exporters.upstream_metrics import UpstreamMetrics

if TYPE_CHECKING:
    from agent.server.grpc_server import GrpcService

log = logs.get("app")


class Agent:
    """Every part of one serving agent, and its lifecycle (:meth:`start`, :meth:`stop`)."""

    def __init__(
        self, settings: AgentSettings, registry: CollectorRegistry, runtime: Runtime, listeners: Listeners | None = None
    ) -> None:
        s = settings
        self.settings = settings
        self.registry = registry
        #: Ports bound before the start (``icos-agent serve``); without them each server binds its own.
        self.listeners = listeners if listeners is not None else Listeners()
        self._build_access()
        self.metrics = AgentMetrics(registry, per_class_label_cap=s.metrics.per_class_label_cap)
        self.windows = WindowSet(s.window_seconds, s.windows.count)
        self.runtimes = RuntimeHolder(runtime, s, self.windows, self.metrics, self._after_reload)
        self.audits = AuditJobs(
            s.audits, registry, lambda: self.runtimes.current, s.state_dir, lambda: self.window_state.store
        )
        self._build_labels()
        self._build_dataplane()
        self.window_state = WindowState(
            s.state_dir,
            self.windows,
            self.metrics,
            s.model.name,
            lambda: self.runtimes.current.identity,
            lambda: WindowSet(s.window_seconds, s.windows.count),
        )
        self.report = WindowReport(
            self.windows,
            labeled=self.realized.labeled_sums,
            section=self.realized.section,
            segment_labels=self.realized.segment_labels,
            per_class_cap=self.metrics.per_class_label_cap,
            companions=self.companions,
            segments_seen=lambda cal, rows: self.sample.draw_policy.on_segments(cal, rows),
        )
        registry.register(EstimatesCollector(self._estimates_snapshot))
        #: True from the end of :meth:`start` to the beginning of :meth:`stop`.
        self.started = False
        #: The event loop the agent runs in (set at start).
        self.loop: asyncio.AbstractEventLoop | None = None
        self._metrics_server: MetricsPortServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: The V2 gRPC service on ``server.grpc_port`` (grpc is imported only when the port is set);
        #: started after the agent's own parts and stopped before them.
        self.grpc: GrpcService | None = self._grpc_service()

    def _build_access(self) -> None:
        """Bearer tokens (one throttle of failed guesses per client for both), the worker threads'
        limit and the budget of request bodies held at once."""
        s = self.settings
        throttle = FailureThrottle()
        self.admin_gate = TokenGate({"admin": admin_token()}, throttle)
        labeler = labels_token()
        self.labels_gate = TokenGate({"labels": labeler, "admin": admin_token() if labeler else None}, throttle)
        self.limiter = anyio.CapacityLimiter(s.server.threads)
        #: bytes of request bodies held at once, HTTP and gRPC; memory handed back after a burst
        self.body_budget = BodyBudget(s.server.max_inflight_bytes, on_idle_after_burst=self._hand_back_memory)
        self._handing_back = threading.Lock()

    def _build_labels(self) -> None:
        """The recorder and its judge queue, the prediction store and its labeling sample (boosted on a
        timer, :mod:`agent.labels.boost`), and the delayed labels: in through the intake (which waits for
        predictions still on their way instead of draining the judge queue), into the realized windows;
        recalibration refits from the store."""
        s, registry = self.settings, self.registry
        self.label_metrics = LabelMetrics(registry)
        self.store = open_prediction_store(s.labels, s.state_dir, self.label_metrics)
        self.sample = LabelingSample.of(
            s.labels, self.store, self.label_metrics, keep_probabilities=s.challenger.enabled
        )
        self.boost = BudgetBoost(self.sample, self.windows, lambda: self.runtimes.current, s.labels.budget_seconds)
        #: What runs beside the serving path (a challenger): each sees the judged requests first.
        self.companions = self._build_companions()
        recorder = Recorder(
            self.windows,
            self.metrics,
            judged_group_sinks=[self._hand_over] if s.labels.enabled or self.companions else [],
            input_sinks=[self.audits.observe_inputs] if self.audits.reservoir is not None else [],
        )
        self.judge_queue = JudgeQueue(recorder)
        pending = PendingBeside(self.judge_queue, self.companions)
        # answered but not committed, at scrape time: queued for the store, or still in the judge queue
        self.label_metrics.store_queued.set_function(lambda: self.store.queued + self.judge_queue.pending_samples())
        self.realized = RealizedTracker(s, self.store, self.runtimes)
        registry.register(RealizedCollector(self.realized.snapshot))
        recalibrator = Recalibrator(s.labels, self.store, self.runtimes, self.label_metrics, self.run)
        intake = LabelIntake(
            s.labels,
            self.store,
            self.runtimes,
            pending,
            self.label_metrics,
            self.run,
            on_accepted=self.realized.add_accepted,
            on_labeled=self._on_labeled,
            worth=self.sample.draw_policy.worth_of(),
        )
        self.labels = LabelService(
            s.labels, self.store, self.runtimes, intake, self.realized, recalibrator, self.label_metrics, self.run
        )

    def _on_labeled(self, labels: list[tuple[str, int]], outcome: LabelOutcome) -> None:
        """Labels the store applied: the labeling sample learns from the accepted ones (stratified draws,
        segments' realized figures) and a challenger's drawn disagreements get their outcome."""
        refused = {*outcome.unknown, *outcome.duplicate}
        self.sample.labeled([(pid, label) for pid, label in labels if pid not in refused])
        for companion in self.companions:
            companion.on_labels(labels, outcome)

    def _build_companions(self) -> list[Companion]:
        """Every companion of the settings, built here and nowhere else, with its collectors registered: the
        challenger of ``challenger:`` settings (handing its requests on to the labeling sample, with delayed
        labels)."""
        s = self.settings
        forward = self.sample.on_judged if s.labels.enabled else None
        companions = [*challengers_of(s, self.registry, self.runtimes.current, forward)]
        for companion in companions:
            for collector in companion.collectors(lambda: self.runtimes.current):
                self.registry.register(collector)
        return companions

    def _hand_over(self, batches: Sequence[JudgedBatch]) -> None:
        """The judged requests of one recording call (called while recording: only enqueues): to every
        companion in turn, then those none kept to the labeling sample, drawn together."""
        for companion in self.companions:
            batches = companion.take_judged(batches)
        if batches and self.settings.labels.enabled:
            self.sample.on_judged_group(batches)

    def _build_dataplane(self) -> None:
        """How predictions are recorded (committed before the answer, or batched), the mode and the
        dataplane that runs it under the serving policy."""
        s = self.settings
        self.loop_recorder = LoopRecorder(self.judge_queue)
        self.verdicts = VerdictBatcher(self.run)
        recording: Recording = (
            CommitRecording(self.judge_queue, self.labels.acknowledge)
            if s.labels.enabled and s.labels.durability == "commit"
            else BatchedRecording(
                self.verdicts,
                self.loop_recorder,
                self.judge_queue,
                s.judging.sample_rate,
                self.metrics.unjudged.inc,
            )
        )
        #: Observe mode's intake of ``POST /v1/observe`` (None in the other modes).
        self.observe = (
            ObserveIntake(s, self.runtimes, self.judge_queue, self.metrics, self.run, recording)
            if s.mode == "observe"
            else None
        )
        self.mode = mode_of(s, self.registry, self.observe)
        self.policy = ServingPolicy(self.run, recording, has_model=self.mode.runs_model)
        self.plane = DataPlane(self.runtimes, self.mode, self.policy)

    def _grpc_service(self) -> GrpcService | None:
        srv = self.settings.server
        if srv.grpc_port is None:
            return None
        from agent.server.grpc_server import GrpcService

        return GrpcService(
            self.plane,
            self.metrics,
            self.ready,
            srv.max_body_bytes,
            srv.limit_concurrency,
            self.body_budget,
            body_timeout=srv.body_timeout_seconds,
        )

    async def _after_reload(self) -> None:
        await self.mode.after_reload()

    def _estimates_snapshot(self) -> Snapshot:
        """The estimates a scrape exports."""
        return self.report.snapshot(self.runtimes.current, time.time())

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in one of the worker threads (``server.threads`` at most)."""
        return await anyio.to_thread.run_sync(_in_worker, fn, *args, limiter=self.limiter)

    def _hand_back_memory(self) -> None:
        """After a burst of large requests: collect and trim in a thread of its own (one at a time)."""
        if not self._handing_back.acquire(blocking=False):
            return

        def run() -> None:
            try:
                memory.release()
            finally:
                self._handing_back.release()

        threading.Thread(target=run, name="icos-memory", daemon=True).start()

    def not_ready(self) -> str | None:
        """Why the agent cannot answer inference now (starting, stopping, proxy mode's upstream not
        ready); ``None`` when it can. ``/v2/health/ready`` and gRPC readiness answer from it."""
        if not self.started:
            return "starting or stopping"
        return self.mode.not_ready()

    def ready(self) -> bool:
        return self.not_ready() is None

    def estimates(self) -> dict[str, Any]:
        """The ``GET /v1/estimates`` document."""
        return self.report.document(self.runtimes.current, time.time())

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        self.loop = asyncio.get_running_loop()
        if self.grpc is not None:  # first: a port taken meanwhile ends the start before anything runs
            assert s.server.grpc_port is not None
            self.listeners.release_grpc()
            self.grpc.bind(s.server.host, s.server.grpc_port)
        memory.configure_allocator()
        store = await self.run(self.window_state.open)
        await self.mode.start(store)
        for companion in self.companions:
            companion.start()
        if self.mode.background_judging:
            self.judge_queue.start()
        if s.state_dir is not None:
            self._tasks.append(
                asyncio.create_task(self.window_state.flush_loop(s.state.flush_interval_seconds, self.run))
            )
        if s.labels.enabled and self.boost.active:
            self._tasks.append(asyncio.create_task(self.boost.loop(self.run)))
        if s.server.metrics_port is not None:
            self._metrics_server = MetricsPortServer(self.registry, self.run)
            await self._metrics_server.start(s.server.host, s.server.metrics_port, self.listeners.metrics)
        await self.audits.start()
        await self.labels.start()
        if self.grpc is not None:
            await self.grpc.start()
        self.started = True
        rt = self.runtimes.current
        reason = self.not_ready()  # proxy mode: the upstream's readiness, checked once by now
        log.info(
            "agent ready" if reason is None else f"agent started; not ready while {reason}",
            extra={"mode": s.mode, "model": rt.name, "version": rt.version, "sha256": rt.model_sha256},
        )

    async def stop(self) -> None:
        self.started = False  # readiness answers false from now on
        if self.grpc is not None:  # first: calls in flight finish while the agent still judges
            await self.grpc.stop(self.settings.server.graceful_timeout_seconds)
        await self.mode.stop(self.window_state.store)  # no request is served any more
        await cancel_all(self._tasks)
        self.loop_recorder.close()
        await anyio.to_thread.run_sync(self.judge_queue.stop)  # record what is still pending
        for companion in self.companions:  # what they hold goes on to the store before the store stops
            await anyio.to_thread.run_sync(companion.stop)
        await self.labels.stop()
        await self.audits.stop()
        await anyio.to_thread.run_sync(self.window_state.close)
        if self._metrics_server is not None:
            await self._metrics_server.stop()
            self._metrics_server = None
        log.info("agent stopped; state flushed")


def _in_worker(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` in a worker thread named ``icos-worker`` for the OS (see :mod:`agent.core.os_threads`)."""
    name_os_thread_once("icos-worker")
    return fn(*args)


def mode_of(settings: AgentSettings, registry: CollectorRegistry, intake: ObserveIntake | None) -> Mode:
    """The mode of ``settings.mode``: proxy mode's upstream metrics in ``registry``; observe mode takes
    its ``intake``."""
    if settings.mode == "proxy":
        return ProxyMode(settings, UpstreamMetrics(registry))
    if settings.mode == "observe":
        assert intake is not None
        return ObserveMode(intake)
    return ServeMode()
