"""Configuration of ``icos-agent serve``: a YAML file plus ``ICOS_AGENT_`` environment overrides.

:class:`AgentSettings` is the root; its sections live with their concern (:mod:`.model`, :mod:`.server`,
:mod:`.estimates`, :mod:`.labels`, :mod:`.fleet`, :mod:`.challenger`, and :mod:`agent.audits.config` for
``audits``), each field documented by its docstring, from which ``docs/gen_config.py`` writes docs/configuration.md.

Precedence (highest first): environment variables (``ICOS_AGENT_SERVER__PORT=9000``; ``__`` separates
nested fields), the YAML file, the defaults below. Secrets (the admin bearer token) are read from the
environment only (``ICOS_AGENT_ADMIN_TOKEN``) and never from the file.

:func:`load_settings` validates everything at start and raises :class:`agent.errors.UserError` with
one line per problem, each naming the field, e.g.
``agent.yaml: server.port: Input should be less than or equal to 65535``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agent.audits.config import AuditsConfig
from agent.config.challenger import ChallengerConfig
from agent.config.estimates import JudgingConfig, MetricsConfig, StateConfig, WindowsConfig
from agent.config.fleet import FleetConfig
from agent.config.labels import LabelsConfig
from agent.config.model import BundleConfig, ModelConfig
from agent.config.section import Section
from agent.config.server import ObserveConfig, ServerConfig, UpstreamConfig
from agent.core.durations import parse_duration
from agent.errors import UserError
from invariants.untrusted import safe_load_yaml

ENV_PREFIX = "ICOS_AGENT_"
ADMIN_TOKEN_ENV = "ICOS_AGENT_ADMIN_TOKEN"
#: The labelers' bearer token: when set, reading the labeling sample and posting labels need it.
LABELS_TOKEN_ENV = "ICOS_AGENT_LABELS_TOKEN"
#: Secrets read from the environment only, never settings fields.
SECRET_ENVS = (ADMIN_TOKEN_ENV, LABELS_TOKEN_ENV)


class SecurityConfig(Section):
    """``allowed_roots``: when not empty, every model, bundle and audit data path (in the file and in
    reload requests) must lie under one of these directories after symlinks are resolved."""

    allowed_roots: list[Path] = Field(default_factory=list)
    """when not empty, every model, bundle and audit data path (in the file and in reload requests) must lie under
    one of these directories, symlinks resolved"""


class AgentSettings(BaseSettings):
    """Every setting of the sidecar (see ``deploy/examples/agent.yaml`` for an annotated copy)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        case_sensitive=False,
        use_attribute_docstrings=True,
    )

    mode: Literal["serve", "proxy", "observe", "fleet"] = "serve"
    """`serve`: the agent runs the ONNX model; `proxy`: forwards V2 requests to `upstream` and judges its answers;
    `observe`: judges predictions posted to `/v1/observe`"""

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
    """directory for state: estimate windows, the prediction store of delayed labels, the MLflow spool and the
    default MLflow store `sqlite:///<state_dir>/mlflow.db`; one agent per directory (`serve` locks
    `<state_dir>/icos-agent.lock`, a second agent on it does not start)"""

    audits: AuditsConfig = Field(default_factory=AuditsConfig)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """level of the JSON log lines on stderr"""

    fleet: FleetConfig = Field(default_factory=FleetConfig)
    challenger: ChallengerConfig = Field(default_factory=ChallengerConfig)

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
        if self.challenger.enabled and self.mode != "fleet" and self.challenger.model_path is None:
            raise ValueError(f"challenger.model_path is required with challenger.bundle_path in {self.mode} mode")
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
    named = (
        ("model.path", s.model.path),
        ("bundle.path", s.bundle.path),
        ("challenger.model_path", s.challenger.model_path),
        ("challenger.bundle_path", s.challenger.bundle_path),
    )
    out = [(f, p) for f, p in named if p is not None]
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
    s.challenger.model_path = fix(s.challenger.model_path)
    s.challenger.bundle_path = fix(s.challenger.bundle_path)
    s.state_dir = fix(s.state_dir)
    s.labels.store_url_file = fix(s.labels.store_url_file)
    s.security.allowed_roots = [r if r.is_absolute() else base / r for r in s.security.allowed_roots]
    s.audits.resolve_paths(base)
    return s
