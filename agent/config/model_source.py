"""The agent's model and bundle from an MLflow model URI (``model.uri: models:/name@alias``).

The model version is downloaded with :func:`exporters.mlflow_logger.download_model` into
``<state_dir>/models/<digest of the URI>/`` (a temporary directory without a state directory):
the ``.onnx`` file becomes ``model.path``, and the ``bundle/`` directory logged next to it becomes
``bundle.path`` unless the config names a bundle. The MLflow server is ``model.tracking_uri``, else
``MLFLOW_TRACKING_URI``, else ``audits.mlflow.tracking_uri``. A failed download stops the start with
one line naming the URI.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from agent.config.settings import AgentSettings
from agent.errors import UserError
from exporters.mlflow_logger import download_model

__all__ = ["fetch_model"]


def _tracking_uri(settings: AgentSettings) -> str | None:
    return settings.model.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or settings.audits.mlflow.tracking_uri


def fetch_model(settings: AgentSettings) -> AgentSettings:
    """Download ``model.uri`` (if set) and point ``model.path``/``bundle.path`` at the local copy.

    Returns ``settings`` (modified in place); without ``model.uri`` it is returned unchanged.
    """
    uri = settings.model.uri
    if uri is None or settings.model.path is not None:
        return settings
    tracking = _tracking_uri(settings)
    if uri.startswith(("models:/", "runs:/")) and not tracking:
        raise UserError(f"model.uri {uri}: set model.tracking_uri or MLFLOW_TRACKING_URI to find the MLflow server")
    digest = hashlib.sha256(f"{tracking}\0{uri}".encode()).hexdigest()[:16]
    if settings.state_dir is not None:
        dest = Path(settings.state_dir) / "models" / digest
    else:
        dest = Path(tempfile.mkdtemp(prefix="icos-agent-model-"))
    try:
        downloaded = download_model(uri, tracking, dest)
    except Exception as exc:  # mlflow raises many types: unreachable, unknown alias, missing files
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"model.uri {uri}: cannot download the model from MLflow ({text})") from None
    settings.model.path = downloaded.onnx_path
    if settings.bundle.path is None:
        if downloaded.bundle_dir is None:
            raise UserError(f"model.uri {uri}: no bundle/ directory next to the ONNX file; set bundle.path")
        settings.bundle.path = downloaded.bundle_dir
    return settings
