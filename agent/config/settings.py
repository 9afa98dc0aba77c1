"""Configuration of ``icos-agent serve``: a YAML file plus ``ICOS_AGENT_`` environment overrides.

Precedence (highest first): environment variables (``ICOS_AGENT_SERVER__PORT=9000``; ``__`` separates
nested fields), the YAML file, the defaults below. Secrets (the admin bearer token) are read from the
environment only (``ICOS_AGENT_ADMIN_TOKEN``) and never from the file.

:func:`load_settings` validates everything at start and raises :class:`agent.errors.UserError` with
one line per problem, each naming the field, e.g.
``agent.yaml: server.port: Input should be less than or equal to 65535``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agent.audits.config import AuditsConfig
from agent.config.sampling import LabelSampling
from agent.core.durations import parse_duration
from agent.errors import UserError
from invariants.untrusted import safe_load_yaml

ENV_PREFIX = "ICOS_AGENT_"
ADMIN_TOKEN_ENV = "ICOS_AGENT_ADMIN_TOKEN"
#: The labelers' bearer token: when set, reading the labeling sample and posting labels need it.
LABELS_TOKEN_ENV = "ICOS_AGENT_LABELS_TOKEN"
#: Secrets read from the environment only, never settings fields.
SECRET_ENVS = (ADMIN_TOKEN_ENV, LABELS_TOKEN_ENV)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Section):
    name: str = Field("model", min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    version: str = Field("1", min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    path: Path | None = None
    uri: str | None = Field(None, pattern=r"^(models|runs|mlflow-artifacts|https?|s3|gs|file):.+")
    tracking_uri: str | None = None
    scores_output: str | None = None
    scores_kind: Literal["auto", "logits", "probabilities"] = "auto"
    classes: list[str] | None = None


class BundleConfig(_Section):
    path: Path | None = None


class ServerConfig(_Section):
    host: str = "0.0.0.0"  # noqa: S104 - a sidecar listens on the pod network
    port: int = Field(8080, ge=1, le=65535)
    metrics_port: int | None = Field(None, ge=1, le=65535)
    admin_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="a port of its own for the admin API (reload, recalibrate, triggered audits): "
        "when set, those endpoints answer only there (404 on server.port) and that port answers only "
        "them and the health checks, so a NetworkPolicy can admit its callers alone; null keeps them on server.port",
    )
    grpc_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="port of the Open Inference Protocol's gRPC service (`inference.GRPCInferenceService`, "
        "serve and proxy modes; 8081 is the usual choice beside Triton's and KServe's); null: HTTP only. "
        "Request messages are bounded by `server.max_body_bytes`",
    )
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    max_inflight_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="bytes of request bodies (HTTP) and messages (gRPC) held at once; a request that does not fit "
        'is answered 503 with `Retry-After` (`icos_connections_refused_total{reason="bytes_in_flight"}`), so a '
        "burst of large requests cannot hold gigabytes; one request always fits an idle server",
    )
    max_batch: int = Field(1024, ge=1)
    max_tensor_elements: int = Field(1 << 24, ge=1)
    threads: int = Field(8, ge=1, le=256)
    blas_threads: int = Field(1, ge=1, le=256)
    graceful_timeout_seconds: float = Field(20.0, gt=0)
    access_log: bool = False
    max_metadata_value_bytes: int = Field(1024, ge=1, le=1 << 20)
    limit_concurrency: int = Field(512, ge=1, le=1_000_000)
    timeout_keep_alive_seconds: int = Field(5, ge=1, le=3600)
    header_timeout_seconds: float = Field(10.0, gt=0, le=3600)
    body_timeout_seconds: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="a request body not complete this many seconds after its head closes the connection "
        '(icos_connections_refused_total{reason="body_timeout"}); bounds how long a client that dribbles '
        "its body holds a request slot",
    )
    max_head_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)


class UpstreamConfig(_Section):
    url: str | None = None
    model_name: str | None = None
    timeout_seconds: float = Field(10.0, gt=0, le=600)
    scores_output: str | None = None
    max_response_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        le=1 << 32,
        description="largest upstream answer the agent reads (its declared length and the bytes streamed); "
        "a larger one answers 502 and is never buffered past this",
    )
    ready_interval_seconds: float = Field(
        2.0,
        ge=0.05,
        le=300,
        description="how often the agent asks the upstream whether its model is ready "
        "(`GET /v2/models/{upstream.model_name}/ready`, in the background); the agent's own readiness "
        "(`/v2/health/ready`, gRPC `ServerReady`/`ModelReady`) follows the last answer",
    )
    ready_timeout_seconds: float = Field(
        1.0,
        gt=0,
        le=60,
        description="bound on one readiness check of the upstream: no 200 within it counts as not ready",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^\s/]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/") if v else v


class WindowsConfig(_Section):
    time: list[str] = Field(default_factory=lambda: ["5m", "1h"])
    count: int | None = Field(1000, ge=1, le=10_000_000)

    @field_validator("time")
    @classmethod
    def _durations(cls, v: list[str]) -> list[str]:
        seen: set[float] = set()
        for item in v:
            seconds = parse_duration(item)
            if seconds < 1:
                raise ValueError(f"window {item!r} is shorter than one second")
            if seconds in seen:
                raise ValueError(f"window {item!r} is listed twice")
            seen.add(seconds)
        return [s.strip() for s in v]


class MetricsConfig(_Section):
    per_class_label_cap: int = Field(20, ge=0, le=1000)


class JudgingConfig(_Section):
    sample_rate: float = Field(
        1.0,
        gt=0,
        le=1,
        description="share of requests judged when their client does not ask for `icos_verdict` (drawn uniformly "
        "at random per request): bounds the agent's cost whatever the traffic; the estimates and their intervals "
        "rest on the judged predictions (`n`), the others are counted in `icos_unjudged_predictions_total` and not "
        "stored for delayed labels. Verdicts a client asks for are always computed; `labels.durability: commit` "
        "judges every request",
    )


class ObserveConfig(_Section):
    queue_size: int = Field(1000, ge=1)
    event_ttl_seconds: float = Field(60.0, gt=0)
    event_buffer: int = Field(10_000, ge=1)
    max_pending_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="bytes of decoded CloudEvents waiting for their pair; an event that would pass it is "
        "refused with 429 and `Retry-After`, so unpaired events cannot fill the pod's memory",
    )
    max_metadata_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="per-sample metadata of one observation or request event, counted as numpy stores it "
        "(samples × longest value, summed over fields); refused with 413 before it is allocated",
    )
    workers: int = Field(1, ge=1, le=32)


class StateConfig(_Section):
    flush_interval_seconds: float = Field(10.0, gt=0)


class SecurityConfig(_Section):
    """``allowed_roots``: when not empty, every model, bundle and audit data path (in the file and in
    reload requests) must lie under one of these directories after symlinks are resolved."""

    allowed_roots: list[Path] = Field(default_factory=list)


class LabelsConfig(LabelSampling):
    """Delayed labels (:mod:`agent.labels.service`): the prediction store and recalibration."""

    enabled: bool = True
    max_predictions: int = Field(200_000, ge=100, le=100_000_000)
    max_age: str = "7d"
    flush_interval_seconds: float = Field(1.0, gt=0, le=600)
    queue_limit: int = Field(100_000, ge=1000)
    max_batch: int = Field(10_000, ge=1, le=1_000_000)
    min_recalibration_samples: int = Field(200, ge=10)
    auto_recalibrate_every: int | None = Field(None, ge=10)
    durability: Literal["batched", "commit"] = Field(
        "batched",
        description="`batched`: predictions are committed every flush interval, after the answer (a SIGKILL "
        "loses at most that interval's, gauge `icos_prediction_store_queued`); `commit`: a request is "
        "answered only after its predictions are committed (group commit across concurrent requests)",
    )
    commit_timeout_seconds: float = Field(
        5.0,
        gt=0,
        le=300,
        description="in `commit` mode, how long a request waits for its commit before it is answered 503 "
        "(`prediction_store_unavailable`)",
    )
    store_url: SecretStr | None = Field(
        None,
        description="a `postgresql://` URL: keep predictions and labels in PostgreSQL shared by every replica "
        "(null: SQLite in `state_dir`); `mode: fleet` reads the fleet's labels from it (its `with_labels`); "
        "prefer the environment variable `ICOS_AGENT_LABELS__STORE_URL` or `labels.store_url_file` over the "
        "config file; its password is never shown",
    )
    store_url_file: Path | None = Field(
        None,
        description="a file holding the `postgresql://` URL (e.g. a mounted Kubernetes Secret), read at start "
        "instead of `labels.store_url`",
    )
    pool_size: int = Field(4, ge=1, le=64, description="PostgreSQL connections per replica at most")
    sample_rate: float = Field(
        0.01,
        ge=0,
        le=1,
        description="with `labels.sampling: uniform`, the share of predictions drawn uniformly at random into "
        "the labeling sample (listed by `GET /v1/labels/requests`); their labels give the estimator "
        "`with_labels`, valid whatever the shift (0: no sample)",
    )
    keep_sampled_inputs: bool = Field(
        False,
        description="keep the inputs of sampled predictions for labeling (`GET /v1/labels/requests?inputs=true`, "
        "`icos-agent labels export`): user data, bounded by the two settings below",
    )
    max_kept_input_bytes: int = Field(65_536, ge=64, le=1 << 24, description="larger encoded inputs are not kept")
    max_kept_inputs_bytes: int = Field(1 << 26, ge=1024, le=1 << 36, description="all kept inputs; the oldest go first")
    fleet_refresh_seconds: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="with a shared store, how often the realized windows re-read the labels every replica received",
    )

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


class FleetConfig(_Section):
    """``mode: fleet``: the evaluator that sums every replica's ``icos_window_stat_total`` from a
    Prometheus-compatible API and serves the fleet's estimates (:mod:`agent.fleet`)."""

    prometheus_url: str | None = Field(
        None,
        description="base URL of a Prometheus-compatible HTTP API (Prometheus, VictoriaMetrics, Thanos Query, Mimir's "
        "/prometheus prefix); /api/v1/query is appended",
    )
    refresh_seconds: float = Field(30.0, ge=1, le=3600, description="seconds between two evaluations of the fleet")
    query_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="total deadline of one query to the API: connecting, sending and reading its whole answer "
        '(icos_fleet_query_errors_total{reason="timeout"})',
    )
    refresh_timeout_seconds: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="total deadline of one refresh (every query of every window, and the estimators); a refresh "
        'past it fails (icos_fleet_query_errors_total{reason="deadline"}) and the last estimates are kept, so '
        "a slow or dripping API cannot hold the evaluator longer",
    )
    max_response_bytes: int = Field(
        8 * 1024 * 1024,
        ge=64 * 1024,
        le=1 << 30,
        description="largest answer of the API read (its declared length and the bytes streamed); a larger one "
        'fails the refresh (reason="too_large") without being buffered past this. Parsing an answer costs up '
        "to about 15 times its size in memory; a restarted replica's raw samples are the largest legitimate "
        "answer (docs/scaling.md)",
    )
    max_series: int = Field(
        20_000,
        ge=100,
        le=1_000_000,
        description='most series in one answer of the API; more fail the refresh (reason="too_many_series")',
    )
    max_versions: int = Field(
        16,
        ge=1,
        le=1000,
        description="most model versions in one window's answers (each one is estimated and exported); more fail "
        'the refresh (reason="too_many_versions")',
    )
    selector: str = Field(
        "",
        pattern=r'^[A-Za-z0-9_]+(=|!=|=~|!~)"[^"\\]*"(,[A-Za-z0-9_]+(=|!=|=~|!~)"[^"\\]*")*$|^$',
        description='further label matchers of the replicas\' series, e.g. namespace="prod",job="icos-agent"',
    )
    lookback_seconds: float = Field(
        300.0,
        ge=1,
        le=86_400,
        description="how far before a window's start a replica's last counter value is looked for "
        "(Prometheus's default lookback is 5 minutes)",
    )
    stale_after_seconds: float | None = Field(
        None,
        gt=0,
        description="age of the last successful evaluation after which estimates are marked stale "
        "(default: three refresh periods)",
    )

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/") if v else v

    @property
    def stale_seconds(self) -> float:
        return self.stale_after_seconds or 3 * self.refresh_seconds


class AgentSettings(BaseSettings):
    """Every setting of the sidecar (see ``deploy/examples/agent.yaml`` for an annotated copy)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        case_sensitive=False,
    )

    mode: Literal["serve", "proxy", "observe", "fleet"] = "serve"
    model: ModelConfig = Field(default_factory=ModelConfig)
    bundle: BundleConfig = Field(default_factory=BundleConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    windows: WindowsConfig = Field(default_factory=WindowsConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    judging: JudgingConfig = Field(default_factory=JudgingConfig)
    observe: ObserveConfig = Field(default_factory=ObserveConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    labels: LabelsConfig = Field(default_factory=LabelsConfig)
    state_dir: Path | None = None
    audits: AuditsConfig = Field(default_factory=AuditsConfig)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    fleet: FleetConfig = Field(default_factory=FleetConfig)

    @model_validator(mode="after")
    def _mode_needs(self) -> AgentSettings:
        if self.model.uri is not None and self.model.path is not None:
            raise ValueError("set model.path or model.uri (an MLflow model URI), not both")
        if self.bundle.path is None and self.model.uri is None:
            raise ValueError("bundle.path is required (a bundle directory written by `icos-agent fit`)")
        if self.mode == "serve" and self.model.path is None and self.model.uri is None:
            raise ValueError(
                "model.path is required in serve mode (or model.uri, an MLflow model URI; "
                "environment: ICOS_AGENT_MODEL__PATH)"
            )
        if self.mode == "fleet" and self.fleet.prometheus_url is None:
            raise ValueError(
                "fleet.prometheus_url is required in fleet mode (environment: ICOS_AGENT_FLEET__PROMETHEUS_URL)"
            )
        if self.mode == "proxy" and self.upstream.url is None:
            raise ValueError("upstream.url is required in proxy mode")
        if self.server.metrics_port is not None and self.server.metrics_port == self.server.port:
            raise ValueError("server.metrics_port must differ from server.port")
        if self.server.admin_port is not None and self.server.admin_port in (
            self.server.port,
            self.server.metrics_port,
            self.server.grpc_port,
        ):
            raise ValueError("server.admin_port must differ from server.port, metrics_port and grpc_port")
        if self.server.grpc_port is not None and self.server.grpc_port in (self.server.port, self.server.metrics_port):
            raise ValueError("server.grpc_port must differ from server.port and server.metrics_port")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment overrides the file (passed as init kwargs); no .env files, no secret dirs.
        return (env_settings, init_settings)

    @property
    def upstream_model_name(self) -> str:
        return self.upstream.model_name or self.model.name

    @property
    def window_seconds(self) -> dict[str, float]:
        return {w: parse_duration(w) for w in self.windows.time}


def admin_token() -> str | None:
    """The admin bearer token from the environment (never from the file); ``None`` disables admin.

    Surrounding white space is dropped: a Secret made from a file (``echo token > f``) ends in a newline
    that no ``Authorization`` header can carry, and such a token could never match."""
    return _env_token(ADMIN_TOKEN_ENV)


def labels_token() -> str | None:
    """The labelers' bearer token from the environment (``ICOS_AGENT_LABELS_TOKEN``); ``None``: labels
    and the labeling sample are open to every client of the port (see SECURITY.md)."""
    return _env_token(LABELS_TOKEN_ENV)


def _env_token(name: str) -> str | None:
    token = os.environ.get(name, "").strip()
    return token or None


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem: ``<source>: <field.path>: <message>``."""
    lines = []
    for err in exc.errors(include_url=False):
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        loc = _loc(tuple(err["loc"]))
        lines.append(f"{source}: {msg}" if loc == "(top level)" else f"{source}: {loc}: {msg}")
    return "\n".join(lines)


def _reject_secret_keys(data: dict[str, Any], source: str) -> None:
    for key in ("admin_token", "labels_token", "token"):
        if key in data:
            raise UserError(f"{source}: {key}: secrets are read from the environment only ({' or '.join(SECRET_ENVS)})")
    labels = data.get("labels")
    url = labels.get("store_url") if isinstance(labels, dict) else None
    if isinstance(url, str) and _has_password(url):
        raise UserError(
            f"{source}: labels.store_url: a URL with a password is read from the environment "
            f"({ENV_PREFIX}LABELS__STORE_URL) or a file (labels.store_url_file), not from the config file"
        )


def _has_password(url: str) -> bool:
    """Whether a URL carries a password (``user:password@`` or a ``password=`` parameter)."""
    _, sep, rest = url.partition("://")
    userinfo = rest.split("/", 1)[0].rpartition("@")[0] if sep else ""
    return ":" in userinfo or "password=" in url.lower()


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> AgentSettings:
    """Read the YAML file (if any), apply ``ICOS_AGENT_*`` environment overrides, validate.

    Relative paths in the file (model, bundle, state dir) are resolved against the file's directory.
    """
    data: dict[str, Any] = {}
    source = "config"
    base: Path | None = None
    if path is not None:
        p = Path(path)
        source = p.name
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise UserError(f"config file not found: {p}") from exc
        except UnicodeDecodeError as exc:
            raise UserError(f"{source}: not UTF-8 text (byte {exc.start})") from None
        except OSError as exc:
            raise UserError(f"cannot read config file {p}: {exc.strerror}") from exc
        try:
            loaded = safe_load_yaml(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise UserError(f"{source}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
        except RecursionError:
            raise UserError(f"{source}: not valid YAML: nested too deeply") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise UserError(f"{source}: the top level must be a mapping of settings")
        data = loaded
        base = p.resolve().parent
    _reject_secret_keys(data, source)
    data.update(overrides)
    env_keys = ", ".join(k for k in os.environ if k.startswith(ENV_PREFIX) and k not in SECRET_ENVS)
    try:
        # The tokens are deliberately not fields: hide them from the settings source.
        saved = {k: os.environ.pop(k) for k in SECRET_ENVS if k in os.environ}
        try:
            settings = AgentSettings(**data)
        finally:
            os.environ.update(saved)
    except ValidationError as exc:
        src = source + (f" (with environment {env_keys})" if env_keys else "")
        raise UserError(format_validation_error(exc, src)) from exc
    if base is not None:
        settings = _resolve_paths(settings, base)
    for what, target in configured_paths(settings):
        problem = path_problem(target, settings.security.allowed_roots)
        if problem:
            raise UserError(f"{source}: {what}: {problem}")
    return settings


def path_problem(path: str | os.PathLike[str], roots: list[Path]) -> str | None:
    """Why ``path`` is not allowed by ``security.allowed_roots`` (``None`` when it is, or when no
    roots are configured). Symlinks are resolved first, so a link cannot lead out of a root."""
    if not roots:
        return None
    real = Path(os.path.realpath(path))
    for root in roots:
        r = Path(os.path.realpath(root))
        if real == r or real.is_relative_to(r):
            return None
    return f"{path} is outside security.allowed_roots ({', '.join(str(r) for r in roots)})"


def configured_paths(s: AgentSettings) -> list[tuple[str, Path]]:
    """``(field, path)`` of every file the agent reads: model, bundle, audit data."""
    out = [(f, p) for f, p in (("model.path", s.model.path), ("bundle.path", s.bundle.path)) if p is not None]
    if s.audits.reference is not None and s.audits.reference.path is not None:
        out.append(("audits.reference.path", s.audits.reference.path))
    for kind, job in s.audits.jobs().items():
        if job.data is not None and job.data.path is not None:
            out.append((f"audits.{kind}.data.path", job.data.path))
    return out


def _resolve_paths(s: AgentSettings, base: Path) -> AgentSettings:
    def fix(p: Path | None) -> Path | None:
        return p if p is None or p.is_absolute() else (base / p)

    s.model.path = fix(s.model.path)
    s.bundle.path = fix(s.bundle.path)
    s.state_dir = fix(s.state_dir)
    s.labels.store_url_file = fix(s.labels.store_url_file)
    s.security.allowed_roots = [r if r.is_absolute() else base / r for r in s.security.allowed_roots]
    s.audits.resolve_paths(base)
    return s
