"""A fit as one MLflow run: its parameters, the model's and the oracle's figures, the bundle's small files and
the fit's summary, built and logged by :mod:`exporters.mlflow_runs` as an audit's run is (MLflow itself stays
behind :mod:`exporters.mlflow_logger`; the run is spooled in the state directory while MLflow cannot take it)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.audits.report import jsonable
from agent.errors import UserError
from exporters.mlflow_runs import default_state_dir, open_logger, run_record
from exporters.redaction import redact_uri
from exporters.run_record import RunRecord
from invariants.fit_params import FitParams


def fit_record(
    summary: Mapping[str, Any],
    params: Mapping[str, Any],
    bundle_dir: str | Path,
    *,
    model_name: str,
    model_sha256: str,
    model_version: str = "",
    started_at: float,
    finished_at: float,
) -> RunRecord:
    """The MLflow run of ``icos-agent fit``: fit parameters, model and oracle metrics, the bundle's
    small files (manifest, IDI rules, TDI rules with their readable text) and the JSON summary."""

    metrics: dict[str, Any] = {k: v for k, v in summary.items() if not isinstance(v, Mapping)}
    for k, v in dict(summary.get("calibration") or {}).items():
        metrics[f"calibration_{k}"] = v
    artifacts = {"fit_summary.json": json.dumps(jsonable(dict(summary)), indent=2).encode()}
    root = Path(bundle_dir)
    for f in sorted(root.rglob("*")):
        if f.is_file() and f.suffix in (".json", ".yaml", ".yml", ".txt"):
            artifacts[f"bundle/{f.relative_to(root).as_posix()}"] = f.read_bytes()
    return run_record(
        "fit",
        f"fit {model_name}",
        params=params,
        metrics=metrics,
        artifacts=artifacts,
        started_at=started_at,
        finished_at=finished_at,
        model_name=model_name,
        model_version=model_version,
        model_sha256=model_sha256,
    )


@dataclass(frozen=True)
class FitRun:
    """Where a fit's run went: its id (None: spooled in ``spool_dir`` until MLflow takes it)."""

    run_id: str | None
    tracking_uri: str
    spool_dir: Path

    def to_dict(self) -> dict[str, Any]:
        """The ``mlflow`` entry of ``fit --json`` (the tracking URI without credentials)."""
        return {"run_id": self.run_id, "tracking_uri": redact_uri(self.tracking_uri), "spooled": self.run_id is None}


def log_fit(
    summary: Mapping[str, Any],
    fit_params: FitParams,
    *,
    source: str,
    files: Mapping[str, str | None],
    bundle_dir: str | Path,
    model_name: str,
    model_sha256: str,
    tracking_uri: str | None,
    experiment: str,
    state_dir: str | Path | None,
    started: float,
) -> FitRun:
    """Log a fit as one MLflow run (:func:`fit_record`): its input ``files`` by role (``model``, ``train``,
    ...) and the fit parameters that apply to its ``source``, each under its flag's name (``trees``);
    ``started`` is the fit's :func:`time.perf_counter` at its start."""
    params: dict[str, Any] = {k: v for k, v in files.items() if v is not None}
    params.update(fit_params.named(source))
    params = {k: v for k, v in params.items() if v is not None}
    try:
        logger = open_logger(tracking_uri, experiment, Path(state_dir) if state_dir else default_state_dir())
    except ValueError as exc:
        raise UserError(f"--mlflow: {exc}") from None
    record = fit_record(
        summary,
        params,
        bundle_dir,
        model_name=model_name,
        model_sha256=model_sha256,
        started_at=time.time() - (time.perf_counter() - started),
        finished_at=time.time(),
    )
    return FitRun(logger.log(record), logger.tracking_uri, logger.spool_dir)
