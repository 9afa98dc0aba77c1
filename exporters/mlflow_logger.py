"""The one module that talks to MLflow: runs for fits and audits, estimate snapshots, models.

What is logged (see ``docs/mlflow.md``):

* One run per fit and per audit (:class:`RunRecord` with ``kind`` ``fit``/``dscore``/``mutation``/
  ``metamorphic``): params, metrics (step 0), tags, artifacts (JSON report, PNG heatmaps, rule
  text), start/end times from the record. Tags: ``icos.kind``, ``icos.record_id``,
  ``icos.model.name``/``.version``/``.sha256`` and the caller's own.
* Estimate snapshots (``kind == "estimates"``): one run per model, version and UTC day, tagged
  ``icos.series``; every snapshot adds its metrics at its step (default: epoch seconds). A daily run
  keeps metric histories short enough for the UI and makes "accuracy on day D" one click. Params
  are logged when the day's run is created; artifacts go under ``snapshots/<step>/``.

Delivery is exactly once and survives MLflow outages and restarts:

* A record that cannot be delivered (connection refused, timeout, 5xx, any unexpected error) is
  written to the spool (:mod:`exporters.spool`) and :meth:`MlflowLogger.flush` delivers the spool
  in order later. After a failure, :meth:`MlflowLogger.log` spools directly for ``retry_after_s``
  instead of waiting on a dead server for every record.
* Before creating a run the experiment is searched for a FINISHED run tagged with the record's
  ``icos.record_id`` (found → already delivered). A run with that tag that is not FINISHED is a
  partial delivery from before a crash: it is deleted and the record is logged again. A run is set
  FINISHED as the very last step, so FINISHED means complete. Snapshots are idempotent because
  MLflow ignores a metric logged twice with the same key, value, timestamp and step.
* Records MLflow refuses with HTTP 400 (``INVALID_PARAMETER_VALUE``) cannot succeed by retrying:
  they are moved to ``<spool>/rejected/`` and counted, so they never block the queue.

mlflow is imported lazily (it costs over a second), never at module import. All calls go through
an explicit :class:`mlflow.MlflowClient` (no fluent API, no global tracking URI). HTTP timeouts and
retries are bounded through mlflow's own environment variables (see
:func:`exporters.mlflow_env.configure_mlflow_environment`) so an unreachable server fails in seconds.
Tracking-URI handling lives in :mod:`exporters.mlflow_env` and the staging and locating of local
files in :mod:`exporters.mlflow_files`; neither imports mlflow.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from exporters.mlflow_env import (
    check_tracking_uri,
    configure_mlflow_environment,
    default_artifact_location,
    default_tracking_uri,
    resolve_uri,
    sqlite_path,
)
from exporters.mlflow_files import DownloadedModel, RegisteredModelVersion, locate_model, stage_model_files, write_tree
from exporters.redaction import RedactingFilter, redact_text
from exporters.run_record import (
    KINDS,
    SNAPSHOT_KIND,
    TAG_KIND,
    TAG_MODEL_NAME,
    TAG_MODEL_SHA256,
    TAG_MODEL_VERSION,
    TAG_RECORD_ID,
    TAG_SERIES,
    ParamValue,
    RunRecord,
    check_artifact_path,
)
from exporters.spool import DEFAULT_MAX_BYTES, Spool, SpoolError

__all__ = [
    "KINDS",
    "SNAPSHOT_KIND",
    "TAG_KIND",
    "TAG_MODEL_NAME",
    "TAG_MODEL_SHA256",
    "TAG_MODEL_VERSION",
    "TAG_RECORD_ID",
    "TAG_SERIES",
    "DownloadedModel",
    "LoggerStats",
    "MlflowLogger",
    "ParamValue",
    "RegisteredModelVersion",
    "RunRecord",
    "SpoolError",
    "download_model",
    "load_model_from_uri",
    "log_model",
]

log = logging.getLogger(__name__)
log.addFilter(RedactingFilter())  # tracking URIs and MLflow's errors may carry credentials

DEFAULT_RETRY_AFTER_S = 30.0
TAG_LAST_RECORD_ID = "icos.last_record_id"
TAG_SERIES_DAY = "icos.series.day"

# Error codes of requests MLflow will refuse again however often they are retried.
_PERMANENT_ERROR_CODES = frozenset({"INVALID_PARAMETER_VALUE", "BAD_REQUEST"})
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAMS_PER_BATCH = 100


class _Unavailable(Exception):
    """MLflow is reachable but not usable right now (e.g. the experiment is deleted)."""


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000.0))


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _is_permanent(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("mlflow.") and getattr(exc, "error_code", None) in _PERMANENT_ERROR_CODES


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:497] + "..."


def series_key(model_name: str, model_version: str, day: str) -> str:
    """The ``icos.series`` tag of the estimates run of one model, version and UTC day."""
    digest = hashlib.sha256(f"{model_name}\0{model_version}".encode()).hexdigest()[:16]
    return f"{SNAPSHOT_KIND}/{day}/{digest}"


def _client(tracking_uri: str) -> Any:
    db = sqlite_path(tracking_uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    from mlflow import MlflowClient  # lazy: importing mlflow costs over a second

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def _ensure_experiment(client: Any, name: str, artifact_location: str | None) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return str(client.create_experiment(name, artifact_location=artifact_location))
        except Exception as exc:
            if getattr(exc, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)  # created concurrently
            if experiment is None:
                raise
    if experiment.lifecycle_stage != "active":
        raise _Unavailable(
            f"MLflow experiment {name!r} is deleted; restore it (mlflow experiments restore) or configure another"
        )
    return str(experiment.experiment_id)


# -- the logger ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoggerStats:
    """Counters since start (``pending`` and ``rejected`` are read from the spool)."""

    delivered: int
    spooled: int
    rejected: int
    pending: int
    available: bool
    last_error: str | None


class MlflowLogger:
    """Logs :class:`RunRecord` objects to one MLflow experiment, spooling them while MLflow is down.

    ``tracking_uri`` ``None`` means ``sqlite:///<state_dir>/mlflow.db`` (``state_dir`` defaults to
    the parent of ``spool_dir``); artifacts of a local sqlite store go to ``<db dir>/mlartifacts``
    unless ``artifact_location`` says otherwise. Thread-safe: one lock serialises all MLflow calls.
    """

    def __init__(
        self,
        tracking_uri: str | None,
        experiment: str,
        spool_dir: Path,
        *,
        state_dir: Path | None = None,
        artifact_location: str | None = None,
        http_timeout_s: int | None = None,
        http_max_retries: int | None = None,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
        max_spool_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if not experiment or not experiment.strip():
            raise ValueError("MLflow experiment name must not be empty")
        if retry_after_s < 0:
            raise ValueError("retry_after_s must be >= 0")
        spool_dir = Path(spool_dir)
        self.tracking_uri = tracking_uri or default_tracking_uri(state_dir if state_dir else spool_dir.parent)
        check_tracking_uri(self.tracking_uri)
        self.experiment = experiment
        self.artifact_location = artifact_location or default_artifact_location(self.tracking_uri)
        self.retry_after_s = float(retry_after_s)
        configure_mlflow_environment(http_timeout_s, http_max_retries)
        self._spool = Spool(spool_dir, max_spool_bytes)
        self._lock = threading.RLock()
        self._mlflow_client: Any = None
        self._experiment_id: str | None = None
        self._down_until = 0.0
        self._down = False
        self._last_error: str | None = None
        self._delivered = 0
        self._spooled = 0
        self._rejected = 0

    @property
    def spool_dir(self) -> Path:
        """Directory holding pending records."""
        return self._spool.directory

    # -- public API --------------------------------------------------------------------------
    def log(self, record: RunRecord) -> str | None:
        """Deliver ``record``; its run id, or ``None`` when it was spooled (or rejected by MLflow).

        Raises :class:`SpoolError` only when MLflow is unavailable *and* the spool cannot store the
        record (disk full, read-only, size cap): the record is lost and the caller should count it.
        """
        with self._lock:
            if time.monotonic() < self._down_until:
                self._put(record)
                return None
            if self._spool.count() > 0:  # keep the order: queue behind what is pending, then flush
                self._put(record)
                return self._flush_locked().get(record.record_id)
            try:
                run_id = self._deliver(record)
            except Exception as exc:
                if _is_permanent(exc):
                    self._reject(record, exc)
                    return None
                self._mark_down(exc)
                self._put(record)
                return None
            self._mark_up()
            self._delivered += 1
            return run_id

    def flush(self) -> int:
        """Deliver pending records in order; stops at the first transient failure. Returns how many
        were delivered. Raises :class:`SpoolError` if a delivered record's file cannot be deleted
        (it is then found by its ``icos.record_id`` tag on the next flush and not logged twice).
        """
        with self._lock:
            return len(self._flush_locked())

    def pending(self) -> int:
        """Records waiting in the spool (0 if the spool cannot be read; that is logged)."""
        try:
            return self._spool.count()
        except SpoolError as exc:
            log.warning("%s", exc)
            return 0

    def rejected(self) -> int:
        """Records MLflow refused, kept in ``<spool>/rejected/``."""
        return self._spool.rejected_count()

    def stats(self) -> LoggerStats:
        """Counters for metrics and status pages."""
        with self._lock:
            return LoggerStats(
                delivered=self._delivered,
                spooled=self._spooled,
                rejected=self._rejected,
                pending=self.pending(),
                available=not self._down,
                last_error=self._last_error,
            )

    # -- internals ---------------------------------------------------------------------------
    def _put(self, record: RunRecord) -> None:
        self._spool.put(record)
        self._spooled += 1

    def _flush_locked(self) -> dict[str, str]:
        delivered: dict[str, str] = {}
        for entry in self._spool.entries():
            record = self._spool.load(entry)
            if record is None:
                continue
            try:
                run_id = self._deliver(record)
            except Exception as exc:
                if _is_permanent(exc):
                    self._reject(record, exc)
                    continue
                self._mark_down(exc)
                break
            self._mark_up()
            self._delivered += 1
            delivered[record.record_id] = run_id
            self._spool.remove(record.record_id)
        return delivered

    def _reject(self, record: RunRecord, exc: BaseException) -> None:
        self._rejected += 1
        log.error(
            "MLflow refused record %s (%s %r): %s; kept in %s/rejected/",
            record.record_id,
            record.kind,
            record.name,
            _short(exc),
            self._spool.directory,
        )
        try:
            self._spool.reject(record, _short(exc))
        except SpoolError as spool_exc:
            log.error("%s", spool_exc)

    def _mark_down(self, exc: BaseException) -> None:
        self._experiment_id = None
        self._last_error = redact_text(_short(exc))
        self._down_until = time.monotonic() + self.retry_after_s
        if not self._down:
            log.warning(
                "MLflow at %s is unavailable (%s); spooling records to %s",
                self.tracking_uri,
                self._last_error,
                self._spool.directory,
            )
        self._down = True

    def _mark_up(self) -> None:
        if self._down:
            log.info("MLflow at %s is reachable again", self.tracking_uri)
        self._down = False
        self._down_until = 0.0

    def _client(self) -> Any:
        if self._mlflow_client is None:
            self._mlflow_client = _client(self.tracking_uri)
        return self._mlflow_client

    def _deliver(self, record: RunRecord) -> str:
        client = self._client()
        if self._experiment_id is None:
            self._experiment_id = _ensure_experiment(client, self.experiment, self.artifact_location)
        try:
            if record.is_snapshot:
                return self._deliver_snapshot(client, self._experiment_id, record)
            return self._deliver_run(client, self._experiment_id, record)
        except Exception as exc:
            if _is_permanent(exc):
                # A deleted experiment also answers INVALID_PARAMETER_VALUE: that is not the record's fault.
                self._experiment_id = None
                self._experiment_id = _ensure_experiment(client, self.experiment, self.artifact_location)
            raise

    @staticmethod
    def _find_runs(client: Any, experiment_id: str, tag: str, value: str) -> list[Any]:
        from mlflow.entities import ViewType

        # Tag values used here are restricted to [A-Za-z0-9_.-/]: no quoting issues.
        return list(
            client.search_runs(
                [experiment_id],
                filter_string=f"tags.`{tag}` = '{value}'",
                run_view_type=ViewType.ACTIVE_ONLY,
                max_results=50,
                order_by=["attributes.start_time ASC"],
            )
        )

    def _deliver_run(self, client: Any, experiment_id: str, record: RunRecord) -> str:
        existing = self._find_runs(client, experiment_id, TAG_RECORD_ID, record.record_id)
        for run in existing:
            if run.info.status == "FINISHED":
                return str(run.info.run_id)
        for run in existing:  # partial delivery interrupted by a crash or an outage
            client.delete_run(run.info.run_id)
        run = client.create_run(
            experiment_id, start_time=_ms(record.started_at), tags=record.run_tags(), run_name=record.name
        )
        run_id = str(run.info.run_id)
        self._log_values(client, run_id, record, with_params=True)
        self._log_artifacts(client, run_id, record.artifacts, prefix=None)
        client.set_terminated(run_id, "FINISHED", end_time=_ms(record.finished_at))
        return run_id

    def _deliver_snapshot(self, client: Any, experiment_id: str, record: RunRecord) -> str:
        day = datetime.fromtimestamp(record.finished_at, tz=UTC).date().isoformat()
        series = series_key(record.model_name, record.model_version, day)
        existing = self._find_runs(client, experiment_id, TAG_SERIES, series)
        created = not existing
        if existing:
            run_id = str(existing[0].info.run_id)
        else:
            tags = record.run_tags()
            del tags[TAG_RECORD_ID]
            tags.update({TAG_SERIES: series, TAG_SERIES_DAY: day})
            label = " ".join(p for p in (record.model_name, record.model_version) if p) or "model"
            name = f"estimates {label} {day}"
            if len(name) > 250:
                name = f"estimates {day} {series[-16:]}"
            run = client.create_run(experiment_id, start_time=_ms(record.started_at), tags=tags, run_name=name)
            run_id = str(run.info.run_id)
        self._log_values(client, run_id, record, with_params=created)
        client.set_tag(run_id, TAG_LAST_RECORD_ID, record.record_id)
        self._log_artifacts(client, run_id, record.artifacts, prefix=f"snapshots/{record.metric_step}")
        client.set_terminated(run_id, "FINISHED", end_time=_ms(record.finished_at))
        return run_id

    @staticmethod
    def _log_values(client: Any, run_id: str, record: RunRecord, *, with_params: bool) -> None:
        from mlflow.entities import Metric, Param

        timestamp, step = _ms(record.finished_at), record.metric_step
        metrics = [Metric(k, float(v), timestamp, step) for k, v in record.metrics.items()]
        for chunk in _chunks(metrics, _MAX_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=list(chunk))
        if with_params:
            params = [Param(k, v) for k, v in record.params_as_text().items()]
            for chunk in _chunks(params, _MAX_PARAMS_PER_BATCH):
                client.log_batch(run_id, params=list(chunk))

    @staticmethod
    def _log_artifacts(client: Any, run_id: str, artifacts: Mapping[str, bytes], prefix: str | None) -> None:
        if not artifacts:
            return
        with tempfile.TemporaryDirectory(prefix="icos-mlflow-") as tmp:
            write_tree(Path(tmp), artifacts)
            client.log_artifacts(run_id, tmp, artifact_path=prefix)


# -- models --------------------------------------------------------------------------------------
def _registry_download_uri(client: Any, uri: str) -> str | None:
    """Resolve ``models:/name/version``, ``models:/name@alias`` and ``models:/name/latest`` (with an
    optional sub-path) to the version's storage URI through an explicit client.

    mlflow 3.17's ``download_artifacts`` resolves ``models:/`` through the *global* registry URI and
    ignores its ``registry_uri`` argument, so the lookup is done here instead.
    """
    path = uri[len("models:/") :].strip("/")
    if not path or path.startswith("m-"):
        return None  # a logged-model id (models:/m-...) is resolved by mlflow itself
    head, _, rest = path.partition("/")
    if "@" in head:
        name, alias = head.split("@", 1)
        version = str(client.get_model_version_by_alias(name, alias).version)
        sub = rest
    else:
        name = head
        selector, _, sub = rest.partition("/")
        if selector == "latest":
            versions = client.search_model_versions(f"name = '{name}'")
            if not versions:
                raise ValueError(f"registered model {name!r} has no versions")
            version = str(max(int(v.version) for v in versions))
        elif selector.isdigit():
            version = selector
        else:
            raise ValueError(f"model URI {uri!r}: use models:/<name>/<version>, models:/<name>@<alias> or /latest")
    base = str(client.get_model_version_download_uri(name, version)).rstrip("/")
    return f"{base}/{sub}" if sub else base


def download_model(uri: str, tracking_uri: str | None, dest_dir: Path) -> DownloadedModel:
    """Download a model (``models:/name/1``, ``models:/name@alias``, ``runs:/<id>/model``, any
    artifact URI) into ``dest_dir`` (use a dedicated directory) and locate the ONNX file and the
    ``bundle/`` directory next to it. ``tracking_uri`` ``None`` → ``MLFLOW_TRACKING_URI``.
    """
    uri_ = resolve_uri(tracking_uri)
    configure_mlflow_environment()
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    from mlflow.artifacts import download_artifacts

    artifact_uri = uri
    if uri.startswith("models:/"):
        artifact_uri = _registry_download_uri(_client(uri_), uri) or uri
    local = download_artifacts(artifact_uri=artifact_uri, dst_path=str(dest), tracking_uri=uri_, registry_uri=uri_)
    return locate_model(Path(local))


def load_model_from_uri(uri: str, tracking_uri: str | None, dest_dir: Path) -> Path:
    """Download a model from MLflow and return the local ``.onnx`` path (see :func:`download_model`;
    the bundle, if logged, is the ``bundle/`` directory next to it)."""
    return download_model(uri, tracking_uri, dest_dir).onnx_path


def log_model(
    onnx_path: Path,
    *,
    registered_name: str,
    tracking_uri: str | None,
    experiment: str,
    bundle_dir: Path | None = None,
    artifact_path: str = "model",
    tags: Mapping[str, str] | None = None,
) -> RegisteredModelVersion:
    """Log an ONNX file (and an invariant bundle directory as ``<artifact_path>/bundle/``) as plain
    artifacts of a new run and register ``runs:/<run>/<artifact_path>`` as a new model version.

    No mlflow flavor is needed: :func:`download_model` reads the files back as they are.
    """
    uri = resolve_uri(tracking_uri)
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise FileNotFoundError(f"ONNX model not found: {onnx_path}")
    if bundle_dir is not None and not Path(bundle_dir).is_dir():
        raise FileNotFoundError(f"bundle directory not found: {bundle_dir}")
    check_artifact_path(artifact_path)
    configure_mlflow_environment()
    client = _client(uri)
    experiment_id = _ensure_experiment(client, experiment, default_artifact_location(uri))
    sha256 = hashlib.sha256(onnx_path.read_bytes()).hexdigest()
    run_tags = {TAG_KIND: "model", TAG_MODEL_NAME: registered_name, TAG_MODEL_SHA256: sha256, **(tags or {})}
    run = client.create_run(experiment_id, tags=run_tags, run_name=f"register {registered_name}")
    run_id = str(run.info.run_id)
    with tempfile.TemporaryDirectory(prefix="icos-mlflow-model-") as tmp:
        stage_model_files(onnx_path, Path(bundle_dir) if bundle_dir is not None else None, Path(tmp))
        client.log_artifacts(run_id, tmp, artifact_path=artifact_path)
    client.set_terminated(run_id, "FINISHED")
    try:
        client.create_registered_model(registered_name)
    except Exception as exc:
        if getattr(exc, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
            raise
    version = client.create_model_version(
        registered_name,
        source=f"runs:/{run_id}/{artifact_path}",
        run_id=run_id,
        tags={TAG_MODEL_SHA256: sha256},
        await_creation_for=30,
    )
    return RegisteredModelVersion(
        name=registered_name,
        version=str(version.version),
        run_id=run_id,
        model_uri=f"models:/{registered_name}/{version.version}",
    )
