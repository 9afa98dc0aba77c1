"""What every MLflow run of the agent shares, whoever logs it (an audit, a fit, the demo): a
:class:`~exporters.run_record.RunRecord` built from any mapping of parameters and metrics, and the
logger that delivers it, spooling in the state directory.

* :func:`run_record` makes a run's params and metrics fit MLflow (:func:`run_params`, :func:`run_metrics`)
  and cuts its name to MLflow's limit;
* :func:`open_logger` builds the :class:`~exporters.mlflow_logger.MlflowLogger` (spool in the state
  directory, ``sqlite:///<state_dir>/mlflow.db`` without a tracking URI);
* :func:`default_state_dir` is where the CLI keeps that spool.

mlflow itself is imported only by :mod:`exporters.mlflow_logger`, when a run is delivered.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from exporters.mlflow_logger import MlflowLogger
from exporters.run_record import MAX_PARAM_VALUE_LENGTH, MAX_RUN_NAME_LENGTH, ParamValue, RunRecord

__all__ = ["default_state_dir", "open_logger", "run_metrics", "run_params", "run_record"]


def _plain(value: Any) -> Any:
    """``value`` as plain JSON values: numpy scalars and arrays unwrapped, tuples as lists, mapping keys as
    strings, NaN and ±inf as ``None`` (exporters know no agent, so this is not the audits' ``jsonable``)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        f = float(value)
        return f if math.isfinite(f) else None
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"value of type {type(value).__name__} is not JSON-able")


def _cut(text: str) -> str:
    return text if len(text) <= MAX_PARAM_VALUE_LENGTH else text[: MAX_PARAM_VALUE_LENGTH - 3] + "..."


def _param_value(value: Any) -> ParamValue:
    if isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return _cut(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return _cut(json.dumps(_plain(value), separators=(",", ":"), sort_keys=True))


def run_params(params: Mapping[str, Any]) -> dict[str, ParamValue]:
    """``params`` as MLflow takes them: plain values, long ones cut, structures as JSON, None left out."""
    return {str(k): _param_value(v) for k, v in params.items() if v is not None}


def run_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of ``metrics`` (flags and anything else left out)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
            continue
        f = float(v)
        if math.isfinite(f):
            out[str(k)] = f
    return out


def run_record(
    kind: str,
    name: str,
    *,
    params: Mapping[str, Any],
    metrics: Mapping[str, Any],
    artifacts: Mapping[str, bytes],
    started_at: float,
    finished_at: float,
    model_name: str,
    model_version: str = "",
    model_sha256: str = "",
    tags: Mapping[str, str] | None = None,
) -> RunRecord:
    """One MLflow run from any ``params`` and ``metrics`` (made to fit by :func:`run_params` and
    :func:`run_metrics`), ``name`` cut to MLflow's limit; the logger adds the model tags
    (``icos.model.name``/``.version``/``.sha256``) to ``tags``."""
    return RunRecord(
        kind=kind,
        name=name[:MAX_RUN_NAME_LENGTH],
        params=run_params(params),
        metrics=run_metrics(metrics),
        tags=dict(tags or {}),
        artifacts=dict(artifacts),
        started_at=started_at,
        finished_at=finished_at,
        model_name=model_name,
        model_version=model_version,
        model_sha256=model_sha256,
    )


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/icos-agent`` (``~/.local/state/icos-agent``): where the CLI spools runs."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "icos-agent"


def open_logger(tracking_uri: str | None, experiment: str, state_dir: Path) -> MlflowLogger:
    """An MLflow logger spooling into ``<state_dir>/mlflow-spool``; ``tracking_uri`` ``None`` →
    ``sqlite:///<state_dir>/mlflow.db``."""
    state_dir = Path(state_dir)
    return MlflowLogger(tracking_uri, experiment, state_dir / "mlflow-spool", state_dir=state_dir)
