"""The sidecar's ASGI application (FastAPI): Open Inference Protocol V2, observe, estimates, metrics.

``create_app(settings, registry)`` loads the model and bundle (raising :class:`agent.errors.UserError`
on a bad file), and returns the app; background work (observe workers, state flushes, the optional
metrics port, the optional gRPC service of :mod:`agent.server.grpc_server`) starts in the lifespan
(:meth:`agent.server.composition.Agent.start`).
Other parts of the agent extend it: pass ``routers`` (e.g. the
audit endpoints under ``/v1/audits``) and register collectors on ``app.state.registry``; the admin
check is :func:`agent.server.admin.require_admin`, usable as a FastAPI dependency. ``app.state.agent`` is the
:class:`~agent.server.composition.Agent` (every part, and its lifecycle).

Errors are always JSON ``{"error": "..."}`` (as V2 specifies); a client mistake is a 4xx and counts in
``icos_invalid_requests_total{reason}``, never a 5xx.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from fastapi import APIRouter, FastAPI
from prometheus_client import CollectorRegistry
from starlette.types import Receive, Scope, Send

from agent import __version__
from agent.config.model_source import fetch_model
from agent.config.settings import AgentSettings
from agent.errors import UserError
from agent.judging.runtime import Runtime, load_runtime
from agent.server.admin import admin_port_refusal
from agent.server.audit_routes import audit_router
from agent.server.body_budget import ServerBusy
from agent.server.composition import Agent
from agent.server.errors import answer_of, install_error_handlers
from agent.server.fast_path import InferFastPath
from agent.server.labels_routes import labels_router
from agent.server.listeners import Listeners
from agent.server.middleware import BodyLimitMiddleware
from agent.server.openapi_bodies import declare_request_bodies
from agent.server.responses import send_error
from agent.server.routes import build_router
from agent.server.triton_routes import triton_router


class AgentApp(FastAPI):
    """The agent's FastAPI app: inference goes to :class:`InferFastPath` first."""

    infer_fast_path: InferFastPath | None = None
    #: ``server.admin_port``: requests arriving there reach only the admin API and the health checks.
    admin_port: int | None = None
    on_admin_port_refusal: Callable[[], None] = staticmethod(lambda: None)
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
        refusal = admin_port_refusal(scope, self.admin_port)
        if refusal is not None:
            self.on_admin_port_refusal()
            await send_error(send, 404, refusal)
            return
        fast = self.infer_fast_path
        if fast is not None:
            m = fast.match(scope)
            if m is not None and not self.telemetry_enabled():
                await fast(scope, receive, send, m)
                return
        await super().__call__(scope, receive, send)


def create_app(
    settings: AgentSettings,
    registry: CollectorRegistry | None = None,
    *,
    routers: Sequence[APIRouter] = (),
    on_startup: Sequence[Callable[[FastAPI], Awaitable[None]]] = (),
    on_shutdown: Sequence[Callable[[FastAPI], Awaitable[None]]] = (),
    runtime: Runtime | None = None,
    listeners: Listeners | None = None,
) -> FastAPI:
    """Build the sidecar app; loads the model and bundle now (raises :class:`UserError`). ``listeners``:
    the ports ``icos-agent serve`` bound before (:func:`agent.server.listeners.bind_listeners`)."""
    registry = registry if registry is not None else CollectorRegistry()
    rt = runtime or load_runtime(fetch_model(settings))
    agent = Agent(settings, registry, rt, listeners)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await agent.start()
        except BaseException as exc:
            if isinstance(exc, UserError):  # e.g. the gRPC port taken since it was checked: the CLI says it last
                app.state.start_failure = exc
            with contextlib.suppress(Exception):  # what did start stops (its threads, tasks, stores)
                await agent.stop()
            raise
        for hook in on_startup:
            await hook(app)
        try:
            yield
        finally:
            for hook in on_shutdown:
                await hook(app)
            await agent.stop()

    app = AgentApp(
        title="icos-agent",
        version=__version__,
        description="Judges live predictions with ICOS likely invariants; Open Inference Protocol V2.",
        lifespan=lifespan,
    )
    app.state.agent = agent
    app.state.audits = agent.audits
    app.state.labels = agent.labels
    app.state.registry = registry
    app.state.settings = settings
    #: A :class:`UserError` that ended the start, re-raised by ``icos-agent serve`` once uvicorn has exited.
    app.state.start_failure = None
    install_error_handlers(app, agent.metrics)
    # triton first: /v2/models/stats is no model named 'stats'
    for router in (
        triton_router(agent.runtimes),
        build_router(agent),
        audit_router(agent.audits),
        labels_router(agent.labels),
        *routers,
    ):
        declare_request_bodies(router.routes)
        app.include_router(router)
    app.infer_fast_path = InferFastPath(agent.plane, agent.metrics, settings.server.max_body_bytes, agent.body_budget)
    app.admin_port = settings.server.admin_port
    app.on_admin_port_refusal = lambda: agent.metrics.invalid("admin_port")

    async def busy(exc: ServerBusy, send: Send) -> None:
        answer = answer_of(exc)
        answer.count(agent.metrics)
        await send_error(send, answer.status, answer.message, answer.headers)

    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.server.max_body_bytes,
        on_reject=lambda: agent.metrics.invalid("too_large"),
        budget=agent.body_budget,
        on_busy=busy,
    )
    return app
