"""Prometheus metrics of a challenger run beside the champion (namespace ``icos_challenger_``, bounded labels:
``model``/``version`` the champion's, ``challenger`` the challenger's configured name, ``window`` a configured
window).

Counted as the challenger works:

* ``icos_challenger_predictions_total{model,version,challenger}`` — predictions the challenger made;
* ``icos_challenger_dropped_total{challenger,reason}`` — requests it did not predict: ``queue_full`` (more
  than ``challenger.queue_limit`` waiting), ``error`` (its model or oracle failed), ``bad_output`` (its model answered
  scores that are not finite, or another number of classes), ``other_champion`` (the
  agent now serves a champion the pair was not calibrated for), ``stopping`` (left when the agent stopped);
* ``icos_challenger_cpu_seconds_total{challenger}`` — CPU time of its thread (its model, its oracle, the
  paired statistics): the challenger's cost, apart from the champion's;
* ``icos_challenger_inference_duration_seconds{challenger}`` — its model's time per request (histogram);
* ``icos_challenger_queue_length{challenger}`` — requests waiting for it;
* ``icos_challenger_stat_total{model,version,bundle,stat}`` — the pair's additive label-free sums (``n``,
  ``n_dis``, ``qa_sum``, ``qb_sum``, ``g_sq_sum``), ``bundle`` the challenger bundle's label: summed over
  replicas by the fleet evaluator.

Computed at scrape time (:class:`ChallengerCollector`, also under ``icos_fleet_`` for the fleet evaluator):

* ``icos_challenger_difference_ratio{model,version,challenger,window,estimator}`` with ``_lower`` and
  ``_upper`` — the challenger's accuracy minus the champion's on the same requests and its 95% interval,
  ``estimator`` ``label_free`` or ``with_labels`` (labels drawn on the disagreements);
* ``icos_challenger_agreement_ratio{model,version,challenger,window}`` — share of paired predictions on
  which the two versions agree; ``icos_challenger_paired_samples{...}`` — paired predictions;
* ``icos_challenger_accuracy_ratio{model,version,challenger,window,role,estimator}`` with ``_lower`` and
  ``_upper`` — each version's headline estimate on the paired predictions (``role`` ``champion`` or
  ``challenger``, ``estimator`` the one its bundle chose).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters.prometheus import LATENCY_BUCKETS, EstimatePoint, SnapshotCollector, finite_only

#: Why a request was not predicted by the challenger (every reason exported from the start).
DROP_REASONS = ("queue_full", "error", "bad_output", "other_champion", "stopping")


@dataclass(frozen=True)
class PairedPoint:
    """One window of paired predictions: their count, the agreement, every difference (``estimator`` the
    difference's name) and each version's headline (``estimator`` its headline estimator)."""

    window: str
    n: int
    agreement: float
    differences: Sequence[EstimatePoint] = ()
    champion: EstimatePoint | None = None
    challenger: EstimatePoint | None = None


@dataclass(frozen=True)
class ChallengerSnapshot:
    """What :class:`ChallengerCollector` exports at one scrape."""

    model: str
    version: str
    challenger: str
    windows: Sequence[PairedPoint] = field(default_factory=list)


class ChallengerCollector(SnapshotCollector[ChallengerSnapshot]):
    """The paired estimates computed at scrape time by ``snapshot()`` (``prefix``: ``icos_`` for an agent,
    ``icos_fleet_`` for the fleet evaluator)."""

    def __init__(self, snapshot: object, prefix: str = "icos_") -> None:
        super().__init__(snapshot)  # type: ignore[arg-type]
        self.prefix = prefix

    def families(self, snap: ChallengerSnapshot) -> Iterator[Metric]:
        p = f"{self.prefix}challenger_"
        base = ["model", "version", "challenger", "window"]
        mvc = [snap.model, snap.version, snap.challenger]
        diff = _bounded(
            f"{p}difference_ratio",
            "Challenger's accuracy minus the champion's on the same requests",
            [*base, "estimator"],
        )
        acc = _bounded(
            f"{p}accuracy_ratio",
            "Headline accuracy of each version on the paired requests",
            [*base, "role", "estimator"],
        )
        agreement = GaugeMetricFamily(
            f"{p}agreement_ratio", "Share of paired predictions on which the two versions agree.", labels=base
        )
        samples = GaugeMetricFamily(f"{p}paired_samples", "Paired predictions of the window.", labels=base)
        for w in snap.windows:
            lv = [*mvc, w.window]
            samples.add_metric(lv, w.n)
            if w.n:
                agreement.add_metric(lv, w.agreement)
            for e in w.differences:
                _add(diff, [*lv, e.estimator], e)
            for role, side in (("champion", w.champion), ("challenger", w.challenger)):
                if side is not None:
                    _add(acc, [*lv, role, side.estimator], side)
        yield from (f for f in (*diff, *acc, agreement, samples) if f.samples)  # the fleet has no headlines


def _bounded(name: str, what: str, labels: list[str]) -> tuple[GaugeMetricFamily, ...]:
    return (
        GaugeMetricFamily(name, f"{what}.", labels=labels),
        GaugeMetricFamily(f"{name}_lower", f"{what}: lower bound of the 95% interval.", labels=labels),
        GaugeMetricFamily(f"{name}_upper", f"{what}: upper bound of the 95% interval.", labels=labels),
    )


def _add(fams: tuple[GaugeMetricFamily, ...], labels: list[str], e: EstimatePoint) -> None:
    for fam, v in zip(fams, (e.value, e.lower, e.upper), strict=True):
        fam.add_metric(labels, v)


class PairStatsCollector(Collector):
    """``icos_challenger_stat_total{model,version,bundle,stat}``: running totals of the pair's label-free sums,
    exported at scrape time (as ``icos_window_stat_total`` is); the newest few label sets are kept."""

    MAX_KEYS = 4

    def __init__(self) -> None:
        self._totals: dict[tuple[str, str, str], dict[str, float]] = {}
        self._lock = threading.Lock()

    def add(self, key: tuple[str, str, str], items: Iterable[tuple[str, float]]) -> None:
        with self._lock:
            totals = self._totals.get(key)
            if totals is None:
                while len(self._totals) >= self.MAX_KEYS:
                    del self._totals[next(iter(self._totals))]
                totals = self._totals[key] = {}
            for stat, value in items:
                totals[stat] = totals.get(stat, 0) + value

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(
            "icos_challenger_stat",
            "Additive label-free sums of the champion/challenger pair (the fleet evaluator adds them over replicas).",
            labels=["model", "version", "bundle", "stat"],
        )
        with self._lock:
            rows = [(key, dict(totals)) for key, totals in self._totals.items()]
        for (model, version, bundle), totals in rows:
            for stat, value in totals.items():
                fam.add_metric([model, version, bundle, stat], value)
        yield finite_only(fam)


class ChallengerMetrics:
    """The challenger's counters, histogram and gauge, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry, challenger: str) -> None:
        self.challenger = challenger
        self.predictions = Counter(
            "icos_challenger_predictions",
            "Predictions the challenger made on the champion's requests.",
            ["model", "version", "challenger"],
            registry=registry,
        )
        self.dropped = Counter(
            "icos_challenger_dropped",
            "Requests the challenger did not predict, by reason.",
            ["challenger", "reason"],
            registry=registry,
        )
        for reason in DROP_REASONS:
            self.dropped.labels(challenger, reason)
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        self._lock = threading.Lock()
        self.cpu = Counter(
            "icos_challenger_cpu_seconds",
            "CPU time of the challenger's thread (its model, its oracle and the paired statistics).",
            ["challenger"],
            registry=registry,
        ).labels(challenger)
        self.inference = Histogram(
            "icos_challenger_inference_duration_seconds",
            "Time of the challenger's model per request.",
            ["challenger"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(challenger)
        self.queue = Gauge(
            "icos_challenger_queue_length", "Requests waiting for the challenger.", ["challenger"], registry=registry
        ).labels(challenger)
        self.stats = PairStatsCollector()
        registry.register(self.stats)

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped.labels(self.challenger, reason).inc(n)
        with self._lock:
            self._dropped[reason] = self._dropped.get(reason, 0) + n

    def dropped_counts(self) -> dict[str, int]:
        """Requests dropped so far, by reason (what ``icos_challenger_dropped_total`` counts)."""
        with self._lock:
            return dict(self._dropped)
