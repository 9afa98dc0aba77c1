"""Prometheus metrics of delayed labels (namespace ``icos_``, bounded labels, no prediction ids).

Counters (:class:`LabelMetrics`):

* ``icos_labels_total{outcome}`` — labels received: ``accepted``, ``unknown`` (no stored prediction
  with that id: never seen, evicted, or not yet written), ``duplicate`` (already labeled, or repeated
  in one request) or ``invalid`` (no id, or a label that is not a class).
* ``icos_prediction_store_dropped_total{reason}`` — predictions not stored: ``queue_full`` (the
  writer queue was full), ``write_failed`` (a failed write, e.g. a full disk) or ``invalid`` (a
  request the store cannot hold, e.g. an id UTF-8 cannot encode; only that request is dropped).
* ``icos_prediction_store_errors_total{operation}`` — failures of the prediction store (``open``,
  ``write``, ``read``, ``corrupt``: a damaged file moved aside at open, or damaged rows met); inference
  goes on.
* ``icos_recalibrations_total{trigger,outcome}`` — ``trigger`` ``manual``/``auto``, ``outcome``
  ``applied``/``refused``.
* ``icos_prediction_store_predictions{state}`` — stored predictions, ``all`` and ``labeled`` (the
  whole fleet's with a shared PostgreSQL store).
* ``icos_prediction_store_queued`` — predictions answered but not yet committed: what a SIGKILL loses
  in ``batched`` durability.
* ``icos_prediction_store_buffered_total`` — predictions kept in memory for a later write because the
  database was unreachable; ``icos_prediction_store_reachable`` is 0 while that lasts.

At scrape time (:class:`RealizedCollector`, from a snapshot function), per window:

* ``icos_realized_accuracy_ratio{model,version,window}`` — accuracy of the labeled predictions;
* ``icos_realized_none_ratio{model,version,window}`` — share of them labeled as none of the model's classes
  (``__none__``; counted as wrong in the accuracy);
* ``icos_labeled_samples{model,version,window}`` — labeled predictions behind it;
* ``icos_realized_capped_labels{model,version,window}`` — those down-weighted because their source held more
  than ``labels.max_source_share`` of the window's labels (one labeler's flood; the source is never a label);
* ``icos_estimator_abs_error_ratio{model,version,estimator,window}`` — |estimate − realized
  accuracy|, the estimate computed on the same labeled predictions;
* ``icos_probability_error_ratio{model,version,window,metric}`` — ``mae``/``mse``/``rmse`` of the
  model's probabilities against the one-hot truth (dimensionless, in [0, 1]);
* ``icos_realized_class_metric{model,version,window,class,metric}`` — precision, recall and F1 per
  class of the labeled predictions (per class only up to the class cap; ``_macro``/``_weighted`` always).

Beside them, ``icos_label_sample_total`` counts the predictions drawn into the labeling sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric

from exporters.prometheus import SnapshotCollector, class_metric_rows

LABEL_OUTCOMES = ("accepted", "unknown", "duplicate", "corrected", "invalid")
PROBABILITY_METRICS = ("mae", "mse", "rmse")
#: why predictions were not stored (``icos_prediction_store_dropped_total{reason}``)
STORE_DROP_REASONS = ("queue_full", "write_failed", "invalid")
KEPT_INPUT_DROP_REASONS = ("too_large", "evicted")
#: what failed in the store (``icos_prediction_store_errors_total{operation}``)
STORE_OPERATIONS = ("open", "write", "read", "corrupt")


@dataclass(frozen=True)
class RealizedPoint:
    """The realized statistics of one window."""

    window: str
    n: int
    accuracy: float
    abs_errors: Mapping[str, float] = field(default_factory=dict)
    probability_errors: Mapping[str, float] = field(default_factory=dict)
    #: realized per-class figures (``per_class``, absent above the class cap, ``macro``, ``weighted``)
    classes: Mapping[str, Any] | None = None
    #: share of the labeled predictions labeled as none of the model's classes
    none_share: float = 0.0
    #: labels down-weighted because their source held more than ``labels.max_source_share`` of the window's
    capped: int = 0


@dataclass(frozen=True)
class RealizedSnapshot:
    model: str
    version: str
    windows: Sequence[RealizedPoint]


class RealizedCollector(SnapshotCollector[RealizedSnapshot]):
    """Exports realized accuracy and estimator errors computed at scrape time (``None`` → nothing)."""

    def families(self, snap: RealizedSnapshot) -> Iterator[Metric]:
        mv = [snap.model, snap.version]
        acc = GaugeMetricFamily(
            "icos_realized_accuracy_ratio",
            "Accuracy of the labeled predictions of the window (delayed labels).",
            labels=["model", "version", "window"],
        )
        samples = GaugeMetricFamily(
            "icos_labeled_samples",
            "Labeled predictions in the window behind the realized accuracy.",
            labels=["model", "version", "window"],
        )
        err = GaugeMetricFamily(
            "icos_estimator_abs_error_ratio",
            "Absolute error of each estimator against the realized accuracy, on the same labeled predictions.",
            labels=["model", "version", "estimator", "window"],
        )
        prob = GaugeMetricFamily(
            "icos_probability_error_ratio",
            "MAE, MSE and RMSE of the model's probabilities against the one-hot truth (labeled predictions).",
            labels=["model", "version", "window", "metric"],
        )
        none = GaugeMetricFamily(
            "icos_realized_none_ratio",
            "Share of the window's labeled predictions labeled as none of the model's classes (counted as wrong).",
            labels=["model", "version", "window"],
        )
        capped = GaugeMetricFamily(
            "icos_realized_capped_labels",
            "Labeled predictions of the window down-weighted because their source held more than "
            "labels.max_source_share of its labels.",
            labels=["model", "version", "window"],
        )
        per_class = GaugeMetricFamily(
            "icos_realized_class_metric",
            "Precision, recall and F1 per class of the labeled predictions of the window; class _macro and "
            "_weighted: their means.",
            labels=["model", "version", "window", "class", "metric"],
        )
        for w in snap.windows:
            samples.add_metric([*mv, w.window], w.n)
            capped.add_metric([*mv, w.window], w.capped)
            if w.n <= 0:
                continue
            for cls, metric, v in class_metric_rows(w.classes):
                per_class.add_metric([*mv, w.window, cls, metric], v)
            acc.add_metric([*mv, w.window], w.accuracy)
            none.add_metric([*mv, w.window], w.none_share)
            for est, value in w.abs_errors.items():
                err.add_metric([*mv, est, w.window], value)
            for metric in PROBABILITY_METRICS:
                if metric in w.probability_errors:
                    prob.add_metric([*mv, w.window, metric], w.probability_errors[metric])
        yield acc
        yield none
        yield samples
        yield capped
        yield err
        yield prob
        yield per_class


class LabelMetrics:
    """Counters and gauges of the prediction store and the labels endpoint, on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.labels = Counter("icos_labels", "Delayed labels received, by outcome.", ["outcome"], registry=registry)
        for outcome in LABEL_OUTCOMES:
            self.labels.labels(outcome)
        self.store_dropped = Counter(
            "icos_prediction_store_dropped",
            "Predictions not stored for delayed labels, by reason (queue_full, write_failed, invalid).",
            ["reason"],
            registry=registry,
        )
        for reason in STORE_DROP_REASONS:
            self.store_dropped.labels(reason)
        self.store_errors = Counter(
            "icos_prediction_store_errors",
            "Failures of the prediction store (open, write, read, corrupt); inference is not affected.",
            ["operation"],
            registry=registry,
        )
        for op in STORE_OPERATIONS:
            self.store_errors.labels(op)
        self.recalibrations = Counter(
            "icos_recalibrations",
            "Estimator recalibrations from delayed labels, by trigger and outcome.",
            ["trigger", "outcome"],
            registry=registry,
        )
        self.store_predictions = Gauge(
            "icos_prediction_store_predictions",
            "Predictions kept for delayed labels (all, labeled).",
            ["state"],
            registry=registry,
        )
        self.store_queued = Gauge(
            "icos_prediction_store_queued",
            "Predictions answered but not yet committed to the prediction store (lost to a SIGKILL in "
            "batched durability).",
            registry=registry,
        )
        self.store_buffered = Counter(
            "icos_prediction_store_buffered",
            "Predictions kept in memory for a later write because the store's database was unreachable.",
            registry=registry,
        )
        self.store_reachable = Gauge(
            "icos_prediction_store_reachable",
            "1 while the prediction store's last write reached its database, 0 while writes are buffered.",
            registry=registry,
        )
        self.store_reachable.set(1)
        self.label_sample = Counter(
            "icos_label_sample",
            "Predictions drawn into the labeling sample (labels.sample_rate); GET /v1/labels/requests lists "
            "those still without a label.",
            registry=registry,
        )

        self.kept_inputs_dropped = Counter(
            "icos_kept_inputs_dropped",
            "Inputs of sampled predictions not kept or dropped later (labels.keep_sampled_inputs), by reason "
            "(too_large: over labels.max_kept_input_bytes; evicted: the oldest, past labels.max_kept_inputs_bytes).",
            ["reason"],
            registry=registry,
        )
        for reason in KEPT_INPUT_DROP_REASONS:
            self.kept_inputs_dropped.labels(reason)

    def count_labels(self, counts: Mapping[str, int]) -> None:
        for outcome, n in counts.items():
            if n:
                self.labels.labels(outcome).inc(n)

    def set_store(self, rows: int, labeled: int) -> None:
        self.store_predictions.labels("all").set(rows)
        self.store_predictions.labels("labeled").set(labeled)
