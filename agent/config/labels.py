"""The ``labels`` section: the prediction store that delayed labels join, its durability and recalibration
(the labeling sample's draws are in :mod:`agent.config.sampling`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from agent.config.sampling import LabelSampling
from agent.core.durations import parse_duration
from agent.errors import UserError


class LabelsConfig(LabelSampling):
    """Delayed labels (:mod:`agent.labels.service`): the prediction store and recalibration."""

    enabled: bool = True
    """accept delayed labels (`POST /v1/labels`) and keep predictions for them"""

    max_predictions: int = Field(200_000, ge=100, le=100_000_000)
    """predictions kept for delayed labels (oldest evicted first)"""

    max_age: str = "7d"
    """predictions older than this are evicted from the store"""

    flush_interval_seconds: float = Field(1.0, gt=0, le=600)
    """how often the background writer stores judged predictions"""

    queue_limit: int = Field(100_000, ge=1000)
    """judged predictions waiting for the writer at most (more are dropped and counted)"""

    max_batch: int = Field(10_000, ge=1, le=1_000_000)
    """labels per `POST /v1/labels` request at most"""

    max_source_share: float = Field(0.5, gt=0, le=1)
    """the share of a window's (and of each of its segments') labels that one source (the labels token's name, or
    the client's address without a token) weighs at most in the realized figures: a source holding more has its
    labels down-weighted to that share (with fewer than 1/share sources each weighs the same; a single source is
    not capped; 1: no cap), counted in `icos_realized_capped_labels`"""

    min_recalibration_samples: int = Field(200, ge=10)
    """labeled predictions `POST /v1/recalibrate` needs at least"""

    auto_recalibrate_every: int | None = Field(None, ge=10)
    """recalibrate automatically after this many new labels (null: never)"""

    durability: Literal["batched", "commit"] = "batched"
    """`batched`: predictions are committed every flush interval, after the answer (a SIGKILL loses at most that
    interval's, gauge `icos_prediction_store_queued`); `commit`: a request is answered only after its predictions
    are committed (group commit across concurrent requests)"""

    commit_timeout_seconds: float = Field(5.0, gt=0, le=300)
    """in `commit` mode, how long a request waits for its commit before it is answered 503
    (`prediction_store_unavailable`)"""

    store_url: SecretStr | None = None
    """a `postgresql://` URL: keep predictions and labels in PostgreSQL shared by every replica (null: SQLite in
    `state_dir`); `mode: fleet` reads the fleet's labels from it (its `with_labels`); prefer the environment
    variable `ICOS_AGENT_LABELS__STORE_URL` or `labels.store_url_file` over the config file; its password is never
    shown"""

    store_url_file: Path | None = None
    """a file holding the `postgresql://` URL (e.g. a mounted Kubernetes Secret), read at start instead of
    `labels.store_url`"""

    pool_size: int = Field(4, ge=1, le=64)
    """PostgreSQL connections per replica at most"""

    sample_rate: float = Field(0.01, ge=0, le=1)
    """with `labels.sampling: uniform`, the share of predictions drawn uniformly at random into the labeling sample
    (listed by `GET /v1/labels/requests`); their labels give the estimator `with_labels`, valid whatever the shift
    (0: no sample)"""

    keep_sampled_inputs: bool = False
    """keep the inputs of sampled predictions for labeling (`GET /v1/labels/requests?inputs=true`, `icos-agent labels
    export`): user data, bounded by the two settings below"""

    max_kept_input_bytes: int = Field(65_536, ge=64, le=1 << 24)
    """larger encoded inputs are not kept"""

    max_kept_inputs_bytes: int = Field(1 << 26, ge=1024, le=1 << 36)
    """all kept inputs; the oldest go first"""

    fleet_refresh_seconds: float = Field(10.0, gt=0, le=3600)
    """with a shared store, how often the realized windows re-read the labels every replica received"""

    @model_validator(mode="after")
    def _store_url(self) -> LabelsConfig:
        if self.store_url is not None and self.store_url_file is not None:
            raise ValueError("set labels.store_url or labels.store_url_file, not both")
        url = self.store_url.get_secret_value() if self.store_url is not None else None
        if url is not None and not url.startswith(("postgresql://", "postgres://")):
            raise ValueError("labels.store_url must be a postgresql:// URL")
        return self

    def database_url(self) -> str | None:
        """The store's PostgreSQL URL (from ``store_url`` or read from ``store_url_file``), or None."""
        if self.store_url is not None:
            return self.store_url.get_secret_value().strip() or None
        if self.store_url_file is None:
            return None
        try:
            text = self.store_url_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UserError(f"labels.store_url_file: cannot read {self.store_url_file}: {exc.strerror}") from exc
        if not text.startswith(("postgresql://", "postgres://")):
            raise UserError(f"labels.store_url_file: {self.store_url_file} does not hold a postgresql:// URL")
        return text

    @field_validator("max_age")
    @classmethod
    def _age(cls, v: str) -> str:
        if parse_duration(v) < 1:
            raise ValueError(f"{v!r} is shorter than one second")
        return v.strip()

    @property
    def max_age_seconds(self) -> float:
        return parse_duration(self.max_age)
