"""One thing to log to MLflow, as plain data, and its JSON form (used by the spool).

A :class:`RunRecord` becomes one MLflow run (a fit, an audit), except for ``kind == "estimates"``:
those are periodic estimate snapshots that are appended, as metrics with a step, to one run per
model, version and UTC day (see :mod:`exporters.mlflow_logger`).

Records are validated when they are built, against MLflow's own limits, so a record that reaches the
spool can be delivered later: names of params/metrics/tags/artifacts, value lengths, finite times.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ParamValue = str | int | float | bool

#: Kinds the agent logs besides its audits (an audit's record is named for its kind, e.g. ``dscore``).
#: Any lower-case name is accepted.
KINDS = ("fit", "estimates")
#: The kind whose records are appended to one run per model, version and day.
SNAPSHOT_KIND = "estimates"

TAG_KIND = "icos.kind"
TAG_RECORD_ID = "icos.record_id"
TAG_MODEL_NAME = "icos.model.name"
TAG_MODEL_VERSION = "icos.model.version"
TAG_MODEL_SHA256 = "icos.model.sha256"
TAG_SERIES = "icos.series"

# MLflow's limits (mlflow/utils/validation.py, MLflow 3.17).
MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
MAX_RUN_NAME_LENGTH = 250

_KEY = re.compile(r"^[\w\-. /:]+$")
_RECORD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_KIND = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

FORMAT_NAME = "icos-agent/mlflow-record"
FORMAT_VERSION = 1


def _new_record_id() -> str:
    return str(uuid.uuid4())


def _check_key(what: str, key: object) -> str:
    if not isinstance(key, str) or not _KEY.match(key) or len(key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"{what} name {key!r} is not valid for MLflow (1-{MAX_KEY_LENGTH} characters: letters, digits, "
            "'_', '-', '.', ' ', '/', ':')"
        )
    if key.startswith("/") or ".." in key.split("/"):
        raise ValueError(f"{what} name {key!r} must not start with '/' or contain a '..' segment")
    return key


def check_artifact_path(path: object) -> str:
    """Return ``path`` if it is a safe relative POSIX path (no ``..``, no absolute, no backslash)."""
    if not isinstance(path, str) or not path or len(path) > 1000:
        raise ValueError(f"artifact path {path!r} must be a non-empty string")
    parts = path.split("/")
    if path.startswith("/") or "\\" in path or "\x00" in path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"artifact path {path!r} must be a relative POSIX path without '.', '..' or empty parts")
    return path


@dataclass(frozen=True)
class RunRecord:
    """A fit, an audit or an estimate snapshot, ready to be logged to MLflow.

    ``started_at``/``finished_at`` are seconds since the epoch. ``record_id`` makes delivery exactly
    once: the run is tagged ``icos.record_id`` and looked up before a run is created. ``step`` is the
    metric step of an estimate snapshot (default: ``int(finished_at)``); other kinds log step 0.
    The model fields become the tags ``icos.model.name``/``.version``/``.sha256``.
    """

    kind: str
    name: str
    params: Mapping[str, ParamValue] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    artifacts: Mapping[str, bytes] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    finished_at: float = field(default_factory=time.time)
    record_id: str = field(default_factory=_new_record_id)
    model_name: str = ""
    model_version: str = ""
    model_sha256: str = ""
    step: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not _KIND.match(self.kind):
            raise ValueError(
                f"kind {self.kind!r} must be a lower-case name such as {', '.join(KINDS)} or an audit kind"
            )
        if not isinstance(self.name, str) or not self.name or len(self.name) > MAX_RUN_NAME_LENGTH:
            raise ValueError(f"run name must be 1-{MAX_RUN_NAME_LENGTH} characters, got {self.name!r}")
        if not isinstance(self.record_id, str) or not _RECORD_ID.match(self.record_id):
            raise ValueError(f"record_id {self.record_id!r} must match {_RECORD_ID.pattern} (a UUID is fine)")
        for key, value in self.params.items():
            _check_key("param", key)
            if not isinstance(value, str | int | float | bool):
                raise ValueError(f"param {key!r} has type {type(value).__name__}; use str, int, float or bool")
            if len(str(value)) > MAX_PARAM_VALUE_LENGTH:
                raise ValueError(f"param {key!r} is longer than {MAX_PARAM_VALUE_LENGTH} characters")
        for key, metric in self.metrics.items():
            _check_key("metric", key)
            if isinstance(metric, bool) or not isinstance(metric, int | float):
                raise ValueError(f"metric {key!r} must be a number, got {type(metric).__name__}")
        for key, tag in self.tags.items():
            _check_key("tag", key)
            if not isinstance(tag, str) or len(tag) > MAX_TAG_VALUE_LENGTH:
                raise ValueError(f"tag {key!r} must be a string of at most {MAX_TAG_VALUE_LENGTH} characters")
        if "mlflow.runName" in self.tags:
            raise ValueError("set the run name with `name`, not the mlflow.runName tag")
        for path, content in self.artifacts.items():
            check_artifact_path(path)
            if not isinstance(content, bytes | bytearray):
                raise ValueError(f"artifact {path!r} must be bytes, got {type(content).__name__}")
        dirs = {"/".join(p.split("/")[:i]) for p in self.artifacts for i in range(1, p.count("/") + 1)}
        clashes = sorted(dirs.intersection(self.artifacts))
        if clashes:
            raise ValueError(f"artifact paths {clashes} are both files and directories")
        for what, t in (("started_at", self.started_at), ("finished_at", self.finished_at)):
            if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
                raise ValueError(f"{what} must be seconds since the epoch, got {t!r}")
        if self.step is not None and (isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0):
            raise ValueError(f"step must be a non-negative integer, got {self.step!r}")
        for what, text in (("model_name", self.model_name), ("model_version", self.model_version)):
            if not isinstance(text, str) or len(text) > MAX_TAG_VALUE_LENGTH:
                raise ValueError(f"{what} must be a string of at most {MAX_TAG_VALUE_LENGTH} characters")
        if self.model_sha256 and not _SHA256.match(self.model_sha256):
            raise ValueError(f"model_sha256 must be 64 lower-case hex digits, got {self.model_sha256!r}")

    @property
    def is_snapshot(self) -> bool:
        """True for estimate snapshots, which are appended to a per-day run."""
        return self.kind == SNAPSHOT_KIND

    @property
    def metric_step(self) -> int:
        """The step the metrics are logged at."""
        if self.step is not None:
            return self.step
        return int(self.finished_at) if self.is_snapshot else 0

    def run_tags(self) -> dict[str, str]:
        """The caller's tags plus ``icos.kind``, ``icos.record_id`` and the model tags that are set."""
        tags = dict(self.tags)
        tags[TAG_KIND] = self.kind
        tags[TAG_RECORD_ID] = self.record_id
        for key, value in (
            (TAG_MODEL_NAME, self.model_name),
            (TAG_MODEL_VERSION, self.model_version),
            (TAG_MODEL_SHA256, self.model_sha256),
        ):
            if value:
                tags[key] = value
        return tags

    def params_as_text(self) -> dict[str, str]:
        """Params as MLflow stores them: ``str(value)``, as ``mlflow.log_param`` does."""
        return {k: str(v) for k, v in self.params.items()}

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (strict JSON: non-finite metrics become strings, artifacts base64)."""
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "kind": self.kind,
            "name": self.name,
            "params": dict(self.params),
            "metrics": {k: _encode_float(float(v)) for k, v in self.metrics.items()},
            "tags": dict(self.tags),
            "artifacts": {p: base64.b64encode(bytes(c)).decode("ascii") for p, c in self.artifacts.items()},
            "started_at": float(self.started_at),
            "finished_at": float(self.finished_at),
            "record_id": self.record_id,
            "model_name": self.model_name,
            "model_version": self.model_version,
            "model_sha256": self.model_sha256,
            "step": self.step,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        """Inverse of :meth:`to_json`; raises ``ValueError`` on anything malformed."""
        if not isinstance(data, Mapping):
            raise ValueError("record must be a JSON object")
        if data.get("format") != FORMAT_NAME or data.get("version") != FORMAT_VERSION:
            raise ValueError(f"not a {FORMAT_NAME} v{FORMAT_VERSION} record: {data.get('format')!r}")
        try:
            artifacts = {str(p): base64.b64decode(c, validate=True) for p, c in dict(data["artifacts"]).items()}
            metrics = {str(k): _decode_float(v) for k, v in dict(data["metrics"]).items()}
            return cls(
                kind=data["kind"],
                name=data["name"],
                params=dict(data["params"]),
                metrics=metrics,
                tags=dict(data["tags"]),
                artifacts=artifacts,
                started_at=data["started_at"],
                finished_at=data["finished_at"],
                record_id=data["record_id"],
                model_name=data["model_name"],
                model_version=data["model_version"],
                model_sha256=data["model_sha256"],
                step=data["step"],
            )
        except (KeyError, TypeError, binascii.Error) as exc:
            raise ValueError(f"malformed record: {exc!r}") from exc


_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _encode_float(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _decode_float(value: object) -> float:
    if isinstance(value, str):
        if value not in _NON_FINITE:
            raise ValueError(f"bad metric value {value!r}")
        return _NON_FINITE[value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"bad metric value {value!r}")
    return float(value)
