"""The result every robustness audit returns: parameters, scalar metrics, JSON details, artifacts.

One shape for D-Score, data mutation and metamorphic audits, so that the scheduler, the HTTP API,
the Prometheus collectors and the MLflow logger handle all of them alike.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.errors import UserError

#: Progress callback of the long audits: ``progress(done, total)`` in the audit's own units
#: (forward passes for D-Score, model evaluations for mutation and metamorphic audits).
ProgressFn = Callable[[int, int], None]


class AuditError(UserError, ValueError):
    """An audit cannot run on this model, data or configuration; the message says why."""


def jsonable(value: Any) -> Any:
    """Turn numpy scalars/arrays, tuples and non-finite floats into plain JSON values.

    NaN and ±inf become ``None`` (JSON has no such numbers); mapping keys become strings.
    """
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [jsonable(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"value of type {type(value).__name__} is not JSON-able")


@dataclass
class AuditResult:
    """Outcome of one audit run.

    ``metrics`` are scalars (exported as gauges and MLflow metrics); ``details`` is any JSON-able
    structure (per-region accuracies, per-relation statistics, mutation logs); ``artifacts`` are
    named files (PNG heatmaps) that go to MLflow, never into JSON.
    """

    kind: str
    params: dict[str, Any]
    metrics: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, bytes] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; artifacts are listed by name with size and sha256, not embedded."""
        return {
            "kind": self.kind,
            "params": jsonable(self.params),
            "metrics": jsonable(self.metrics),
            "details": jsonable(self.details),
            "artifacts": {
                name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                for name, data in sorted(self.artifacts.items())
            },
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """The :meth:`to_dict` view as strict JSON (no NaN literals)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False, sort_keys=False)
