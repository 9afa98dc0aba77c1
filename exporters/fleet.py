"""Prometheus metrics of the fleet evaluator (``mode: fleet``), computed at scrape time.

* ``icos_fleet_estimated_accuracy_ratio{model,version,estimator,window}`` and its 95% bounds
  ``icos_fleet_estimated_accuracy_ratio_lower`` / ``_upper`` — every estimator on the sum of all
  replicas' window statistics (``with_labels`` when the evaluator reads the shared store's labels);
* ``icos_fleet_headline_accuracy_ratio{model,version,estimator,window}`` with ``_lower`` / ``_upper``
  and ``icos_fleet_headline_accuracy_samples`` — the fleet's headline, ``estimator`` naming the one
  chosen (as an agent's ``icos_headline_accuracy_ratio``);
* ``icos_fleet_estimated_accuracy_samples{model,version,window}`` — predictions behind them;
* ``icos_fleet_estimate_flagged{model,version,window,reason}`` — 1 where the fleet's headline may be wrong
  (the flag is raised on the sum of the replicas' statistics, its interval widened), 0 where not; ``reason``
  the main evidence (as an agent's ``icos_estimate_flagged``);
* ``icos_fleet_replicas{model,version,window}`` — replicas that exported in the window;
* ``icos_fleet_estimated_class_metric{model,version,window,class,metric}`` — label-free (CBPE)
  precision, recall and F1 per predicted class of all replicas' predictions (classes ``_macro`` and
  ``_weighted``: their means), from the per-class sums the replicas export up to their class cap;
* ``icos_fleet_segment_estimated_accuracy_ratio``, ``icos_fleet_segment_share_ratio``,
  ``icos_fleet_segment_contribution_ratio{model,version,window,kind,segment}`` and
  ``icos_fleet_segment_reference_accuracy_ratio{model,version,kind,segment}`` — every segment of all
  replicas' windows (as an agent's ``icos_segment_*``), from the per-segment sums they export;
* ``icos_fleet_last_success_timestamp_seconds{model}``, ``icos_fleet_refresh_duration_seconds{model}``,
  ``icos_fleet_stale{model}`` (1 when the estimates are older than the stale limit: Prometheus
  unreachable, failing or answering what the evaluator refuses), ``icos_fleet_restarted_replicas{model}``;
* ``icos_fleet_query_errors_total{model,reason}`` — failed refreshes by reason (a fixed set, every
  one exported from the start); ``icos_fleet_unknown_stats_total{model}`` — series of statistics the
  evaluator's bundle does not define, ignored;
* ``icos_fleet_label_errors_total{model,reason}`` — failed reads of the shared store's labels
  (``unreachable``, ``failed``; exported only when the evaluator reads labels): the label-free
  estimates go on, ``with_labels`` is missing until a read succeeds;
* ``icos_fleet_bundle_mismatch{model,version,reason}`` — 1 for a version left out: ``mixed`` (its
  replicas export statistics of several bundles) or ``other_bundle`` (not the evaluator's bundle).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporters.prometheus import EstimatePoint, SnapshotCollector, class_metric_rows, flag_family, headline_families
from exporters.segment_metrics import SegmentPoint, segment_families


@dataclass(frozen=True)
class FleetVersion:
    version: str
    estimates: Sequence[EstimatePoint]
    samples: Mapping[str, int]
    replicas: Mapping[str, int]
    #: per window, the headline estimate (its ``estimator`` the one chosen)
    headline: Sequence[EstimatePoint] = ()
    #: per window, the label-free per-class figures (``per_class``, ``macro``, ``weighted``)
    classes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: per window, whether the flag "this number may be wrong" is raised and its main reason
    flags: Mapping[str, tuple[bool, str]] = field(default_factory=dict)
    #: every window's segments
    segments: Sequence[SegmentPoint] = ()


@dataclass(frozen=True)
class FleetSnapshot:
    model: str
    versions: Sequence[FleetVersion]
    mismatches: Sequence[tuple[str, str]]
    last_success: float | None
    refresh_seconds: float | None
    #: failed refreshes by reason
    errors: Mapping[str, int]
    stale: bool
    restarted_replicas: int = 0
    unknown_stats_total: int = 0
    #: failed reads of the store's labels by reason (empty: labels are not read)
    label_errors: Mapping[str, int] = field(default_factory=dict)


class FleetCollector(SnapshotCollector[FleetSnapshot]):
    """The fleet evaluator's estimates and health."""

    def families(self, snap: FleetSnapshot) -> Iterator[Metric]:
        labels = ["model", "version", "estimator", "window"]
        value = GaugeMetricFamily(
            "icos_fleet_estimated_accuracy_ratio",
            "Estimated accuracy of the whole fleet, every estimator (with_labels: with the shared store's labels).",
            labels=labels,
        )
        lower = GaugeMetricFamily(
            "icos_fleet_estimated_accuracy_ratio_lower",
            "Lower bound of the fleet estimate's 95% interval.",
            labels=labels,
        )
        upper = GaugeMetricFamily(
            "icos_fleet_estimated_accuracy_ratio_upper",
            "Upper bound of the fleet estimate's 95% interval.",
            labels=labels,
        )
        wl = ["model", "version", "window"]
        samples = GaugeMetricFamily(
            "icos_fleet_estimated_accuracy_samples", "Predictions of all replicas in the window.", labels=wl
        )
        replicas = GaugeMetricFamily("icos_fleet_replicas", "Replicas that exported in the window.", labels=wl)
        per_class = GaugeMetricFamily(
            "icos_fleet_estimated_class_metric",
            "Label-free (CBPE) precision, recall and F1 of all replicas' predictions per predicted class; "
            "class _macro and _weighted: their means.",
            labels=["model", "version", "window", "class", "metric"],
        )
        flagged = flag_family("icos_fleet_estimate_flagged")
        for v in snap.versions:
            for window, (up, reason) in v.flags.items():
                flagged.add_metric([snap.model, v.version, window, reason], float(up))
            for e in v.estimates:
                lv = [snap.model, v.version, e.estimator, e.window]
                value.add_metric(lv, e.value)
                lower.add_metric(lv, e.lower)
                upper.add_metric(lv, e.upper)
            for window, n in v.samples.items():
                samples.add_metric([snap.model, v.version, window], n)
            for window, k in v.replicas.items():
                replicas.add_metric([snap.model, v.version, window], k)
            for window, figures in v.classes.items():
                for cls, metric, x in class_metric_rows(figures):
                    per_class.add_metric([snap.model, v.version, window, cls, metric], x)
        yield from (value, lower, upper, samples, replicas, per_class, flagged)
        rows = [([snap.model, v.version], e) for v in snap.versions for e in v.headline]
        yield from headline_families("icos_fleet_", rows, "of the whole fleet")
        seg_rows = [([snap.model, v.version], p) for v in snap.versions for p in v.segments]
        yield from segment_families("icos_fleet_", seg_rows, "in the whole fleet's window")
        mismatch = GaugeMetricFamily(
            "icos_fleet_bundle_mismatch",
            "1 for a model version left out: its replicas export statistics of several bundles (mixed) or "
            "of another bundle than the evaluator's (other_bundle).",
            labels=["model", "version", "reason"],
        )
        for version, reason in snap.mismatches:
            mismatch.add_metric([snap.model, version, reason], 1)
        yield mismatch
        yield from self._health(snap)

    @staticmethod
    def _health(snap: FleetSnapshot) -> Iterator[Metric]:
        """The refresh loop's own state: last success, duration, failures, staleness."""
        m = [snap.model]
        last = GaugeMetricFamily(
            "icos_fleet_last_success_timestamp_seconds", "Unix time of the last successful refresh.", labels=["model"]
        )
        if snap.last_success is not None:
            last.add_metric(m, snap.last_success)
        yield last
        duration = GaugeMetricFamily(
            "icos_fleet_refresh_duration_seconds", "Wall time of the last successful refresh.", labels=["model"]
        )
        if snap.refresh_seconds is not None:
            duration.add_metric(m, snap.refresh_seconds)
        yield duration
        errors = CounterMetricFamily(
            "icos_fleet_query_errors",
            "Failed refreshes by reason (Prometheus unreachable, slow, answering an error, or an answer "
            "refused: too large, malformed, inconsistent).",
            labels=["model", "reason"],
        )
        for reason, count in snap.errors.items():
            errors.add_metric([snap.model, reason], count)
        yield errors
        unknown = CounterMetricFamily(
            "icos_fleet_unknown_stats",
            "Series of statistics the evaluator's bundle does not define (e.g. from newer replicas), ignored.",
            labels=["model"],
        )
        unknown.add_metric(m, snap.unknown_stats_total)
        yield unknown
        if snap.label_errors:
            label_errors = CounterMetricFamily(
                "icos_fleet_label_errors",
                "Failed reads of the shared prediction store's labels (with_labels missing until one succeeds).",
                labels=["model", "reason"],
            )
            for reason, count in snap.label_errors.items():
                label_errors.add_metric([snap.model, reason], count)
            yield label_errors
        stale = GaugeMetricFamily(
            "icos_fleet_stale", "1 when the served estimates are older than the stale limit.", labels=["model"]
        )
        stale.add_metric(m, 1 if snap.stale else 0)
        yield stale
        restarted = GaugeMetricFamily(
            "icos_fleet_restarted_replicas",
            "Replicas whose counters reset (restarted) within the longest window.",
            labels=["model"],
        )
        restarted.add_metric(m, snap.restarted_replicas)
        yield restarted
