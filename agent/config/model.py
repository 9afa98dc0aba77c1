"""The ``model`` and ``bundle`` sections: which classifier the agent judges and the invariant bundle fitted
for it (a file, or an MLflow model URI that brings both, :mod:`agent.config.model_source`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from agent.config.section import Section


class ModelConfig(Section):
    name: str = Field("model", min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    """model name in `/v2/models/{name}` and in metric labels"""

    version: str = Field("1", min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    """version in V2 responses and metric labels"""

    path: Path | None = None
    """the ONNX file; required in serve mode, optional in proxy/observe mode (then only used to check the bundle's
    model sha256 and for audits)"""

    uri: str | None = Field(None, pattern=r"^(models|runs|mlflow-artifacts|https?|s3|gs|file):.+")
    """an MLflow model URI instead of `path` (`models:/name@alias`, `runs:/...`); the ONNX file and the bundle logged
    next to it are downloaded into `<state_dir>/models/`"""

    tracking_uri: str | None = None
    """MLflow tracking URI used to resolve `uri`"""

    scores_output: str | None = None
    """the model output holding the class scores (null: detect)"""

    scores_kind: Literal["auto", "logits", "probabilities"] = "auto"
    """whether the scores are logits (a softmax is applied) or probabilities; also applies to upstream and observed
    scores"""

    classes: list[str] | None = None
    """class names; null: `0..K-1` (or the bundle's)"""


class BundleConfig(Section):
    path: Path | None = None
    """the invariant bundle directory written by `icos-agent fit` (required unless `model.uri` brings one)"""
