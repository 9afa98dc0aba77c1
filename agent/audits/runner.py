"""Run an audit of a given kind on a model and data: the one code path of the CLI and the scheduler.

* :func:`load_audit_data` reads a data file and shapes it for the model (images ``[N, C, H, W]``; a
  model of several inputs reads one array or table column per input, named like it; labels as class
  indices).
* :func:`run_audit` runs an audit kind of the registry (:mod:`agent.audits.registry`) and returns the
  :class:`~agent.audits.report.AuditResult`, after checking that the kind applies to the model (a
  one-line :class:`AuditError` naming the kinds that do, otherwise); a deadline turns into
  :class:`AuditTimeout` at the next step boundary (a D-Score batch, a mutation repetition, a
  metamorphic relation).
* :func:`audit_record` builds the MLflow :class:`~exporters.run_record.RunRecord` of an audit: params,
  metrics, the JSON report and PNG artifacts, model tags (through :func:`exporters.mlflow_runs.run_record`,
  as a fit's record in :mod:`agent.offline.fit_record`; the logger is :func:`exporters.mlflow_runs.open_logger`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.audits.config import AUDIT_KINDS
from agent.audits.modalities import input_kinds
from agent.audits.params import CommonParams
from agent.audits.registry import audits_that_apply
from agent.audits.report import AuditError, AuditResult, ProgressFn, jsonable
from agent.data.files import label_indices, load_data
from agent.data.images import ImageSource
from agent.data.limits import DataLimits
from agent.model.inputs import Inputs, InvalidInput
from exporters.mlflow_runs import run_record
from exporters.run_record import RunRecord

if TYPE_CHECKING:
    from agent.model.classifier import OnnxClassifier

__all__ = [
    "AuditOutcome",
    "AuditTimeout",
    "as_inputs",
    "audit_record",
    "load_audit_data",
    "prepare_inputs",
    "run_audit",
]

#: Seed of the subset drawn when the data holds more than ``max_samples`` inputs.
SUBSET_SEED = 20240501


class AuditTimeout(AuditError):
    """The audit did not finish within its time budget."""


@dataclass
class AuditOutcome:
    """One finished audit run as the agent keeps it: status, timing, result or error."""

    kind: str
    status: str  # success | failure | timeout | skipped
    started_at: float
    finished_at: float
    trigger: str  # schedule | manual | cli
    data_source: str
    n_samples: int = 0
    result: AuditResult | None = None
    error: str | None = None
    mlflow_run_id: str | None = None
    mlflow_spooled: bool = False
    id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    def to_dict(self, *, with_details: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "status": self.status,
            "trigger": self.trigger,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "seconds": round(self.seconds, 4),
            "data_source": self.data_source,
            "n_samples": self.n_samples,
            "error": self.error,
            "mlflow": {"run_id": self.mlflow_run_id, "spooled": self.mlflow_spooled},
            **self.extra,
        }
        if self.result is not None:
            res = self.result.to_dict()
            if not with_details:
                res.pop("details", None)
            out["result"] = res
        return jsonable(out)  # type: ignore[no-any-return]


# -- data ---------------------------------------------------------------------------------------------
#: What an audit reads: a single-input model's array, or the inputs of a model of several.
AuditInputs = np.ndarray | Inputs


def _one_numeric_input(model: OnnxClassifier) -> bool:
    """Whether the model takes one numeric input of a fixed shape (its audits read one array)."""
    try:
        model.input_shape  # noqa: B018 - a ModelLoadError (a ValueError) for several or dynamic inputs
    except ValueError:
        return False
    return np.dtype(model.input.dtype).kind in "fiu"


def prepare_inputs(model: OnnxClassifier, x: AuditInputs | Mapping[str, np.ndarray]) -> AuditInputs:
    """Inputs shaped for ``model``: a single numeric input's array ``[N, *input_shape]`` in its dtype,
    else the model's :class:`Inputs` (validated like a request; text as strings)."""
    if _one_numeric_input(model):
        if isinstance(x, Mapping):
            name = model.input.name
            if name not in x:
                raise AuditError(f"the data has no input {name!r} (it holds {', '.join(x)})")
            x = x[name]
        return _array_for(model, np.asarray(x))
    try:
        batch = model.prepare_file(x)
    except InvalidInput as exc:
        raise AuditError(f"the data does not fit the model: {exc}") from None
    if batch.n == 0:
        raise AuditError("no inputs to audit")
    return batch


def as_inputs(model: OnnxClassifier, x: AuditInputs) -> Inputs:
    """A single-input model's array as :class:`Inputs` (named like its input); inputs as they are."""
    return x if isinstance(x, Inputs) else Inputs({model.signature.names[0]: x})


def _array_for(model: OnnxClassifier, arr: np.ndarray) -> np.ndarray:
    if arr.ndim == 0 or len(arr) == 0:
        raise AuditError("no inputs to audit")
    per_sample = int(np.prod(arr.shape[1:])) if arr.ndim > 1 else 1
    expected = int(np.prod(model.input_shape))
    if per_sample != expected:
        raise AuditError(
            f"inputs of shape {list(arr.shape)} do not fit the model input {[-1, *model.input_shape]} "
            f"({per_sample} values per sample, expected {expected})"
        )
    return np.ascontiguousarray(arr.reshape((len(arr), *model.input_shape)), dtype=model.input.dtype)


def load_audit_data(
    path: str | Path, model: OnnxClassifier, *, label_column: str | None = None, limits: DataLimits | None = None
) -> tuple[AuditInputs, np.ndarray | None]:
    """Inputs shaped for ``model`` (:func:`prepare_inputs`) and labels as class indices (``None`` when
    the file has none), read within ``limits``: a model of several inputs reads one ``.npz`` array or
    one table column per input, named like it."""
    names = model.signature.names
    data = load_data(path, label_column=label_column, require_metadata=False, limits=limits, inputs=names)
    if isinstance(data.x, ImageSource):  # load_data reads folders only when asked to (``image=``)
        raise AuditError(f"{path}: audits read .npz, .npy, .csv or .parquet files, not image folders")
    x = prepare_inputs(model, data.x)
    y = None if data.y is None else label_indices(data.y, model.classes)
    return x, y


def _subset(x: AuditInputs, y: np.ndarray | None, params: CommonParams) -> tuple[AuditInputs, np.ndarray | None]:
    y = None if params.label_free else y
    n = x.n if isinstance(x, Inputs) else len(x)
    if params.max_samples is None or n <= params.max_samples:
        return x, y
    idx = np.sort(np.random.default_rng(SUBSET_SEED).choice(n, size=params.max_samples, replace=False))
    return x.take(idx) if isinstance(x, Inputs) else x[idx], None if y is None else y[idx]


# -- running ------------------------------------------------------------------------------------------
def _guard(progress: ProgressFn | None, deadline: float | None, kind: str) -> ProgressFn:
    """A progress callback that reports and raises :class:`AuditTimeout` past the deadline
    (``time.monotonic()`` seconds); audits call it between their steps."""

    def check(done: int, total: int) -> None:
        if progress is not None:
            progress(done, total)
        if deadline is not None and time.monotonic() > deadline and done < total:
            raise AuditTimeout(f"{kind} audit exceeded its time budget after {done} of {total} steps")

    return check


def run_audit(
    kind: str,
    model: OnnxClassifier,
    x: AuditInputs | Mapping[str, np.ndarray],
    y: np.ndarray | None,
    params: CommonParams,
    *,
    progress: ProgressFn | None = None,
    deadline: float | None = None,
    heatmaps: bool = True,
) -> AuditResult:
    """Run the ``kind`` audit of ``model`` on inputs ``x`` (labels ``y`` optional).

    ``x``: one array for a single-input model, else the inputs by name (or :class:`Inputs`).
    ``params`` is the kind's parameter model (:mod:`agent.audits.config`); labels are dropped when
    ``params.label_free``; at most ``params.max_samples`` inputs are used (seeded subset).
    ``deadline`` is a ``time.monotonic()`` value: past it the audit stops at the next step and
    raises :class:`AuditTimeout`. Other problems raise :class:`AuditError`, among them a kind that
    does not apply to the model (:func:`check_applies`).
    """
    entry = AUDIT_KINDS.get(kind)
    if entry is None:
        raise AuditError(f"unknown audit {kind!r}; choose {', '.join(AUDIT_KINDS)}")
    x = prepare_inputs(model, x)
    n = x.n if isinstance(x, Inputs) else len(x)
    if y is not None and len(y) != n:
        raise AuditError(f"{n} inputs but {len(y)} labels")
    if entry.applies is not None:
        check_applies(kind, model, as_inputs(model, x))
    x, y = _subset(x, y, params)
    guard = _guard(progress, deadline, kind)
    guard(0, 1)
    return entry.run(model, x, y, params, guard, heatmaps)


def check_applies(kind: str, model: OnnxClassifier, data: Inputs | None = None) -> None:
    """Raise a one-line :class:`AuditError` when the ``kind`` audit cannot audit ``model`` (D-Score on a
    model that is no CNN, data mutation on one without numbers), naming the audits that apply; ``data``:
    inputs that tell text from categories."""
    entry = AUDIT_KINDS[kind]
    if entry.applies is None:
        return
    kinds = input_kinds(model.signature, data, model.view)
    why = entry.applies(model, kinds)
    if why is not None:
        others = [a for a in audits_that_apply(model, kinds) if a.split(" ")[0] != kind]
        raise AuditError(f"{why}; audits that apply: {', '.join(others) or 'none'}")


# -- MLflow records -----------------------------------------------------------------------------------
def audit_record(
    outcome: AuditOutcome,
    *,
    model_name: str,
    model_version: str = "",
    model_sha256: str = "",
    tags: Mapping[str, str] | None = None,
) -> RunRecord:
    """The MLflow run of an audit: params, finite metrics, ``report.json`` and the PNG heatmaps.

    Tags: ``icos.audit.status``, ``icos.audit.trigger``, ``icos.audit.data_source`` plus the
    model tags the logger adds (``icos.model.name``/``.version``/``.sha256``).
    """

    result = outcome.result
    report = json.dumps(outcome.to_dict(), indent=2, allow_nan=False).encode()
    artifacts: dict[str, bytes] = {"report.json": report}
    if result is not None:
        artifacts.update({f"plots/{name}": data for name, data in result.artifacts.items()})
    run_tags = {
        "icos.audit.status": outcome.status,
        "icos.audit.trigger": outcome.trigger,
        "icos.audit.data_source": outcome.data_source[:1000],
        **(tags or {}),
    }
    if outcome.error:
        run_tags["icos.audit.error"] = outcome.error[:4000]
    params = {"n_samples": outcome.n_samples, **(result.params if result is not None else {})}
    metrics = {"seconds": outcome.seconds, **(result.metrics if result is not None else {})}
    return run_record(
        outcome.kind,
        f"{outcome.kind} {model_name}",
        params=params,
        metrics=metrics,
        tags=run_tags,
        artifacts=artifacts,
        started_at=outcome.started_at,
        finished_at=outcome.finished_at,
        model_name=model_name,
        model_version=model_version,
        model_sha256=model_sha256,
    )
