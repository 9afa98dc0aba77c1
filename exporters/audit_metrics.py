"""Prometheus metrics of the robustness audits, on a :class:`CollectorRegistry` passed in.

Names (labels are bounded: audit kinds, statuses, the configured relations and the four operators):

* ``icos_audit_runs_total{audit,status}`` — finished runs; ``status`` is ``success``, ``failure``,
  ``timeout`` or ``skipped`` (no data yet).
* ``icos_audit_last_success_timestamp_seconds{audit}`` — end of the last successful run (epoch s).
* ``icos_audit_duration_seconds{audit}`` — duration of the last run, whatever its status.
* ``icos_dscore``, ``icos_dscore_robustness``, ``icos_dscore_fitness`` — D-Score eqs. 6, 4, 3 of
  the last successful run; ``icos_dscore_base_accuracy_ratio`` — its â (agreement with the model's
  own labels when the run was label-free). NaN until the first successful D-Score audit.
* ``icos_mutation_relative_change_ratio{audit="mutation",metric,operator}`` — mean relative change
  of the model's error after mutation (0.25 = +25 %), ``metric`` ``mae``/``mse``/``rmse``/
  ``accuracy``, ``operator`` ``dec``/``imp``/``sgn``/``dig``/``all``; ``..._stddev_ratio`` its
  standard deviation over repetitions.
* ``icos_metamorphic_violation_ratio{relation}`` — share of inputs whose label changed under the
  relation (``relation="all"``: pooled over every relation).

This module knows nothing of the agent: the audit kinds and their gauges (:class:`GaugeSpec`) are
given at construction, values are plain numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

STATUSES: tuple[str, ...] = ("success", "failure", "timeout", "skipped")

#: Values of one gauge: ``{label values: value}`` (``()`` for a gauge without labels).
GaugeValues = Mapping[tuple[str, ...], float]


@dataclass(frozen=True)
class GaugeSpec:
    """A gauge an audit kind exports.

    ``nan_until_set``: the gauge reads NaN, not 0, until the first successful run (a 0 would read
    as "fully degraded"). ``replace``: label sets absent from an update are removed (e.g. relations
    no longer configured).
    """

    name: str
    help: str
    labels: tuple[str, ...] = ()
    nan_until_set: bool = False
    replace: bool = False


def _finite(value: float) -> float:
    v = float(value)
    return v if math.isfinite(v) else math.nan


class AuditMetrics:
    """Gauges and counters of the audits; methods are thread-safe (prometheus_client).

    ``audits`` are the kind names (their run counters exist from the start); ``gauges`` the kinds'
    own gauges, in exposition order.
    """

    def __init__(self, registry: CollectorRegistry, audits: Iterable[str], gauges: Iterable[GaugeSpec]) -> None:
        self.runs = Counter("icos_audit_runs", "Finished audit runs by status.", ["audit", "status"], registry=registry)
        self.last_success = Gauge(
            "icos_audit_last_success_timestamp_seconds",
            "End time of the last successful audit run (seconds since the epoch).",
            ["audit"],
            registry=registry,
        )
        self.duration = Gauge(
            "icos_audit_duration_seconds", "Duration of the last audit run.", ["audit"], registry=registry
        )
        self._specs: dict[str, GaugeSpec] = {}
        self.gauges: dict[str, Gauge] = {}
        self._label_sets: dict[str, set[tuple[str, ...]]] = {}
        for spec in gauges:
            gauge = Gauge(spec.name, spec.help, list(spec.labels), registry=registry)
            if spec.nan_until_set and not spec.labels:
                gauge.set(math.nan)
            self._specs[spec.name] = spec
            self.gauges[spec.name] = gauge
            self._label_sets[spec.name] = set()
        for audit in audits:
            for status in STATUSES:
                self.runs.labels(audit, status)

    def record_run(self, audit: str, status: str, seconds: float, finished_at: float) -> None:
        """Count a finished run; a success also sets the last-success timestamp."""
        self.runs.labels(audit, status).inc()
        self.duration.labels(audit).set(max(0.0, float(seconds)))
        if status == "success":
            self.last_success.labels(audit).set(float(finished_at))

    def set_gauge(self, name: str, values: GaugeValues) -> None:
        """Set the gauge ``name`` for each label set in ``values`` (non-finite values read NaN)."""
        spec, gauge = self._specs[name], self.gauges[name]
        if not spec.labels:
            for value in values.values():
                gauge.set(_finite(value))
            return
        if spec.replace:
            for gone in self._label_sets[name] - set(values):
                gauge.remove(*gone)
            self._label_sets[name] = set(values)
        for labels, value in values.items():
            gauge.labels(*labels).set(_finite(value))
