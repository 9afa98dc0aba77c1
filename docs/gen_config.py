"""Generate ``docs/configuration.md`` from the pydantic settings model (:class:`agent.config.settings.AgentSettings`).

    python docs/gen_config.py           # rewrite docs/configuration.md
    python docs/gen_config.py --check   # exit 1 when docs/configuration.md is stale

Names, types, defaults and bounds come from the model; a field's meaning comes from its
``description`` when it has one, else from :data:`MEANINGS` below. A field with neither is an
error, so a new setting cannot go undocumented.
"""

from __future__ import annotations

import enum
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import generated_page  # noqa: E402
from pydantic import BaseModel  # noqa: E402
from pydantic.fields import FieldInfo  # noqa: E402

from agent.config.settings import ENV_PREFIX, AgentSettings  # noqa: E402

OUT = ROOT / "docs" / "configuration.md"

#: Meaning of fields whose model has no ``description``, by ``Class.field``.
MEANINGS: dict[str, str] = {
    "AgentSettings.mode": "`serve`: the agent runs the ONNX model; `proxy`: forwards V2 requests to `upstream` "
    "and judges its answers; `observe`: judges predictions posted to `/v1/observe`",
    "AgentSettings.state_dir": "directory for state: estimate windows, the prediction store of delayed labels, "
    "the MLflow spool and the default MLflow store `sqlite:///<state_dir>/mlflow.db`; one agent per directory "
    "(`serve` locks `<state_dir>/icos-agent.lock`, a second agent on it does not start)",
    "AgentSettings.log_level": "level of the JSON log lines on stderr",
    "ModelConfig.name": "model name in `/v2/models/{name}` and in metric labels",
    "ModelConfig.version": "version in V2 responses and metric labels",
    "ModelConfig.path": "the ONNX file; required in serve mode, optional in proxy/observe mode (then only used "
    "to check the bundle's model sha256 and for audits)",
    "ModelConfig.uri": "an MLflow model URI instead of `path` (`models:/name@alias`, `runs:/...`); the ONNX file "
    "and the bundle logged next to it are downloaded into `<state_dir>/models/`",
    "ModelConfig.tracking_uri": "MLflow tracking URI used to resolve `uri`",
    "ModelConfig.scores_output": "the model output holding the class scores (null: detect)",
    "ModelConfig.scores_kind": "whether the scores are logits (a softmax is applied) or probabilities; "
    "also applies to upstream and observed scores",
    "ModelConfig.classes": "class names; null: `0..K-1` (or the bundle's)",
    "BundleConfig.path": "the invariant bundle directory written by `icos-agent fit` (required unless `model.uri` "
    "brings one)",
    "ServerConfig.host": "listen address",
    "ServerConfig.port": "port of the V2 API, `/v1/*` and `/metrics`",
    "ServerConfig.metrics_port": "optional second port serving only `/metrics` (must differ from `port`)",
    "ServerConfig.max_body_bytes": "larger request bodies are rejected with 413",
    "ServerConfig.max_batch": "larger batches are rejected with 413",
    "ServerConfig.max_tensor_elements": "larger request tensors are rejected with 413",
    "ServerConfig.threads": "thread pool for decoding, inference and judging",
    "ServerConfig.blas_threads": "threads of numpy's BLAS in the serve process (its products on the request path"
    " are small; more threads mostly spin and take CPU from inference)",
    "ServerConfig.graceful_timeout_seconds": "on SIGTERM: time allowed for requests in flight and pending work",
    "ServerConfig.access_log": "one JSON log line per request",
    "ServerConfig.max_metadata_value_bytes": "a longer value of a per-sample metadata input (IDI) is rejected with"
    " 413 (`metadata_too_large`)",
    "ServerConfig.limit_concurrency": "open HTTP connections beyond which a new connection is answered 503 with"
    " `Retry-After` and closed at once (uvicorn also answers 503 to requests while as many are in progress);"
    " keep it below the process's file descriptor limit",
    "ServerConfig.timeout_keep_alive_seconds": "an idle keep-alive connection is closed after this time",
    "ServerConfig.header_timeout_seconds": "a connection that has not sent a complete request head this long after"
    " it opened (or after its request's first byte) is closed",
    "ServerConfig.max_head_bytes": "a larger request head (request line and headers) is answered 431 and its"
    " connection closed",
    "UpstreamConfig.url": "proxy mode: base URL of the upstream V2 server",
    "UpstreamConfig.model_name": "the model's name on the upstream (default: `model.name`)",
    "UpstreamConfig.timeout_seconds": "one deadline for the whole upstream call (waiting for a pooled connection, "
    "connecting, sending, reading the whole answer); a slower call answers 504",
    "UpstreamConfig.scores_output": "the upstream output (or observed tensor) holding the class scores",
    "WindowsConfig.time": "time windows of the live estimates (durations such as `30s`, `5m`, `1h`, `1d`)",
    "WindowsConfig.count": "the count window: the last N predictions (null: none); for models with at most "
    "metrics.per_class_label_cap classes it keeps their probability vectors too (4 bytes per class each)",
    "MetricsConfig.per_class_label_cap": "per-class metric labels only for models with at most this many classes",
    "ObserveConfig.queue_size": "observe batches waiting to be judged; when full the agent answers 429",
    "ObserveConfig.event_ttl_seconds": "how long a CloudEvent waits for its request/response pair",
    "ObserveConfig.event_buffer": "unpaired CloudEvents kept at most",
    "ObserveConfig.workers": "tasks judging observed batches",
    "StateConfig.flush_interval_seconds": "how often the estimate windows are saved to the state directory",
    "SecurityConfig.allowed_roots": "when not empty, every model, bundle and audit data path (in the file and in "
    "reload requests) must lie under one of these directories, symlinks resolved",
    "LabelsConfig.enabled": "accept delayed labels (`POST /v1/labels`) and keep predictions for them",
    "LabelsConfig.max_predictions": "predictions kept for delayed labels (oldest evicted first)",
    "LabelsConfig.max_age": "predictions older than this are evicted from the store",
    "LabelsConfig.flush_interval_seconds": "how often the background writer stores judged predictions",
    "LabelsConfig.queue_limit": "judged predictions waiting for the writer at most (more are dropped and counted)",
    "LabelsConfig.max_batch": "labels per `POST /v1/labels` request at most",
    "LabelsConfig.min_recalibration_samples": "labeled predictions `POST /v1/recalibrate` needs at least",
    "LabelsConfig.auto_recalibrate_every": "recalibrate automatically after this many new labels (null: never)",
    "CommonParams.batch_size": "inputs per model call during the audit",
    "DScoreParams.n": "the grid is `n × n` regions (D-Score §IV)",
    "DScoreParams.t": "translation hyper-parameter `t` (D-Score eq. 2)",
    "MutationParams.k": "cells mutated per repetition, split equally between the operators; "
    "null = `cell_share` of the cells",
    "MutationParams.cell_share": "share of the data's cells mutated per repetition when `k` is null (0 < share ≤ 1)",
    "MutationParams.repetitions": "repetitions per operator (mean and std are reported)",
    "MutationParams.operators": "mutation operators among DEC, IMP, SGN, DIG",
    "MutationParams.seed": "seed of the mutations",
    "MetamorphicParams.transformations": "transformations (names or `{name: ..., param: ...}`); null: "
    "shift, brightness, contrast, gaussian_noise, blur for images; scale, noise for tables",
    "MetamorphicParams.order": "1: each transformation alone; higher: compositions of that many",
    "MetamorphicParams.seed": "seed of the random transformation parameters",
    "MetamorphicParams.allow_flips": "allow `hflip`/`vflip` (only when a flip keeps the label)",
    "MetamorphicParams.max_compositions": "at most this many higher-order compositions (seeded choice)",
    "_Schedule.cron": "run on this cron schedule (5 fields, UTC); exactly one of `cron` and `interval`",
    "_Schedule.interval": "run every this long (`30m`, `6h`); exactly one of `cron` and `interval`",
    "_Schedule.time_budget": "past this the run stops at its next step with status `timeout`",
    "_Schedule.data": "this audit's data (default: `audits.reference`, else the live reservoir)",
    "_Schedule.mlflow": "log this audit's runs to MLflow",
    "AuditData.source": "`reference`: a data file; `live`: the reservoir of recent live inputs (label-free)",
    "AuditData.path": "the data file (`.npz` x/y, CSV, Parquet) when `source` is `reference`",
    "AuditData.label_column": "label column of a CSV/Parquet file",
    "AuditData.min_samples": "`live`: the run is skipped until the reservoir holds this many inputs",
    "AuditMlflowConfig.enabled": "log audit runs to MLflow",
    "AuditMlflowConfig.tracking_uri": "null: `sqlite:///<state_dir>/mlflow.db` when a state directory is set, "
    "else no logging",
    "AuditMlflowConfig.experiment": "MLflow experiment of the audit runs",
}

SECTION_TEXT: dict[str, str] = {
    "audits.dscore": "D-Score audit (`docs/audits.md`). Present = scheduled.",
    "audits.mutation": "Data-mutation audit (`docs/audits.md`). Present = scheduled.",
    "audits.metamorphic": "Metamorphic audit (`docs/audits.md`). Present = scheduled.",
}

INTRO = f"""\
# Configuration reference

<!-- Generated by `python docs/gen_config.py` from agent.config.settings.AgentSettings; do not edit by hand. -->

`icos-agent serve --config agent.yaml` reads a YAML file; every setting has the default below.
`deploy/examples/agent.yaml` is an annotated example (its bundle path, `icos-state/bundle`, is where
`make demo` leaves the bundle it fits). Check a file without starting the server:

```bash
icos-agent serve --config deploy/examples/agent.yaml --check
```

* **Environment overrides.** Any setting can be set from the environment as
  `{ENV_PREFIX}<SECTION>__<FIELD>` (two underscores between levels), e.g.
  `{ENV_PREFIX}SERVER__PORT=9000`, `{ENV_PREFIX}MODE=proxy`,
  `{ENV_PREFIX}WINDOWS__TIME='["5m","1h","1d"]'`. The environment wins over the file.
* **Paths** in the file are relative to the file's directory.
* **Secrets** never go in the file: the admin bearer token (`POST /v1/reload`,
  `POST /v1/audits/{{kind}}`, `POST /v1/recalibrate`) is read from `{ENV_PREFIX}ADMIN_TOKEN` only;
  without it the admin endpoints answer 404.
* **Durations** are written `500ms`, `30s`, `5m`, `1h`, `1d`.
* Unknown fields and invalid values stop the agent at start with one line per problem naming the
  field, e.g. `agent.yaml: server.port: Input should be less than or equal to 65535`.
"""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(parts) + (" \\| null" if type(None) in args else "")
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if annotation is typing.Any:
        return "any"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return "section"
        if issubclass(annotation, enum.Enum):
            return " \\| ".join(f"`{m.value}`" for m in annotation)
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "Path": "path"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return ""
    else:
        value = field.default
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        return "`[" + ", ".join(str(v) for v in value) + "]`"
    if isinstance(value, Path):
        return f"`{value}`"
    return f"`{value}`"


def _bounds(field: FieldInfo) -> str:
    out = []
    for m in field.metadata:
        for attr, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "length ≥")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} {v}")
        pattern = getattr(m, "pattern", None)
        if pattern:
            out.append(f"matches `{pattern}`")
    return ", ".join(out)


def _meaning(owner: type[BaseModel], name: str, field: FieldInfo) -> str:
    if field.description:
        return field.description
    for cls in owner.__mro__:
        key = f"{cls.__name__}.{name}"
        if key in MEANINGS:
            return MEANINGS[key]
    raise SystemExit(f"{owner.__name__}.{name} has no description: add one to the model or to MEANINGS in {__file__}")


def _env(path: list[str]) -> str:
    return ENV_PREFIX + "__".join(p.upper() for p in path)


def _table(owner: type[BaseModel], path: list[str], lines: list[str], nested: list[tuple[list[str], Any]]) -> None:
    lines.append("| setting | type | default | meaning |")
    lines.append("|---|---|---|---|")
    for name, field in owner.model_fields.items():
        models = _models_in(field.annotation)
        full = [*path, name]
        dotted = ".".join(full)
        if models:
            nested.append((full, models[0]))
            anchor = dotted.replace(".", "")
            lines.append(f"| `{dotted}` | section | | see [{dotted}](#{anchor}) |")
            continue
        meaning = _meaning(owner, name, field)
        bounds = _bounds(field)
        if bounds:
            meaning += f" ({bounds})"
        meaning = meaning.replace("|", "\\|")
        lines.append(f"| `{dotted}` | {_type_name(field.annotation)} | {_default(field)} | {meaning} |")
    lines.append("")


def render() -> str:
    lines = [INTRO, "## Top level", ""]
    nested: list[tuple[list[str], Any]] = []
    _table(AgentSettings, [], lines, nested)
    lines.append(f"Environment: e.g. `{_env(['mode'])}=observe`, `{_env(['log_level'])}=debug`.")
    lines.append("")
    seen: dict[type[BaseModel], str] = {}
    while nested:
        path, model = nested.pop(0)
        dotted = ".".join(path)
        lines.append(f"## `{dotted}`")
        lines.append("")
        if dotted in SECTION_TEXT:
            lines.append(SECTION_TEXT[dotted])
            lines.append("")
        elif model.__doc__ and model.__module__.startswith("agent"):
            doc = " ".join(model.__doc__.split())
            lines.append(doc.replace("``", "`"))
            lines.append("")
        if model in seen:
            lines.append(f"Same fields as [`{seen[model]}`](#{seen[model].replace('.', '')}).")
            lines.append("")
            continue
        seen[model] = dotted
        sub: list[tuple[list[str], Any]] = []
        _table(model, path, lines, sub)
        first = next(iter(model.model_fields))
        lines.append(f"Environment: e.g. `{_env([*path, first])}`.")
        lines.append("")
        nested[0:0] = sub
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    return generated_page.main(OUT, render, (__doc__ or "").splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main())
