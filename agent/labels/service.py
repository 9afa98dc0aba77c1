"""Delayed labels: true classes for earlier predictions, realized accuracy, estimator errors, recalibration.

Every judged prediction has an id ``<request id>:<index>`` (V2 answers carry the request id and, in
the parameter ``icos_prediction_count``, the number of predictions; ``/v1/observe`` answers the
``id`` and the ``accepted`` count). The pipeline hands
judged requests to a :class:`~agent.labels.store.PredictionStore` (bounded, written off the
request path). Later, true labels arrive by id:

* ``POST /v1/labels`` ``{"labels": [{"id": "<request id>:<i>", "label": 3 | "cat"}, ...]}`` →
  ``{"accepted": n, "unknown": n, "duplicate": n, "invalid": n, "problems": [...]}``. A label is a
  class index or a class name. Unknown ids (never seen, evicted), ids already labeled (the first
  label stays) and invalid entries are counted, never fatal; at most ``labels.max_batch`` labels
  per request (:mod:`agent.labels.intake`).
* ``GET /v1/labels`` — the store (size, labeled, queued), the calibration in use, the last
  recalibration.
* ``GET /v1/labels/requests?limit=N`` — the labeling sample: every judged prediction is drawn into it
  independently with probability ``labels.sample_rate`` (from the agent's own random source, so no
  client can choose what is sampled); this lists the newest sampled predictions still without a label
  (``{"sample_rate", "n", "requests": [{"id", "timestamp"}]}``). Their labels, posted as any other,
  give every time window the estimator ``with_labels`` (prediction-powered inference,
  :mod:`agent.estimation.estimators.prediction_powered`): valid whatever the shift because the sample is
  uniform. Labels of predictions outside the sample count for the realized accuracy and
  recalibration, not for ``with_labels``. With ``labels.keep_sampled_inputs``, ``?inputs=true`` adds
  each one's kept inputs, predicted class and probability (:mod:`agent.labels.kept_inputs`), what
  ``icos-agent labels export`` turns into labeling-tool tasks.
* ``POST /v1/recalibrate`` (admin bearer token) — refits the estimator calibration from the stored
  labeled predictions (:mod:`agent.labels.recalibration`).

Three parts do the work, each built once by the composition root and passed in here:
:class:`~agent.labels.intake.LabelIntake` (labels in, the labeling sample out, no HTTP),
:class:`~agent.labels.tracker.RealizedTracker` (the realized windows by prediction time: each window
of ``GET /v1/estimates`` gains a ``realized`` section, Prometheus the realized metrics of
:mod:`exporters.label_metrics`, time windows the labeled-sample sums of ``with_labels``) and
:class:`~agent.labels.recalibration.Recalibrator`. :class:`LabelService` starts and stops them with the
store and follows reloads.

With a shared store (PostgreSQL, ``labels.store_url``) a label posted to any replica joins the
prediction whichever replica served it, recalibration reads every replica's labels, and each replica
re-reads the labeled predictions every ``labels.fleet_refresh_seconds``: its realized windows, and so
its ``icos_realized_*`` metrics, are the fleet's (any replica's value is the fleet's value).

In ``labels.durability: commit`` the agent answers a request only once its predictions are committed
(:meth:`LabelService.acknowledge`, the commit recording's wait); when they cannot be (the store failing, or
PostgreSQL unreachable) within ``labels.commit_timeout_seconds`` the request is refused with 503
:class:`PredictionNotStored` — its predictions were not acknowledged, the client retries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread

from agent.config.settings import LabelsConfig
from agent.core.tasks import cancel_all
from agent.errors import ClientError
from agent.judging.runtime import Runtime
from agent.labels.intake import CurrentRuntime, LabelIntake
from agent.labels.recalibration import Recalibrator, calibration_fields
from agent.labels.store import PredictionStore
from agent.labels.tracker import RealizedTracker
from exporters.label_metrics import LabelMetrics

log = logging.getLogger("icos_agent.labels")


class PredictionNotStored(ClientError):
    """``commit`` durability: the request's predictions could not be committed, so it is not acknowledged."""

    status = 503
    reason = "prediction_store_unavailable"
    headers = {"Retry-After": "1"}


class LabelService:
    """The prediction store and the label parts of one agent, started and stopped together (served on
    ``/v1/labels`` and ``/v1/recalibrate`` by :mod:`agent.server.labels_routes`)."""

    def __init__(
        self,
        config: LabelsConfig,
        store: PredictionStore,
        runtimes: CurrentRuntime,
        intake: LabelIntake,
        tracker: RealizedTracker,
        recalibrator: Recalibrator,
        metrics: LabelMetrics,
        run_in_thread: Callable[..., Awaitable[Any]],
    ) -> None:
        self.config = config
        self.store = store
        self.runtimes = runtimes
        self.intake = intake
        self.tracker = tracker
        self.recalibrator = recalibrator
        self.metrics = metrics
        self.run = run_in_thread
        self.metrics.store_reachable.set_function(lambda: 0.0 if self.store.unreachable else 1.0)
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    @property
    def started(self) -> bool:
        """Whether the service runs (``labels.enabled`` and started with the agent)."""
        return self._started

    def _open(self) -> None:
        self.store.open()
        self.tracker.open()
        self.recalibrator.restore()
        self._set_store_metrics()

    def _set_store_metrics(self) -> None:
        self.metrics.set_store(self.store.rows, self.store.labeled)

    async def start(self) -> None:
        if not self.config.enabled:
            return
        await self.run(self._open)
        self.store.start()
        self._tasks.append(asyncio.create_task(self._watch_loop()))
        self._started = True

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        await cancel_all(self._tasks)
        await self.recalibrator.stop()
        await anyio.to_thread.run_sync(self.follow_runtime)
        await anyio.to_thread.run_sync(self.store.stop)

    def follow_runtime(self) -> None:
        """Follow reloads: realized windows restart for a new model or bundle; a refitted calibration
        is discarded once a reload has replaced the runtime carrying it."""
        rt: Runtime = self.runtimes.current
        self.tracker.follow(rt)
        self.recalibrator.follow(rt)

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.run(self.follow_runtime)
                if self.tracker.fleet_due():
                    await self.run(self.tracker.read_fleet_labels)
                self._set_store_metrics()
            except Exception:
                log.exception("label bookkeeping failed")

    async def acknowledge(self, request_id: str) -> None:
        """``commit`` durability: return once the predictions of ``request_id`` are committed; raise
        :class:`PredictionNotStored` (503) when they cannot be within ``labels.commit_timeout_seconds``."""
        if not await self.store.committed(request_id, self.config.commit_timeout_seconds):
            why = "unreachable" if self.store.unreachable else "not committed in time or dropped"
            raise PredictionNotStored(
                f"the prediction store is {why}; in labels.durability: commit a request is answered only "
                "after its predictions are stored: retry"
            )

    async def accept(self, body: bytes, source: str, correct: bool = False) -> dict[str, Any]:
        """``POST /v1/labels`` from ``source`` (:meth:`LabelIntake.accept`), after following a reload."""
        await self.run(self.follow_runtime)
        result = await self.intake.accept(body, source, correct)
        self.recalibrator.labels_accepted(int(result["accepted"]) + int(result["corrected"]))
        self._set_store_metrics()
        return result

    async def drop(self, source: str | None, since: float | None, until: float | None) -> dict[str, Any]:
        """Admin: delete the labels of ``source`` (any when None) given in ``[since, until)``; the realized
        windows and ``with_labels`` follow."""

        def drop() -> int:
            n = self.store.drop_labels(source, since, until)
            self.tracker.reload()
            return n

        n: int = await self.run(drop)
        self._set_store_metrics()
        log.info("labels dropped", extra={"labels": n, "source": source, "since": since, "until": until})
        return {"dropped": n, "source": source, "since": since, "until": until}

    async def describe(self) -> dict[str, Any]:
        """``GET /v1/labels``: the store, the calibration in use and the last recalibration."""
        await self.run(self.follow_runtime)
        rt = self.runtimes.current
        c = self.config
        return {
            "enabled": c.enabled,
            "store": {
                "backend": "postgresql" if self.store.shared else "sqlite",
                "persistent": self.store.persistent,
                "path": str(self.store.path) if self.store.path else None,
                "location": self.store.location,
                "durability": c.durability,
                "reachable": not self.store.unreachable,
                "predictions": self.store.rows,
                "labeled": self.store.labeled,
                "queued": self.store.queued,
                "max_predictions": c.max_predictions,
                "max_age": c.max_age,
            },
            "calibration": {"source": self.recalibrator.source, **calibration_fields(rt.calibration)},
            "sample_rate": c.sample_rate,
            "sampling": c.sampling,
            "per_window": c.per_window if c.sampling != "uniform" else None,
            "predictor": rt.calibration.predictor,
            "min_recalibration_samples": c.min_recalibration_samples,
            "auto_recalibrate_every": c.auto_recalibrate_every,
            "last_recalibration": self.recalibrator.last,
        }


__all__ = ["LabelService", "PredictionNotStored"]
