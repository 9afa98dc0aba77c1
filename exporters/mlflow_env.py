"""How the agent points mlflow at a store and bounds its HTTP behaviour (no mlflow import).

mlflow reads its settings from environment variables at request time, so
:func:`configure_mlflow_environment` works before or after mlflow is imported. Tracking URIs are
checked here: a local sqlite store is the default, a file store needs MLflow's explicit opt-in.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

DEFAULT_HTTP_TIMEOUT_S = 5
DEFAULT_HTTP_MAX_RETRIES = 1


def configure_mlflow_environment(http_timeout_s: int | None = None, http_max_retries: int | None = None) -> None:
    """Bound mlflow's HTTP behaviour through its documented environment variables.

    ``MLFLOW_HTTP_REQUEST_TIMEOUT`` (default 120 s in mlflow) and ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``
    (default 7, with exponential backoff: minutes against a dead server) are set to the given values,
    or, when ``None``, default to 5 s and 1 retry unless the environment already sets them. Telemetry,
    artifact progress bars and printed run URLs are off unless the environment turns them on.
    mlflow reads these variables at request time, so this works after mlflow is imported too.
    """
    for name, value, default in (
        ("MLFLOW_HTTP_REQUEST_TIMEOUT", http_timeout_s, DEFAULT_HTTP_TIMEOUT_S),
        ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", http_max_retries, DEFAULT_HTTP_MAX_RETRIES),
    ):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
            os.environ[name] = str(value)
        else:
            os.environ.setdefault(name, str(default))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def default_tracking_uri(state_dir: Path) -> str:
    """``sqlite:///<state dir>/mlflow.db`` (absolute), the store used when no URI is configured."""
    return f"sqlite:///{(Path(state_dir).resolve() / 'mlflow.db').as_posix()}"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for other URIs and in-memory databases)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path).resolve()


def check_tracking_uri(uri: str) -> None:
    """Refuse a file-store URI that MLflow itself would refuse later (unless opted in)."""
    scheme = urlparse(uri).scheme
    if scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        raise ValueError(
            f"MLflow tracking URI {uri!r} is a file store, which MLflow 3.17 refuses unless "
            "MLFLOW_ALLOW_FILE_STORE=true; use sqlite:///<path>/mlflow.db or an http(s):// server instead"
        )


def default_artifact_location(uri: str) -> str | None:
    """For a local sqlite store: ``<db dir>/mlartifacts`` (else mlflow would use ``./mlruns``)."""
    db = sqlite_path(uri)
    return (db.parent / "mlartifacts").as_uri() if db is not None else None


def resolve_uri(tracking_uri: str | None) -> str:
    """The given tracking URI, else ``MLFLOW_TRACKING_URI``, checked (ValueError when neither)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ValueError("no MLflow tracking URI: pass one or set MLFLOW_TRACKING_URI")
    check_tracking_uri(uri)
    return uri
