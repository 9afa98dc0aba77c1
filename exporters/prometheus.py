"""Prometheus metrics of the sidecar (namespace ``icos_``, base units, bounded labels).

Everything is registered on a :class:`prometheus_client.CollectorRegistry` passed in, so that tests
use a fresh registry and other collectors (e.g. audit metrics) can be added to the same one.
Live estimates are not pushed: :class:`EstimatesCollector` calls a snapshot function at scrape time.

Metric names (labels):

* ``icos_predictions_total{model,version}`` — judged predictions.
* ``icos_predicted_class_total{model,version,class}`` — only when the class count is at most the cap.
* ``icos_verdicts_total{model,version,verdict,invariant}`` — ``verdict`` is ``pass``/``fail``,
  ``invariant`` the failing family (``idi``/``tdi``/``adi``) or ``none``.
* ``icos_estimated_accuracy_ratio{model,version,estimator,window}`` (``with_labels`` too, in time
  windows whose labeling sample has labels) and its 95% bounds
  ``icos_estimated_accuracy_ratio_lower`` / ``icos_estimated_accuracy_ratio_upper``;
  ``icos_estimated_accuracy_samples{model,version,window}`` — predictions behind the estimates.
* ``icos_headline_accuracy_ratio{model,version,estimator,window}`` with ``_lower`` / ``_upper`` — the
  window's headline estimate, ``estimator`` naming the one chosen
  (:func:`agent.estimation.estimators.registry.headline_of`), and ``icos_headline_accuracy_samples`` (the
  predictions behind it, with the same labels so that rules can weight replicas by it).
* ``icos_reference_accuracy_ratio{model,version}`` — accuracy on the bundle's calibration split (held
  out of fitting): the figure the default alerts compare the headline with.
* ``icos_estimate_trust_distance{model,version,window}`` — how far the window lies from the windows
  the headline estimator was calibrated on (≤ 1: inside the calibrated range; absent for bundles
  without a trust model).
* ``icos_estimate_flagged{model,version,window,reason}`` — 1 where the window's headline may be wrong
  (the flag is raised: its interval is widened), 0 where not; ``reason`` names the main evidence (one of
  a fixed set, ``none`` when there is none; a flag that is down may still name ``class_mix_changed`` or
  ``few_calibration_errors``). Absent for bundles without a flag or trust model.
* ``icos_window_fail_ratio{model,version,window,invariant}`` — share of failed predictions per family.
* ``icos_estimated_class_metric{model,version,window,class,metric}`` — label-free (CBPE) precision,
  recall and F1 per class of every window (per class only up to the class cap; ``_macro`` and
  ``_weighted`` always, except in the count window, which has none above the cap).
* ``icos_segment_estimated_accuracy_ratio``, ``icos_segment_share_ratio`` and
  ``icos_segment_contribution_ratio{model,version,window,kind,segment}``, and
  ``icos_segment_reference_accuracy_ratio{model,version,kind,segment}`` — where a window's drop is: every
  segment fixed at fit (at most ``fit --max-segments``, 64 by default), its estimated accuracy, share and
  contribution to the drop (docs/diagnosis.md); none for bundles without segments.
* ``icos_oracle_tpr_ratio`` / ``icos_oracle_fpr_ratio{model,version}`` and
  ``icos_oracle_calibration_samples{model,version,truth}`` (``wrong``/``right``), so that the
  corrected estimate can be recomputed across replicas.
* ``icos_inference_duration_seconds`` / ``icos_oracle_duration_seconds{model,version}`` (histograms).
* ``icos_invalid_requests_total{reason}``, ``icos_upstream_errors_total{reason}``,
  ``icos_observe_queue_length``, ``icos_observe_rejected_total``,
  ``icos_observe_events_total{type}``, ``icos_observe_events_unmatched_total{reason}``.
* ``icos_connections_refused_total{reason}`` — connections refused or closed by the HTTP server's
  bounds (``limit_concurrency``, ``header_timeout``, ``max_head_bytes``).
* ``icos_model_info{model,version,sha256}`` — constant 1.
* ``icos_window_stat_total{model,version,bundle,stat}`` — the additive window statistics every
  estimator reads (counts and sums, one ``stat`` per number: about 80 series per model, plus five per
  segment), summed over replicas by the fleet evaluator (``mode: fleet``).

No NaN or infinity reaches ``/metrics``: the scrape-time collectors leave a non-finite sample out.
* ``icos_state_write_failures_total``, ``icos_state_writable`` (1/0) and
  ``icos_state_last_write_timestamp_seconds`` — health of the state directory.
* ``icos_state_quarantined_total{what}`` — damaged state (``windows``, ``pending``, ``document``,
  ``file``) set aside at start instead of failing it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters.label_values import bounded_label
from exporters.segment_metrics import SegmentPoint, segment_families
from exporters.window_stats import Additive, Flatten, WindowStatsCollector, finite_only
from invariants.oracle import FAMILIES, Verdict

#: ``(verdict, invariant)`` label values of every :class:`~invariants.oracle.Verdict`, indexed by code.
VERDICT_LABELS: tuple[tuple[str, str], ...] = tuple((v.outcome, v.family) for v in Verdict)

#: Why the HTTP server refused or closed a connection (labels of ``icos_connections_refused_total``).
CONNECTION_REFUSAL_REASONS = ("limit_concurrency", "header_timeout", "max_head_bytes", "bytes_in_flight")
#: the per-class figures of ``icos_estimated_class_metric``
CLASS_METRICS = ("precision", "recall", "f1")
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class EstimatePoint:
    """One estimate of one estimator on one window."""

    estimator: str
    window: str
    value: float
    lower: float
    upper: float
    n: int


@dataclass(frozen=True)
class WindowPoint:
    """Sample count and failure counts of one window."""

    window: str
    n: int
    fails_by_family: dict[str, int] = field(default_factory=dict)
    #: the headline estimate's trust distance (None: no trust model in the bundle or empty window)
    trust_distance: float | None = None
    #: label-free per-class figures (:func:`agent.estimation.statistics.class_metrics.window_class_metrics`: a
    #: ``per_class`` mapping, absent above the class cap, and ``macro`` / ``weighted`` means)
    classes: Mapping[str, Any] | None = None
    #: the flag "this number may be wrong" is raised (None: no flag nor trust model, or an empty window)
    flagged: bool | None = None
    #: its main reason (``none`` when it has none)
    flag_reason: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """What :class:`EstimatesCollector` exports at one scrape."""

    model: str
    version: str
    estimates: Sequence[EstimatePoint]
    windows: Sequence[WindowPoint]
    oracle_tpr: float | None = None
    oracle_fpr: float | None = None
    calibration_wrong: int | None = None
    calibration_right: int | None = None
    #: per window, the headline estimate (its ``estimator`` the one chosen); none for an empty window
    headline: Sequence[EstimatePoint] = ()
    #: accuracy on the bundle's calibration split
    reference_accuracy: float | None = None
    #: every window's segments (none without segments in the bundle)
    segments: Sequence[SegmentPoint] = ()


S = TypeVar("S")


def headline_families(prefix: str, rows: Iterable[tuple[Sequence[str], EstimatePoint]], what: str) -> list[Metric]:
    """``<prefix>headline_accuracy_ratio`` with ``_lower``/``_upper`` and ``<prefix>headline_accuracy_samples``,
    labelled ``model, version, estimator, window``: one row per ``([model, version], headline point)``;
    ``what`` says whose headline it is, in the help texts."""
    labels = ["model", "version", "estimator", "window"]
    name = f"{prefix}headline_accuracy_ratio"
    value = GaugeMetricFamily(name, f"Headline accuracy estimate {what}; estimator: the one chosen.", labels=labels)
    lower = GaugeMetricFamily(f"{name}_lower", "Lower bound of the headline's 95% interval.", labels=labels)
    upper = GaugeMetricFamily(f"{name}_upper", "Upper bound of the headline's 95% interval.", labels=labels)
    samples = GaugeMetricFamily(
        f"{prefix}headline_accuracy_samples", "Predictions behind the headline estimate.", labels=labels
    )
    for mv, e in rows:
        lv = [*mv, e.estimator, e.window]
        value.add_metric(lv, e.value)
        lower.add_metric(lv, e.lower)
        upper.add_metric(lv, e.upper)
        samples.add_metric(lv, e.n)
    return [value, lower, upper, samples]


def flag_family(name: str) -> GaugeMetricFamily:
    """``<name>{model,version,window,reason}``: 1 where the window's headline may be wrong, 0 where not."""
    return GaugeMetricFamily(
        name,
        "1 where the window's headline may be wrong (the flag is raised and its interval widened), else 0; "
        "reason: the main evidence (none: none).",
        labels=["model", "version", "window", "reason"],
    )


def class_metric_rows(classes: Mapping[str, Any] | None) -> Iterator[tuple[str, str, float]]:
    """``(class, metric, value)`` of a per-class figures mapping (``per_class``, ``macro``,
    ``weighted``, as :mod:`agent.estimation.statistics.class_metrics` gives them); the means under the class
    names ``_macro`` and ``_weighted``; the class names bounded as labels (:func:`bounded_label`)."""
    if not classes:
        return
    rows = [*classes.get("per_class", {}).items()]
    rows += [(f"_{mean}", classes[mean]) for mean in ("macro", "weighted") if mean in classes]
    for cls, figures in rows:
        label = bounded_label(cls)
        for metric in CLASS_METRICS:
            yield label, metric, float(figures[metric])


class SnapshotCollector(Collector, Generic[S]):
    """Metric families computed at scrape time from ``snapshot()`` (``None`` → nothing exported);
    subclasses say which in :meth:`families`."""

    def __init__(self, snapshot: Callable[[], S | None]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        if snap is not None:
            for fam in self.families(snap):
                yield finite_only(fam)

    def families(self, snap: S) -> Iterator[Metric]:
        raise NotImplementedError


class EstimatesCollector(SnapshotCollector[Snapshot]):
    """Exports live estimates computed at scrape time by ``snapshot()`` (``None`` → nothing)."""

    def families(self, snap: Snapshot) -> Iterator[Metric]:
        mv = [snap.model, snap.version]
        labels = ["model", "version", "estimator", "window"]
        value = GaugeMetricFamily(
            "icos_estimated_accuracy_ratio",
            "Estimated operational accuracy (label-free estimators; with_labels: from the labeling sample).",
            labels=labels,
        )
        lower = GaugeMetricFamily(
            "icos_estimated_accuracy_ratio_lower", "Lower bound of the 95% interval of the estimate.", labels=labels
        )
        upper = GaugeMetricFamily(
            "icos_estimated_accuracy_ratio_upper", "Upper bound of the 95% interval of the estimate.", labels=labels
        )
        for e in snap.estimates:
            lv = [*mv, e.estimator, e.window]
            value.add_metric(lv, e.value)
            lower.add_metric(lv, e.lower)
            upper.add_metric(lv, e.upper)
        samples = GaugeMetricFamily(
            "icos_estimated_accuracy_samples",
            "Judged predictions in the window behind the estimates.",
            labels=["model", "version", "window"],
        )
        fail = GaugeMetricFamily(
            "icos_window_fail_ratio",
            "Share of predictions in the window failed by an invariant family.",
            labels=["model", "version", "window", "invariant"],
        )
        trust = GaugeMetricFamily(
            "icos_estimate_trust_distance",
            "Distance of the window from the headline estimator's calibration windows (<= 1: calibrated range).",
            labels=["model", "version", "window"],
        )
        per_class = GaugeMetricFamily(
            "icos_estimated_class_metric",
            "Label-free (CBPE) precision, recall and F1 of the window per predicted class; class _macro and "
            "_weighted: their means.",
            labels=["model", "version", "window", "class", "metric"],
        )
        flagged = flag_family("icos_estimate_flagged")
        for w in snap.windows:
            for cls, metric, v in class_metric_rows(w.classes):
                per_class.add_metric([*mv, w.window, cls, metric], v)
            samples.add_metric([*mv, w.window], w.n)
            if w.trust_distance is not None:
                trust.add_metric([*mv, w.window], w.trust_distance)
            if w.flagged is not None:
                flagged.add_metric([*mv, w.window, w.flag_reason or "none"], float(w.flagged))
            if w.n > 0:
                for fam in FAMILIES:
                    fail.add_metric([*mv, w.window, fam], w.fails_by_family.get(fam, 0) / w.n)
        yield value
        yield lower
        yield upper
        yield from headline_families("icos_", [(mv, e) for e in snap.headline], "of this agent's window")
        yield from segment_families("icos_", [(mv, p) for p in snap.segments], "in this agent's window")
        yield samples
        yield fail
        yield trust
        yield flagged
        yield per_class
        yield from _calibration_families(snap, mv)


def _calibration_families(snap: Snapshot, mv: list[str]) -> Iterator[Metric]:
    """What the bundle's calibration split says: the model's accuracy there (the reference the alerts
    compare with), the oracle's TPR/FPR and the samples behind them (so that Prometheus can recompute the
    corrected estimate across replicas)."""
    reference = GaugeMetricFamily(
        "icos_reference_accuracy_ratio",
        "Accuracy on the bundle's calibration split (held out of fitting): what the model is expected to do.",
        labels=["model", "version"],
    )
    if snap.reference_accuracy is not None:
        reference.add_metric(mv, snap.reference_accuracy)
    yield reference
    if snap.oracle_tpr is not None and snap.oracle_fpr is not None:
        tpr = GaugeMetricFamily(
            "icos_oracle_tpr_ratio",
            "Oracle true-positive rate (share of wrong predictions failed) on the calibration split.",
            labels=["model", "version"],
        )
        tpr.add_metric(mv, snap.oracle_tpr)
        fpr = GaugeMetricFamily(
            "icos_oracle_fpr_ratio",
            "Oracle false-positive rate (share of right predictions failed) on the calibration split.",
            labels=["model", "version"],
        )
        fpr.add_metric(mv, snap.oracle_fpr)
        yield tpr
        yield fpr
    if snap.calibration_wrong is not None and snap.calibration_right is not None:
        cal = GaugeMetricFamily(
            "icos_oracle_calibration_samples",
            "Calibration-split predictions behind the oracle TPR/FPR, by truth.",
            labels=["model", "version", "truth"],
        )
        cal.add_metric([*mv, "wrong"], snap.calibration_wrong)
        cal.add_metric([*mv, "right"], snap.calibration_right)
        yield cal


@dataclass
class _Children:
    """Labelled children of one model/version, looked up once (label lookups cost more than increments)."""

    predictions: Any
    verdicts: list[Any]
    classes: list[Any]
    inference: Any
    oracle: Any


class AgentMetrics:
    """The sidecar's counters and histograms, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry, *, per_class_label_cap: int = 20) -> None:
        self.registry = registry
        self.per_class_label_cap = per_class_label_cap
        self._judging_metrics(registry)
        self._refusal_metrics(registry)
        self._observe_metrics(registry)
        self.model_info = Gauge(
            "icos_model_info", "The model being judged (constant 1).", ["model", "version", "sha256"], registry=registry
        )
        self._state_metrics(registry)
        self.window_stats = WindowStatsCollector()
        registry.register(self.window_stats)
        self._info_labels: tuple[str, str, str] | None = None
        self._cache: dict[tuple[str, str, int], _Children] = {}

    def _judging_metrics(self, registry: CollectorRegistry) -> None:
        """What is judged: predictions, verdicts, predicted classes, and the time the model and the oracle take."""
        self.predictions = Counter(
            "icos_predictions", "Predictions judged by the oracle.", ["model", "version"], registry=registry
        )
        self.unjudged = Counter(
            "icos_unjudged_predictions",
            "Predictions answered but left unjudged by the judging sample (judging.sample_rate below 1).",
            registry=registry,
        )
        self.predicted_class = Counter(
            "icos_predicted_class",
            "Judged predictions by predicted class (only for models with few classes).",
            ["model", "version", "class"],
            registry=registry,
        )
        self.verdicts = Counter(
            "icos_verdicts",
            "Oracle verdicts: pass, or fail by the first violated invariant family.",
            ["model", "version", "verdict", "invariant"],
            registry=registry,
        )
        self.inference_duration = Histogram(
            "icos_inference_duration_seconds",
            "Time to run the model on one request batch (serve mode) or wait for the upstream (proxy mode).",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.oracle_duration = Histogram(
            "icos_oracle_duration_seconds",
            "Time to judge one request batch with the invariants.",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def _refusal_metrics(self, registry: CollectorRegistry) -> None:
        """Requests and connections refused, and failed calls to the upstream (every reason from the start)."""
        self.invalid_requests = Counter(
            "icos_invalid_requests",
            "Requests rejected as malformed or invalid, by reason.",
            ["reason"],
            registry=registry,
        )
        self.connections_refused = Counter(
            "icos_connections_refused",
            "Connections refused or closed by the HTTP server's bounds, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in CONNECTION_REFUSAL_REASONS:
            self.connections_refused.labels(reason)
        self.upstream_errors = Counter(
            "icos_upstream_errors",
            "Proxy mode: failed calls to the upstream server, by reason.",
            ["reason"],
            registry=registry,
        )

    def _observe_metrics(self, registry: CollectorRegistry) -> None:
        """Observe mode's queue and CloudEvents."""
        self.observe_queue_length = Gauge(
            "icos_observe_queue_length", "Observe mode: batches waiting to be judged.", registry=registry
        )
        self.observe_rejected = Counter(
            "icos_observe_rejected",
            "Observe mode: batches rejected with 429 because the queue was full.",
            registry=registry,
        )
        self.observe_events = Counter(
            "icos_observe_events",
            "Observe mode: inference-logger CloudEvents received, by type.",
            ["type"],
            registry=registry,
        )
        self.observe_unmatched = Counter(
            "icos_observe_events_unmatched",
            "Observe mode: CloudEvents dropped without their pair, by reason (expired, evicted, duplicate; "
            "overflow: refused with 429 at observe.max_pending_bytes).",
            ["reason"],
            registry=registry,
        )

    def _state_metrics(self, registry: CollectorRegistry) -> None:
        """Writes of the state directory, and state set aside at start."""
        self.state_write_failures = Counter(
            "icos_state_write_failures",
            "Failed writes of the state directory (read-only, full, unreadable); serving goes on.",
            registry=registry,
        )
        self.state_writable = Gauge(
            "icos_state_writable",
            "1 when the last write of the state directory succeeded, 0 while writes fail.",
            registry=registry,
        )
        self.state_last_write = Gauge(
            "icos_state_last_write_timestamp_seconds",
            "Unix time of the last successful write of the state directory.",
            registry=registry,
        )
        self.state_quarantined = Counter(
            "icos_state_quarantined",
            "Damaged state set aside at start (windows, pending, document, file); the agent starts without it.",
            ["what"],
            registry=registry,
        )
        for what in ("windows", "pending", "document", "file"):
            self.state_quarantined.labels(what)

    def set_model(self, model: str, version: str, sha256: str, classes: Sequence[str]) -> None:
        """Declare the current model (after start or reload); pre-creates the series at zero."""
        if self._info_labels is not None:
            self.model_info.remove(*self._info_labels)
        self._info_labels = (model, version, sha256 or "unknown")
        self.model_info.labels(*self._info_labels).set(1)
        self.predictions.labels(model, version)
        for verdict, inv in VERDICT_LABELS:
            self.verdicts.labels(model, version, verdict, inv)
        if len(classes) <= self.per_class_label_cap:
            for c in classes:
                self.predicted_class.labels(model, version, bounded_label(c))

    def record_batch(
        self,
        model: str,
        version: str,
        verdict_counts: Sequence[int],
        class_counts: Sequence[int] | None,
        classes: Sequence[str],
        inference_seconds: float | Sequence[float] | None,
        oracle_seconds: float | Sequence[float] | None,
    ) -> None:
        """Record one judged batch: ``verdict_counts`` indexed like :data:`VERDICT_LABELS`;
        ``inference_seconds`` is one duration or one per request judged in the batch, ``oracle_seconds``
        one duration or one per oracle call that judged the batch's predictions."""
        c = self._children(model, version, classes)
        c.predictions.inc(int(sum(verdict_counts)))
        for child, k in zip(c.verdicts, verdict_counts, strict=False):
            if k:
                child.inc(int(k))
        if class_counts is not None and c.classes:
            for child, k in zip(c.classes, class_counts, strict=False):
                if k:
                    child.inc(int(k))
        if inference_seconds is not None:
            for sec in [inference_seconds] if isinstance(inference_seconds, int | float) else inference_seconds:
                c.inference.observe(sec)
        if oracle_seconds is not None:
            for sec in [oracle_seconds] if isinstance(oracle_seconds, int | float) else oracle_seconds:
                c.oracle.observe(sec)

    def record_window_stats(self, model: str, version: str, bundle: str, items: Iterable[tuple[str, float]]) -> None:
        """Add one batch's window statistics (``(stat, value)`` pairs, zeros included: every series
        exists from its first sight, so that a vector's length is visible to the fleet evaluator)."""
        self.window_stats.add((model, version, bundle), items)

    def add_window_stats(self, model: str, version: str, bundle: str, stats: Additive, flatten: Flatten) -> None:
        """Add one batch's window statistic, exported as ``flatten(sum of the batches)`` (the same series
        and sums as :meth:`record_window_stats` of every batch's ``flatten(stats)``, flattened at scrape time)."""
        self.window_stats.add_stats((model, version, bundle), stats, flatten)

    def _children(self, model: str, version: str, classes: Sequence[str]) -> _Children:
        key = (model, version, len(classes))
        c = self._cache.get(key)
        if c is None:
            per_class = len(classes) <= self.per_class_label_cap
            c = _Children(
                predictions=self.predictions.labels(model, version),
                verdicts=[self.verdicts.labels(model, version, v, i) for v, i in VERDICT_LABELS],
                classes=[self.predicted_class.labels(model, version, bounded_label(k)) for k in classes]
                if per_class
                else [],
                inference=self.inference_duration.labels(model, version),
                oracle=self.oracle_duration.labels(model, version),
            )
            if len(self._cache) > 16:
                self._cache.clear()
            self._cache[key] = c
        return c

    def state_write(self, ok: bool, now: float) -> None:
        """Record one attempt to write the state directory."""
        self.state_writable.set(1 if ok else 0)
        if ok:
            self.state_last_write.set(now)
        else:
            self.state_write_failures.inc()

    def invalid(self, reason: str) -> None:
        self.invalid_requests.labels(reason).inc()

    def connection_refused(self, reason: str) -> None:
        """One connection refused or closed by a bound of the HTTP server (one of
        :data:`CONNECTION_REFUSAL_REASONS`)."""
        self.connections_refused.labels(reason).inc()
