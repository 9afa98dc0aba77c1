"""What an agent reports about its windows: one report per read (:meth:`WindowReport.windows`),
rendered twice — as the ``GET /v1/estimates`` document and as the scrape-time snapshot behind
``icos_estimated_*`` (:class:`exporters.prometheus.EstimatesCollector`) — so that the JSON and the
metrics never disagree.

Each window's estimates come from one call into :mod:`agent.estimation`
(:func:`~agent.estimation.estimators.estimate_window`): the window's statistics, plus, for time
windows, the labeled-sample sums of the delayed labels (so ``with_labels`` is one registered
estimator among the others), give every estimator's estimate and the trust signal; the label-free
per-class figures (CBPE) come from the same statistics. Each window's headline (the bundle's headline
estimator, or ``doc`` where it cannot estimate the window:
:func:`~agent.estimation.estimators.headline_of`) is reported under ``headline`` in the JSON and as
``icos_headline_accuracy_ratio`` with the estimator that gave it. Sections (e.g. ``realized`` from
delayed labels) are added to the JSON only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.estimation.class_metrics import window_class_metrics
from agent.estimation.estimators import WindowEstimates, estimate_window, headline_of
from agent.estimation.evidence import evidence_section
from agent.estimation.intervals import Estimate
from agent.estimation.reliability import unreliable
from agent.estimation.statistics import WindowStats
from agent.judging.runtime import Runtime
from agent.judging.windows import WindowSet
from exporters.prometheus import EstimatePoint, Snapshot, WindowPoint

#: An extra per-window section of ``/v1/estimates``: ``(runtime, now)`` → ``{window: {section: value}}``.
EstimateSection = Callable[[Runtime, float], Mapping[str, Mapping[str, Any]]]
#: Per window, statistics a report adds before estimating (the labeled-sample sums of ``with_labels``).
AddedStats = Callable[[Runtime, float], Mapping[str, WindowStats]]


@dataclass(frozen=True)
class WindowEntry:
    """One window of a report: its estimates and trust signal, and its label-free per-class figures."""

    name: str
    window: WindowEstimates
    classes: dict[str, Any] | None
    #: the headline estimator and its estimate (None for an empty window)
    headline: tuple[str, Estimate] | None


def _readable(name: str, e: Estimate, rt: Runtime) -> dict[str, Any]:
    """An estimate for ``/v1/estimates``: rounded to 6 decimals, marked ``unreliable`` (with the reason)
    when it says too little to be read as a number (:mod:`agent.estimation.reliability`)."""
    d: dict[str, Any] = {k: round(v, 6) if isinstance(v, float) else v for k, v in e.to_dict().items()}
    why = unreliable(name, e, rt.calibration)
    if why is not None:
        d["unreliable"] = why
    return d


def _no_stats(_rt: Runtime, _now: float) -> Mapping[str, WindowStats]:
    return {}


def _no_section(_rt: Runtime, _now: float) -> Mapping[str, Mapping[str, Any]]:
    return {}


class WindowReport:
    """Reports on ``windows``, with the ``labeled`` sums added to their statistics and the ``section``
    of the JSON."""

    def __init__(
        self,
        windows: WindowSet,
        *,
        labeled: AddedStats = _no_stats,
        section: EstimateSection = _no_section,
        per_class_cap: int,
    ) -> None:
        self.windows = windows
        self.labeled = labeled
        self.section = section
        self.per_class_cap = per_class_cap

    def windows_of(self, rt: Runtime, now: float) -> list[WindowEntry]:
        """Every window's statistics estimated once (see the module docstring)."""
        added = self.labeled(rt, now)
        out = []
        for name, stats in self.windows.stats(rt.calibration, now).items():
            extra = added.get(name)
            window = estimate_window(stats + extra if extra is not None else stats, rt.calibration)
            headline = headline_of(window.estimates, rt.headline)
            out.append(WindowEntry(name, window, self.class_figures(stats, rt), headline))
        return out

    def class_figures(self, stats: WindowStats, rt: Runtime) -> dict[str, Any] | None:
        """The window's label-free per-class precision, recall and F1 (CBPE; per class only up to the
        metrics' class cap, macro and weighted always)."""
        return window_class_metrics(
            stats.cbpe_predicted,
            stats.cbpe_true_positive,
            stats.cbpe_support,
            rt.classes,
            per_class=len(rt.classes) <= self.per_class_cap,
        )

    def document(self, rt: Runtime, now: float) -> dict[str, Any]:
        """The ``GET /v1/estimates`` body."""
        windows: dict[str, dict[str, Any]] = {}
        for entry in self.windows_of(rt, now):
            stats, ests = entry.window.stats, entry.window.estimates
            w: dict[str, Any] = {
                "n": stats.n,
                "fails": stats.fails,
                "fails_by_family": dict(stats.fails_by_family),
                "estimates": {k: _readable(k, e, rt) for k, e in ests.items()},
            }
            if entry.headline is not None:
                w["headline"] = {"estimator": entry.headline[0], **entry.headline[1].to_dict()}
            if entry.window.trust is not None:
                w["trust"] = entry.window.trust.to_dict()
            if entry.classes is not None:
                w["classes"] = {"estimated": entry.classes}
            windows[entry.name] = w
        for name, extra in self.section(rt, now).items():
            if name in windows:
                windows[name].update(extra)
        return {
            "model": {"name": rt.name, "version": rt.version, "sha256": rt.model_sha256},
            "headline": rt.headline,
            **evidence_section(rt.calibration.headline, shift_aware=rt.calibration.shift is not None),
            "total_judged": self.windows.total,
            "windows": windows,
            "oracle": {"tpr": rt.calibration.tpr, "fpr": rt.calibration.fpr},
            # what the relative alerts compare the headline with (icos_reference_accuracy_ratio)
            "reference": {"accuracy": rt.calibration.accuracy},
            "timestamp": now,
        }

    def snapshot(self, rt: Runtime, now: float) -> Snapshot:
        """What the estimates collector exports at a scrape."""
        points: list[EstimatePoint] = []
        headline: list[EstimatePoint] = []
        wpoints: list[WindowPoint] = []
        for entry in self.windows_of(rt, now):
            stats, trust = entry.window.stats, entry.window.trust
            distance = trust.distance if trust is not None else None
            wpoints.append(WindowPoint(entry.name, stats.n, dict(stats.fails_by_family), distance, entry.classes))
            for est, e in entry.window.estimates.items():
                points.append(EstimatePoint(est, entry.name, e.value, e.lower, e.upper, e.n))
            if entry.headline is not None:
                est, e = entry.headline
                headline.append(EstimatePoint(est, entry.name, e.value, e.lower, e.upper, e.n))
        cal = rt.calibration
        return Snapshot(
            rt.name,
            rt.version,
            points,
            wpoints,
            cal.tpr,
            cal.fpr,
            cal.n_wrong,
            cal.n_right,
            headline=headline,
            reference_accuracy=cal.accuracy,
        )
