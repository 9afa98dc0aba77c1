"""Audits inside the running agent: scheduled jobs, ``GET /v1/audits``, ``POST /v1/audits/{kind}``.

:class:`AuditJobs` owns the reservoir of live inputs (fed by the request pipeline), the
scheduler (:mod:`agent.core.scheduler`), the audit metrics (:mod:`exporters.audit_metrics`) on the app's
registry, the MLflow logger (runs spooled in ``<state_dir>/mlflow-spool`` while MLflow is down) and
the last results, and the baselines alerts compare results with (:mod:`agent.audits.baselines`, kept in
the state store). An audit always runs in a scheduler thread, never on the request path, with a time
budget checked between its steps (status ``timeout`` past it); one run per audit kind at a time.

* ``GET /v1/audits`` — per kind: schedule, next run, whether one is running, the last result (with
  details) and the recent history; reservoir fill and MLflow spool size.
* ``POST /v1/audits/{kind}`` (``Authorization: Bearer $ICOS_AGENT_ADMIN_TOKEN``) — run one now:
  ``202`` with the run id (``?wait=true``: ``200`` with the finished result); ``409`` while a run
  of that kind is in progress.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import numpy as np
from prometheus_client import CollectorRegistry

from agent.audits.baselines import AuditBaselines, DocumentStore
from agent.audits.config import AUDIT_KINDS, AuditsConfig
from agent.audits.registry import audit_metrics, baseline_gauge, export_result
from agent.audits.report import AuditError
from agent.audits.runner import (
    AuditInputs,
    AuditOutcome,
    AuditTimeout,
    audit_record,
    check_applies,
    load_audit_data,
    run_audit,
)
from agent.core.durations import parse_duration
from agent.core.scheduler import JobScheduler
from agent.data.reservoir import Reservoir
from agent.errors import UserError
from agent.judging.runtime import Runtime
from agent.model.classifier import OnnxClassifier
from agent.model.inputs import Inputs
from exporters.mlflow_runs import open_logger
from exporters.redaction import redact_uri

if TYPE_CHECKING:
    from exporters.mlflow_logger import MlflowLogger

log = logging.getLogger("icos_agent.audits")

FLUSH_JOB = "mlflow-spool-flush"
FLUSH_INTERVAL_SECONDS = 60.0


class AgentStopping(AuditTimeout):
    """The agent is shutting down; the audit in progress stops at its next step."""


class AuditJobs:
    """Scheduled and on-demand audits of the agent's model (see the module docstring; the routes are
    in :mod:`agent.server.audit_routes`)."""

    def __init__(
        self,
        config: AuditsConfig,
        registry: CollectorRegistry,
        current_runtime: Callable[[], Runtime],
        state_dir: Path | None,
        state_store: Callable[[], DocumentStore | None] = lambda: None,
    ) -> None:
        """``state_store()`` is the agent's state store (learnt baselines survive restarts in it)."""
        self.config = config
        #: The runtime an audit runs on: the one served when it starts.
        self.current_runtime = current_runtime
        self.state_dir = state_dir
        self.baselines = AuditBaselines(current_runtime().name, config.configured_baselines(), state_store)
        self.metrics = audit_metrics(registry, self.current_baselines)
        r = config.reservoir
        self.reservoir: Reservoir | None = (
            Reservoir(
                r.size, horizon_seconds=parse_duration(r.horizon), min_samples=1, max_sample_bytes=r.max_sample_bytes
            )
            if r.size > 0
            else None
        )
        self.history: dict[str, deque[AuditOutcome]] = {k: deque(maxlen=config.history) for k in AUDIT_KINDS}
        self._locks = {k: threading.Lock() for k in AUDIT_KINDS}
        self._running: dict[str, str] = {}
        self._stopping = threading.Event()
        self._scheduler: Any = None
        self._logger: MlflowLogger | None = None
        self._logger_failed = False
        self._tmp_spool: tempfile.TemporaryDirectory[str] | None = None
        self._models: dict[str, OnnxClassifier] = {}
        self._reference: dict[tuple[str, float, str], tuple[AuditInputs, np.ndarray | None]] = {}
        self._cache_lock = threading.Lock()
        self._check_scheduled_kinds()

    def _check_scheduled_kinds(self) -> None:
        """Refuse, at start, a scheduled audit that cannot audit the model (D-Score of a model that is no
        CNN, data mutation of one without numeric inputs): a one-line :class:`UserError`."""
        rt = self.current_runtime()
        if rt.classifier is None and rt.model_path is None:
            return  # proxy or observe mode without the model file: a run says so
        for kind in self.config.jobs():
            if AUDIT_KINDS[kind].applies is None:
                continue
            try:
                model = self._model()
            except Exception:  # noqa: BLE001 - a model that does not load fails its runs, with the reason
                return
            try:
                check_applies(kind, model)
            except AuditError as exc:
                raise UserError(f"audits.{kind}: {exc}; remove audits.{kind} from the configuration") from None

    # -- wiring -------------------------------------------------------------------------------------
    def observe_inputs(self, rt: Runtime, batches: Sequence[Inputs]) -> None:
        """Input sink of the recorder: offer judged live inputs, request after request, to the reservoir
        (cheap, thread-safe); inputs of a dynamic length (token ids) are kept row by row."""
        if self.reservoir is not None:
            self.reservoir.add_many(batches, {s.name for s in rt.signature.inputs if not s.fixed})

    async def start(self, _app: object = None) -> None:
        self._stopping.clear()
        self._scheduler = JobScheduler(max_workers=len(AUDIT_KINDS) + 1)
        cfg = self.config
        delay = parse_duration(cfg.first_run_delay) if cfg.first_run_delay else None
        for kind, job in cfg.jobs().items():
            self._scheduler.add(
                f"audit-{kind}",
                self._job(kind),
                cron=job.cron,
                interval_seconds=job.interval_seconds,
                first_run_in=delay,
            )
        if self._mlflow_wanted():
            self._scheduler.add(FLUSH_JOB, self.flush_mlflow, interval_seconds=FLUSH_INTERVAL_SECONDS)
        self._scheduler.start()
        if cfg.jobs():
            log.info("audit schedule started", extra={"audits": ",".join(cfg.jobs())})

    async def stop(self, _app: object = None) -> None:
        self._stopping.set()
        if self._scheduler is not None:
            await anyio.to_thread.run_sync(lambda: self._scheduler.shutdown(wait=True))
            self._scheduler = None
        if self._tmp_spool is not None:
            self._tmp_spool.cleanup()
            self._tmp_spool = None

    def is_running(self, kind: str) -> bool:
        """Whether a ``kind`` audit is in progress (one at a time per kind)."""
        return self._locks[kind].locked()

    def running_id(self, kind: str) -> str | None:
        """The id of the ``kind`` audit in progress (``None`` when none is, or while it starts)."""
        return self._running.get(kind)

    def submit(self, kind: str, run_id: str) -> bool:
        """Run a ``kind`` audit now in a scheduler thread; ``False`` when the scheduler is not running."""
        if self._scheduler is None:
            return False
        self._scheduler.submit(f"audit-{kind}-manual-{run_id}", lambda: self.run_once(kind, "manual", run_id))
        return True

    # -- baselines ----------------------------------------------------------------------------------
    def baseline_identity(self, kind: str, model_sha256: str) -> str:
        """What a baseline of ``kind`` belongs to: the model and the audit's parameters and data setting."""
        settings = {
            "params": self.config.params_for(kind).model_dump(mode="json"),
            "data": self.config.data_for(kind).model_dump(mode="json"),
        }
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
        return f"{kind}:{model_sha256[:16]}:{digest[:16]}"

    def current_baselines(self) -> dict[str, float]:
        """``{gauge name: baseline}`` for the model served now (exported as ``<gauge>_baseline``)."""
        sha = self.current_runtime().model_sha256
        out: dict[str, float] = {}
        for kind in AUDIT_KINDS:
            gauge = baseline_gauge(kind)
            if gauge is not None:
                value = self.baselines.get(gauge, self.baseline_identity(kind, sha))
                if value is not None:
                    out[gauge] = value
        return out

    # -- state for GET --------------------------------------------------------------------------------
    def describe(self, *, details: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {}
        jobs = self.config.jobs()
        for kind in AUDIT_KINDS:
            job = jobs.get(kind)
            hist = list(self.history[kind])
            nxt = self._scheduler.next_run(f"audit-{kind}") if self._scheduler is not None and job else None
            out[kind] = {
                "scheduled": job is not None,
                "schedule": None if job is None else {"cron": job.cron, "interval": job.interval},
                "time_budget": None if job is None else job.time_budget,
                "data": self.config.data_for(kind).model_dump(mode="json"),
                "next_run": None if nxt is None else nxt.isoformat(),
                "running": self._running.get(kind),
                "last": hist[-1].to_dict(with_details=details) if hist else None,
                "history": [h.to_dict(with_details=False) for h in reversed(hist)],
            }
        res = self.reservoir
        return {
            "audits": out,
            "reservoir": None
            if res is None
            else {"capacity": res.capacity, "size": len(res), "seen": res.seen, "too_large": res.too_large},
            "mlflow": None
            if self._logger is None
            else {"tracking_uri": redact_uri(self._logger.tracking_uri), "pending": self._logger.pending()},
        }

    # -- running ----------------------------------------------------------------------------------------
    def _job(self, kind: str) -> Callable[[], None]:
        def job() -> None:
            self.run_once(kind, "schedule")

        return job

    def _model(self) -> OnnxClassifier:
        rt = self.current_runtime()
        if rt.classifier is not None:
            return rt.classifier
        if rt.model_path is None:
            raise AuditError("audits need the model: set model.path (also in proxy and observe mode)")
        with self._cache_lock:
            model = self._models.get(rt.model_path)
            if model is None:
                model = OnnxClassifier.load(rt.model_path, name=rt.name)
                self._models = {rt.model_path: model}
            return model

    def _data(self, kind: str, model: OnnxClassifier) -> tuple[AuditInputs | None, np.ndarray | None, str, str]:
        """``(x, y, source description, reason when skipped)``."""
        data = self.config.data_for(kind)
        if data.source == "live":
            if self.reservoir is None:
                return None, None, "live", "the live-input reservoir is off (audits.reservoir.size is 0)"
            held = self.reservoir.sample()
            x = Inputs(held) if isinstance(held, dict) else held
            have = 0 if x is None else len(x)
            if x is None or have < data.min_samples:
                return None, None, "live", f"the reservoir holds {have} live inputs; {data.min_samples} needed"
            return x, None, f"live ({have} inputs)", ""
        assert data.path is not None
        path = Path(data.path)
        key = (str(path), path.stat().st_mtime if path.exists() else 0.0, model.sha256)
        with self._cache_lock:
            cached = self._reference.get(key)
        if cached is None:
            limits = self.config.data_limits.limits()
            cached = load_audit_data(path, model, label_column=data.label_column, limits=limits)
            with self._cache_lock:
                self._reference = {key: cached}
        return cached[0], cached[1], str(path), ""

    def run_once(self, kind: str, trigger: str, run_id: str | None = None) -> AuditOutcome | None:
        """Run one ``kind`` audit now in this thread; ``None`` if one is already running."""
        lock = self._locks[kind]
        if not lock.acquire(blocking=False):
            log.info("audit still running; this trigger is skipped", extra={"audit": kind})
            return None
        run_id = run_id or uuid.uuid4().hex
        self._running[kind] = run_id
        started = time.time()
        outcome = AuditOutcome(kind, "failure", started, started, trigger, "", id=run_id)
        model_sha256 = self.current_runtime().model_sha256  # the model audited (a reload may come meanwhile)
        try:
            self._execute(kind, outcome)
        finally:
            outcome.finished_at = time.time()
            self._running.pop(kind, None)
            lock.release()
        self._finish(outcome, model_sha256)
        return outcome

    def _execute(self, kind: str, outcome: AuditOutcome) -> None:
        job = self.config.jobs().get(kind)
        budget = job.time_budget_seconds if job is not None else 600.0
        deadline = time.monotonic() + budget

        def stop_check(done: int, total: int) -> None:
            if self._stopping.is_set():
                raise AgentStopping("the agent is stopping")

        try:
            model = self._model()
            x, y, source, skip = self._data(kind, model)
            outcome.data_source = source
            if x is None:
                outcome.status, outcome.error = "skipped", skip
                return
            params = self.config.params_for(kind)
            result = run_audit(kind, model, x, y, params, progress=stop_check, deadline=deadline)
            outcome.result = result
            outcome.n_samples = int(result.params.get("n_samples", len(x)))
            outcome.status = "success"
        except AuditTimeout as exc:
            outcome.status, outcome.error = "timeout", str(exc)
            log.warning("audit stopped", extra={"audit": kind, "reason": str(exc)})
        except Exception as exc:  # an audit failure must never take the agent down
            outcome.status, outcome.error = "failure", f"{type(exc).__name__}: {exc}"
            log.warning("audit failed", extra={"audit": kind, "error": outcome.error})

    def _finish(self, outcome: AuditOutcome, model_sha256: str) -> None:
        kind = outcome.kind
        self.metrics.record_run(kind, outcome.status, outcome.seconds, outcome.finished_at)
        if outcome.status == "success" and outcome.result is not None:
            export_result(self.metrics, outcome.result)
            gauge = baseline_gauge(kind)
            if gauge is not None:
                identity = self.baseline_identity(kind, model_sha256)
                self.baselines.learn(gauge, identity, self.metrics.value(gauge))
        job = self.config.jobs().get(kind)
        if outcome.status != "skipped" and (job is None or job.mlflow):
            self._log_mlflow(outcome)
        self.history[kind].append(outcome)
        log.info(
            "audit finished",
            extra={"audit": kind, "status": outcome.status, "seconds": round(outcome.seconds, 3), "id": outcome.id},
        )

    # -- MLflow ---------------------------------------------------------------------------------------------
    def _mlflow_wanted(self) -> bool:
        m = self.config.mlflow
        return m.enabled and (m.tracking_uri is not None or self.state_dir is not None)

    def _mlflow(self) -> MlflowLogger | None:
        if not self._mlflow_wanted() or self._logger_failed:
            return None
        if self._logger is None:
            state = self.state_dir
            if state is None:
                self._tmp_spool = tempfile.TemporaryDirectory(prefix="icos-agent-spool-")
                state = Path(self._tmp_spool.name)
                log.warning("no state_dir: audit runs waiting for MLflow are lost at restart")
            try:
                self._logger = open_logger(self.config.mlflow.tracking_uri, self.config.mlflow.experiment, state)
            except Exception as exc:
                self._logger_failed = True
                log.error("MLflow logging disabled", extra={"error": f"{type(exc).__name__}: {exc}"})
                return None
        return self._logger

    def _log_mlflow(self, outcome: AuditOutcome) -> None:
        logger = self._mlflow()
        if logger is None:
            return
        rt = self.current_runtime()
        try:
            record = audit_record(
                outcome,
                model_name=rt.name,
                model_version=rt.version,
                model_sha256=rt.model_sha256,
                tags={"icos.bundle.digest": rt.bundle_digest},
            )
            run_id = logger.log(record)
        except Exception as exc:  # spool full or unwritable: count it, keep serving
            log.error("audit run could not be logged or spooled", extra={"error": f"{type(exc).__name__}: {exc}"})
            return
        outcome.mlflow_run_id = run_id
        outcome.mlflow_spooled = run_id is None

    def flush_mlflow(self) -> int:
        """Deliver audit runs spooled while MLflow was unreachable; how many were delivered."""
        logger = self._mlflow() if self._logger is None and self._mlflow_wanted() else self._logger
        if logger is None or logger.pending() == 0:
            return 0
        try:
            delivered = logger.flush()
        except Exception as exc:
            log.warning("MLflow spool flush failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            return 0
        if delivered:
            log.info("delivered spooled MLflow runs", extra={"runs": delivered})
        return delivered
