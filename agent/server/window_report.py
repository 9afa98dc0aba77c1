"""What an agent reports about its windows: the ``GET /v1/estimates`` document and the scrape-time
snapshot behind ``icos_estimated_*`` (:class:`exporters.prometheus.EstimatesCollector`).

Both read the same thing: every window's statistics and estimates, the estimators that extensions
compute beside the label-free ones (``with_labels`` from the labeling sample,
:mod:`agent.labels.service`), the trust signal and the label-free per-class figures (CBPE), so that
the JSON and the metrics never disagree. Each window's headline (the bundle's headline estimator, or
``doc`` where it cannot estimate the window: :func:`~agent.estimation.estimators.headline_of`) is
reported under ``headline`` in the JSON and as ``icos_headline_accuracy_ratio`` with the estimator that
gave it. Sections (e.g. ``realized`` from delayed labels) are added to
the JSON only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agent.estimation.class_metrics import window_class_metrics
from agent.estimation.estimators import headline_of, window_trust
from agent.estimation.intervals import Estimate
from agent.estimation.statistics import WindowStats
from agent.judging.runtime import Runtime
from agent.judging.windows import WindowSet
from exporters.prometheus import EstimatePoint, Snapshot, WindowPoint

#: An extra per-window section of ``/v1/estimates``: ``(runtime, now)`` → ``{window: {section: value}}``.
EstimateSection = Callable[[Runtime, float], Mapping[str, Mapping[str, Any]]]
#: Estimators computed beside the label-free ones (e.g. ``with_labels`` from the labeling sample):
#: ``(runtime, now, statistics per window)`` → per window, the extra estimates.
EstimatorExtension = Callable[[Runtime, float, Mapping[str, WindowStats]], Mapping[str, Mapping[str, Estimate]]]


class WindowReport:
    """Reports on ``windows``, with the ``extensions``' estimators and the ``sections`` of the JSON."""

    def __init__(
        self,
        windows: WindowSet,
        *,
        extensions: Sequence[EstimatorExtension] = (),
        sections: Sequence[EstimateSection] = (),
        per_class_cap: int,
    ) -> None:
        self.windows = windows
        self.extensions = tuple(extensions)
        self.sections = tuple(sections)
        self.per_class_cap = per_class_cap

    def window_estimates(self, rt: Runtime, now: float) -> dict[str, tuple[WindowStats, dict[str, Estimate]]]:
        """Every window's statistics and estimates, the extensions' estimators included."""
        out = self.windows.estimates(rt.calibration, now)
        stats = {name: s for name, (s, _) in out.items()}
        for extend in self.extensions:
            for name, extra in extend(rt, now, stats).items():
                if name in out:
                    out[name][1].update(extra)
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
        for name, (stats, ests) in self.window_estimates(rt, now).items():
            w: dict[str, Any] = {
                "n": stats.n,
                "fails": stats.fails,
                "fails_by_family": dict(stats.fails_by_family),
                "estimates": {k: e.to_dict() for k, e in ests.items()},
            }
            chosen = headline_of(ests, rt.headline)
            if chosen is not None:
                w["headline"] = {"estimator": chosen[0], **chosen[1].to_dict()}
            trust = window_trust(stats, rt.calibration)
            if trust is not None:
                w["trust"] = trust.to_dict()
            classes = self.class_figures(stats, rt)
            if classes is not None:
                w["classes"] = {"estimated": classes}
            windows[name] = w
        for section in self.sections:
            for name, extra in section(rt, now).items():
                if name in windows:
                    windows[name].update(extra)
        return {
            "model": {"name": rt.name, "version": rt.version, "sha256": rt.model_sha256},
            "headline": rt.headline,
            "total_judged": self.windows.total,
            "windows": windows,
            "oracle": {"tpr": rt.calibration.tpr, "fpr": rt.calibration.fpr},
            "timestamp": now,
        }

    def snapshot(self, rt: Runtime, now: float) -> Snapshot:
        """What the estimates collector exports at a scrape."""
        points: list[EstimatePoint] = []
        headline: list[EstimatePoint] = []
        wpoints: list[WindowPoint] = []
        for name, (stats, ests) in self.window_estimates(rt, now).items():
            trust = window_trust(stats, rt.calibration)
            distance = trust.distance if trust is not None else None
            classes = self.class_figures(stats, rt)
            wpoints.append(WindowPoint(name, stats.n, dict(stats.fails_by_family), distance, classes))
            for est, e in ests.items():
                points.append(EstimatePoint(est, name, e.value, e.lower, e.upper, e.n))
            chosen = headline_of(ests, rt.headline)
            if chosen is not None:
                est, e = chosen
                headline.append(EstimatePoint(est, name, e.value, e.lower, e.upper, e.n))
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
