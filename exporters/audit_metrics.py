"""Prometheus metrics of the robustness audits, on a :class:`CollectorRegistry` passed in.

Names (labels are bounded: audit kinds, statuses, the configured relations and the four operators):

* ``icos_audit_runs_total{audit,status}`` — finished runs; ``status`` is ``success``, ``failure``,
  ``timeout`` or ``skipped`` (no data yet).
* ``icos_audit_last_success_timestamp_seconds{audit}`` — end of the last successful run (epoch s).
* ``icos_audit_duration_seconds{audit}`` — duration of the last run, whatever its status.
* ``icos_dscore``, ``icos_dscore_robustness``, ``icos_dscore_fitness`` — D-Score eqs. 6, 4, 3 of
  the last successful run; ``icos_dscore_base_accuracy_ratio`` — its â (agreement with the model's
  own labels when the run was label-free); ``icos_dscore_baseline`` — the D-Score the alerts compare
  with (configured, else the first successful run's for the current model and audit settings).
* ``icos_mutation_relative_change_ratio{audit="mutation",metric,operator}`` — mean relative change
  of the model's error after mutation (0.25 = +25 %), ``metric`` ``mae``/``mse``/``rmse``/
  ``accuracy``, ``operator`` ``dec``/``imp``/``sgn``/``dig``/``all``; ``..._stddev_ratio`` its
  standard deviation over repetitions.
* ``icos_metamorphic_violation_ratio{relation}`` — share of inputs whose label changed under the
  relation (``relation="all"``: pooled over every relation).

A gauge of an audit that never succeeded is absent, not NaN or 0 (a 0 would read as "fully
degraded", a NaN breaks comparisons); a non-finite value leaves its series absent too, so no NaN or
infinity reaches ``/metrics``. This module knows nothing of the agent: the audit kinds and their
gauges (:class:`GaugeSpec`) are given at construction, values are plain numbers, baselines a function.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

STATUSES: tuple[str, ...] = ("success", "failure", "timeout", "skipped")

#: Values of one gauge: ``{label values: value}`` (``()`` for a gauge without labels).
GaugeValues = Mapping[tuple[str, ...], float]


@dataclass(frozen=True)
class GaugeSpec:
    """A gauge an audit kind exports (absent until its first successful run).

    ``replace``: label sets absent from an update are removed (e.g. relations no longer configured).
    ``baseline``: the gauge (without labels) has a baseline, exported as ``<name>_baseline``.
    """

    name: str
    help: str
    labels: tuple[str, ...] = ()
    replace: bool = False
    baseline: bool = False


class _KindGauges(Collector):
    """The audit kinds' gauges, exported at scrape time: only the label sets set with a finite value,
    and the baselines ``baselines()`` gives (``{gauge name: value}``)."""

    def __init__(self, specs: Iterable[GaugeSpec], baselines: Callable[[], Mapping[str, float]]) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.baselines = baselines
        self.values: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in self.specs}
        self.lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            values = {name: dict(v) for name, v in self.values.items()}
        baselines = self.baselines()
        for name, spec in self.specs.items():
            fam = GaugeMetricFamily(name, spec.help, labels=list(spec.labels))
            for labels, value in values[name].items():
                fam.add_metric(list(labels), value)
            yield fam
            if spec.baseline:
                base = GaugeMetricFamily(
                    f"{name}_baseline", f"Baseline of {name}: configured, else its first successful value.", labels=[]
                )
                known = baselines.get(name)
                if known is not None and math.isfinite(known):
                    base.add_metric([], known)
                yield base


class AuditMetrics:
    """Gauges and counters of the audits; methods are thread-safe.

    ``audits`` are the kind names (their run counters exist from the start); ``gauges`` the kinds'
    own gauges, in exposition order; ``baselines()`` the current baselines of the gauges that have
    one (``{gauge name: value}``, read at scrape time).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        audits: Iterable[str],
        gauges: Iterable[GaugeSpec],
        baselines: Callable[[], Mapping[str, float]] = dict,
    ) -> None:
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
        self._gauges = _KindGauges(gauges, baselines)
        registry.register(self._gauges)
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
        """Set the gauge ``name`` for each label set in ``values``; a non-finite value removes its label
        set (absent rather than NaN)."""
        spec = self._gauges.specs[name]
        with self._gauges.lock:
            current = self._gauges.values[name]
            if spec.replace:
                current.clear()
            for labels, value in values.items():
                v = float(value)
                if math.isfinite(v):
                    current[tuple(labels)] = v
                else:
                    current.pop(tuple(labels), None)

    def value(self, name: str, labels: tuple[str, ...] = ()) -> float | None:
        """The current value of the gauge ``name`` (``None`` while absent)."""
        with self._gauges.lock:
            return self._gauges.values[name].get(labels)
