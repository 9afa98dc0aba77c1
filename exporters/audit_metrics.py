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

This module knows nothing of the agent: it takes plain numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

AUDITS: tuple[str, ...] = ("dscore", "mutation", "metamorphic")
STATUSES: tuple[str, ...] = ("success", "failure", "timeout", "skipped")
MUTATION_METRICS: tuple[str, ...] = ("mae", "mse", "rmse", "accuracy")


def _finite(value: float) -> float:
    v = float(value)
    return v if math.isfinite(v) else math.nan


class AuditMetrics:
    """Gauges and counters of the audits; ``record_*`` methods are thread-safe (prometheus_client)."""

    def __init__(self, registry: CollectorRegistry, audits: Iterable[str] = AUDITS) -> None:
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
        self.dscore = Gauge("icos_dscore", "D-Score (eq. 6) of the last successful audit.", registry=registry)
        self.dscore_robustness = Gauge(
            "icos_dscore_robustness", "D-Score v_robust (eq. 4, lower is better).", registry=registry
        )
        self.dscore_fitness = Gauge("icos_dscore_fitness", "D-Score v_fitness (eq. 3).", registry=registry)
        self.dscore_base_accuracy = Gauge(
            "icos_dscore_base_accuracy_ratio",
            "Accuracy of the unmodified model in the last D-Score audit.",
            registry=registry,
        )
        self.mutation_change = Gauge(
            "icos_mutation_relative_change_ratio",
            "Mean relative change of the model's error after data mutation (0.25 = +25%).",
            ["audit", "metric", "operator"],
            registry=registry,
        )
        self.mutation_change_std = Gauge(
            "icos_mutation_relative_change_stddev_ratio",
            "Standard deviation over repetitions of the relative change after data mutation.",
            ["audit", "metric", "operator"],
            registry=registry,
        )
        # NaN, not 0, until the first successful D-Score audit: a 0 would read as "fully degraded"
        for gauge in (self.dscore, self.dscore_robustness, self.dscore_fitness, self.dscore_base_accuracy):
            gauge.set(math.nan)
        self.metamorphic_violation = Gauge(
            "icos_metamorphic_violation_ratio",
            "Share of inputs whose predicted label changes under a metamorphic relation.",
            ["relation"],
            registry=registry,
        )
        self._relations: set[str] = set()
        for audit in audits:
            for status in STATUSES:
                self.runs.labels(audit, status)

    def record_run(self, audit: str, status: str, seconds: float, finished_at: float) -> None:
        """Count a finished run; a success also sets the last-success timestamp."""
        self.runs.labels(audit, status).inc()
        self.duration.labels(audit).set(max(0.0, float(seconds)))
        if status == "success":
            self.last_success.labels(audit).set(float(finished_at))

    def set_dscore(self, dscore: float, robustness: float, fitness: float, base_accuracy: float) -> None:
        self.dscore.set(_finite(dscore))
        self.dscore_robustness.set(_finite(robustness))
        self.dscore_fitness.set(_finite(fitness))
        self.dscore_base_accuracy.set(_finite(base_accuracy))

    def set_mutation(self, changes: Mapping[tuple[str, str], tuple[float, float]], audit: str = "mutation") -> None:
        """``{(metric, operator): (mean_ratio, std_ratio)}``; ratios, not percent."""
        for (metric, operator), (mean, std) in changes.items():
            self.mutation_change.labels(audit, metric, operator.lower()).set(_finite(mean))
            self.mutation_change_std.labels(audit, metric, operator.lower()).set(_finite(std))

    def set_metamorphic(self, violations: Mapping[str, float]) -> None:
        """``{relation: violation ratio}``; relations absent from this run are removed."""
        for gone in self._relations - set(violations):
            self.metamorphic_violation.remove(gone)
        for relation, ratio in violations.items():
            self.metamorphic_violation.labels(relation).set(_finite(ratio))
        self._relations = set(violations)
