"""The ``challenger`` section: a second version of the model run beside the champion on the same inputs,
off the request path, and compared with it (docs/challenger.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from agent.config.section import Section


class ChallengerConfig(Section):
    """A challenger run on a share of the champion's requests (:mod:`agent.dataplane.challenger`): in every
    mode but ``fleet`` the agent runs it locally on the requests' inputs; in ``fleet`` mode only its bundle is
    read, for the replicas' paired statistics."""

    model_path: Path | None = None
    """the challenger's ONNX file (null: no challenger); it reads the champion's inputs and predicts its classes"""

    bundle_path: Path | None = None
    """the challenger's bundle, fitted for it with `icos-agent fit --champion <the champion's ONNX>`: it judges the
    challenger's predictions and holds the comparison's calibration"""

    version: str = Field("challenger", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    """the challenger's name in `/v1/estimates` and in the `challenger` label of the `icos_challenger_*` metrics"""

    share: float = Field(1.0, gt=0, le=1)
    """share of the judged requests the challenger also predicts, drawn per request (all of a request's predictions
    or none) from a key of the process's own, so no client can choose which are compared"""

    queue_limit: int = Field(64, ge=1, le=100_000)
    """requests waiting for the challenger at most; more are dropped and counted
    (`icos_challenger_dropped_total{reason="queue_full"}`): the champion's answers never wait for it"""

    labels_per_window: int = Field(50, ge=0, le=1_000_000)
    """with delayed labels: disagreements of the two versions drawn into the labeling sample per
    `labels.budget_window` (each at least with the probability that meets it; 0: no preference), from whose labels
    the label-assisted difference is estimated"""

    scores_output: str | None = None
    """the challenger's output holding the class scores (null: detect)"""

    scores_kind: Literal["auto", "logits", "probabilities"] = "auto"
    """whether the challenger's scores are logits (a softmax is applied) or probabilities"""

    @model_validator(mode="after")
    def _both(self) -> ChallengerConfig:
        if self.model_path is not None and self.bundle_path is None:
            raise ValueError("challenger.bundle_path is required with challenger.model_path")
        return self

    @property
    def enabled(self) -> bool:
        return self.bundle_path is not None
