"""The fleet evaluator's HTTP app: ``GET /v1/estimates``, ``GET /metrics`` and health, with the refresh
loop in one background thread (started and stopped by the app's lifespan). The refresh runs its own
event loop in that thread, so the app's loop (liveness, metrics) never waits on the API; what the
refresh parses is bounded (``fleet.max_response_bytes``), and it parses and reads the answer letting the
GIL go every few milliseconds (:func:`agent.fleet.prometheus_api._parse`), so the app's loop runs
meanwhile: with 200,000 series in one answer, liveness answered within 0.7 s on a loaded machine.

With a shared prediction store (``labels.store_url`` or ``labels.store_url_file``, the replicas' own
settings, its password as secret as theirs), the evaluator reads the fleet's labels from it
(:mod:`agent.fleet.labels`); ``labels.enabled: false`` or no store URL: label-free estimates only."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from agent.config.model_source import fetch_model
from agent.config.settings import AgentSettings
from agent.core import logs
from agent.core.os_threads import name_os_thread
from agent.fleet.challenger import FleetChallenger
from agent.fleet.evaluator import FleetEvaluator
from agent.fleet.labels import FleetLabels
from agent.fleet.prometheus_api import PrometheusAPI
from agent.judging.runtime import load_runtime
from exporters.fleet import FleetCollector

if TYPE_CHECKING:
    from agent.labels.postgres_backend import PostgresBackend

log = logs.get("fleet")


class RefreshLoop:
    """Calls :meth:`FleetEvaluator.refresh` every ``fleet.refresh_seconds`` until stopped."""

    def __init__(self, evaluator: FleetEvaluator, period: float) -> None:
        self.evaluator = evaluator
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="icos-fleet-refresh", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        name_os_thread("icos-fleet")
        while not self._stop.is_set():
            try:
                self.evaluator.refresh()  # counts every failure itself
            except Exception:  # a bug must not end the loop: the estimates then go stale and alert
                log.exception("fleet: refresh loop raised")
            self._stop.wait(self.period)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)


def _open_store(settings: AgentSettings) -> PostgresBackend | None:
    """The shared store the fleet's labels are read from, or None (labels off, or no PostgreSQL URL).
    Opening never fails on a server that is down: reads fail, counted, until it is back."""
    url = settings.labels.database_url() if settings.labels.enabled else None
    if url is None:
        return None
    from agent.labels.postgres_backend import PostgresBackend  # psycopg only when configured

    store = PostgresBackend(
        url,
        max_predictions=settings.labels.max_predictions,
        max_age_seconds=settings.labels.max_age_seconds,
        pool_size=min(settings.labels.pool_size, 2),
    )
    store.open()
    return store


def create_fleet_app(settings: AgentSettings, registry: CollectorRegistry | None = None) -> FastAPI:
    """Build the fleet evaluator's app; loads the bundle now (raises :class:`UserError`)."""
    fleet = settings.fleet
    if fleet.prometheus_url is None:
        from agent.errors import UserError

        raise UserError(
            "fleet.prometheus_url is required in fleet mode (environment: ICOS_AGENT_FLEET__PROMETHEUS_URL)"
        )
    rt = load_runtime(fetch_model(settings))
    api = PrometheusAPI(
        fleet.prometheus_url,
        fleet.query_timeout_seconds,
        max_response_bytes=fleet.max_response_bytes,
        max_series=fleet.max_series,
    )
    store = _open_store(settings)
    labels = (
        FleetLabels(
            store,
            rt.identity,
            settings.window_seconds,
            settings.labels.max_predictions,
            rt.classes,
            settings.metrics.per_class_label_cap,
            settings.labels.max_source_share,
        )
        if store is not None
        else None
    )
    evaluator = FleetEvaluator(
        settings,
        rt.calibration,
        rt.bundle_label,
        api,
        headline=rt.headline,
        labels=labels,
        classes=rt.classes,
        companions=FleetChallenger.of_settings(settings, rt.model_sha256),
    )
    registry = registry if registry is not None else CollectorRegistry()
    registry.register(FleetCollector(evaluator.snapshot))
    for collector in evaluator.companion_collectors():
        registry.register(collector)
    loop = RefreshLoop(evaluator, settings.fleet.refresh_seconds)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(loop.stop)
            if store is not None:
                await anyio.to_thread.run_sync(store.close)

    app = FastAPI(title="icos-agent fleet evaluator", lifespan=lifespan)
    app.state.fleet = evaluator

    @app.get("/v1/estimates", summary="Estimates of the whole fleet (same shape as an agent's)")
    async def estimates(version: str | None = None) -> JSONResponse:
        return JSONResponse(evaluator.estimates(version))

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v2/health/live", summary="liveness")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", summary="readiness: bundle loaded (stale estimates are served, marked stale)")
    async def ready() -> dict[str, bool]:
        return {"ready": True, "stale": evaluator.stale()}

    return app
