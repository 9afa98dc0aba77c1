"""The fleet evaluator: every refresh, the window statistics of all replicas from Prometheus, every
estimator on them, and what is served (``/v1/estimates``, ``/metrics``).

A refresh is believed only whole: every query answered within its bounds, every window of the
evaluator's bundle consistent (:class:`~agent.fleet.stat_schema.StatSchema`), all within one deadline
(``fleet.refresh_timeout_seconds``). A failed refresh, whatever raised, keeps the last estimates
(marked stale once older than ``fleet.stale_after_seconds``), counts the failure under its reason
and shows it in ``last_error``. Statistics of two bundles under one model version are never added:
that version gets no estimate and a ``icos_fleet_bundle_mismatch`` series instead.

With the shared prediction store configured (``labels.store_url``), the labels of the evaluator's model
(its configured version) are read after the sums (:mod:`agent.fleet.labels`) and added to each time
window's statistics, so the estimators include the fleet's ``with_labels`` and its segments their realized
accuracy from every replica's labels. A store that fails fails
that part only: counted by reason (``icos_fleet_label_errors_total``), shown in ``labels.last_error``,
the label-free estimates served as usual.

Beside its own sums, each refresh asks every fleet companion (:mod:`agent.fleet.companions`) for its part,
within the same deadline: with a challenger (``challenger.bundle_path``), the replicas' pair sums summed and the
fleet's comparison of the champion with it estimated (:mod:`agent.fleet.challenger`).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client.registry import Collector

from agent.config.settings import AgentSettings
from agent.core import logs
from agent.core.durations import parse_duration
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import RECOMMENDED_ESTIMATOR
from agent.estimation.segments.realized import with_realized
from agent.estimation.statistics.window import WindowStats
from agent.fleet.companions import FleetCompanion, FleetPart
from agent.fleet.labels import LABEL_ERROR_REASONS, FleetLabels, StoreUnavailable, error_reason
from agent.fleet.prometheus_api import REASONS, PrometheusAPI, Reason, RefreshError, printable
from agent.fleet.stat_schema import StatSchema
from agent.fleet.window_sums import UNKNOWN_NAMES_KEPT, FleetScope, window_sums
from agent.results.bundle import BundleSection
from agent.results.window import WindowEntry, snapshot_points, window_entry
from exporters.fleet import FleetSnapshot, FleetVersion

log = logs.get("fleet")


@dataclass(frozen=True)
class VersionWindows:
    """One model version's windows, each estimated once from the replicas' summed statistics
    (:class:`~agent.results.window.WindowEntry`: estimates, trust signal, headline and the
    label-free per-class figures, where the replicas export per-class sums), and the replicas behind them."""

    windows: dict[str, WindowEntry]
    replicas: dict[str, int]
    #: per window, the ``realized`` section of the labeled predictions in it (the store's labels)
    realized: dict[str, dict[str, Any]] = field(default_factory=dict)

    def sections(self, name: str) -> dict[str, Any]:
        """What only the fleet knows of window ``name``: its replicas, and its labels' ``realized``."""
        out: dict[str, Any] = {"replicas": self.replicas.get(name, 0)}
        if name in self.realized:
            out["realized"] = self.realized[name]
        return out


@dataclass
class FleetResult:
    """What one successful refresh found."""

    at: float
    versions: dict[str, VersionWindows] = field(default_factory=dict)
    #: (version, reason) of versions left out: ``mixed`` (several bundles) or ``other_bundle``
    mismatches: set[tuple[str, str]] = field(default_factory=set)
    restarted_replicas: int = 0
    queries: int = 0
    seconds: float = 0.0
    #: (version, stat) of the series ignored: statistics the bundle does not define
    unknown: set[tuple[str, str]] = field(default_factory=set)
    #: every fleet companion's part, in the evaluator's order of its companions
    parts: list[FleetPart] = field(default_factory=list)


class FleetEvaluator:
    """Evaluates one model's fleet with the calibration of its bundle (the one the replicas serve)."""

    def __init__(
        self,
        settings: AgentSettings,
        calibration: EstimatorCalibration,
        bundle_label: str,
        api: PrometheusAPI,
        clock: Callable[[], float] = time.time,
        headline: str = RECOMMENDED_ESTIMATOR,
        labels: FleetLabels | None = None,
        classes: Sequence[str] = (),
        companions: Sequence[FleetCompanion[Any]] = (),
    ) -> None:
        self.settings = settings
        self.headline = headline  # the bundle's headline estimator, as the replicas report it
        self.model = settings.model.name
        self.calibration = calibration
        self.bundle_label = bundle_label
        self.api = api
        self.clock = clock
        self.windows = {name: parse_duration(name) for name in settings.windows.time}
        #: the model's class names (the per-class figures; none: not computed)
        self.classes = list(classes)
        self.per_class_cap = settings.metrics.per_class_label_cap
        fleet = settings.fleet
        schema = StatSchema.of_bundle(calibration, len(self.classes) if self.classes else None)
        self.scope = FleetScope(self.model, bundle_label, schema, fleet.selector, fleet.max_versions)
        self.result: FleetResult | None = None
        #: failed refreshes by reason (every reason from the start, so that a rise is visible)
        self.errors: dict[str, int] = dict.fromkeys(REASONS, 0)
        self.unknown_stats_total = 0
        self.last_error: str | None = None
        self.last_error_reason: Reason | None = None
        self.last_attempt: float | None = None
        self.labels = labels
        #: what runs beside the sums at every refresh (a challenger's comparison)
        self.companions = tuple(companions)
        #: failed reads of the store's labels by reason, and the last one's message (None after a success)
        self.label_errors: dict[str, int] = dict.fromkeys(LABEL_ERROR_REASONS, 0)
        self.labels_error: str | None = None
        #: labeled predictions of the last read, and windows left without labels by the row cap
        self.labels_read = 0
        self.labels_truncated: tuple[str, ...] = ()
        self._lock = threading.Lock()

    @property
    def errors_total(self) -> int:
        return sum(self.errors.values())

    def evaluate(self, at: float) -> FleetResult:
        """One evaluation of every window at ``at``, within ``fleet.refresh_timeout_seconds`` (raises
        :class:`RefreshError`). Runs its own event loop: call it from a thread without one."""
        try:
            result = asyncio.run(self._evaluate_by_deadline(at))
        except BaseException as exc:
            _release_frames(exc)
            raise
        self._add_labels(result)
        return result

    def _add_labels(self, result: FleetResult) -> None:
        """The store's labels added to the windows of the evaluator's model version (see the module
        docstring); a failed read leaves the label-free estimates as they are."""
        version = self.settings.model.version
        vw = result.versions.get(version)
        if self.labels is None or vw is None:
            return
        try:
            read = self.labels.read(result.at, self.calibration)
        except StoreUnavailable as exc:
            self._labels_failed(error_reason(exc), str(exc))
            return
        except Exception as exc:  # e.g. rows the store should not hold: that part fails, not the refresh
            log.exception("fleet: the labels read from the store could not be used")
            self._labels_failed("failed", f"{type(exc).__name__}: {exc}")
            return
        windows = dict(vw.windows)
        for name, lab in read.sums.items():
            if name in windows:
                windows[name] = self._entry(name, windows[name].stats + lab)
        for name, by_segment in read.segments.items():
            entry = windows.get(name)
            if entry is not None and entry.segments is not None:
                windows[name] = replace(entry, segments=with_realized(entry.segments, by_segment))
        realized = {
            name: w.to_dict() if w is not None else {"n": 0} for name, w in read.realized.items() if name in windows
        }
        result.versions[version] = replace(vw, windows=windows, realized=realized)
        with self._lock:
            self.labels_error = None
            self.labels_read = read.rows
            self.labels_truncated = read.truncated

    async def _evaluate_by_deadline(self, at: float) -> FleetResult:
        limit = self.settings.fleet.refresh_timeout_seconds
        try:
            async with asyncio.timeout(limit), self.api.connected():
                return await self._evaluate(at)
        except TimeoutError as exc:
            raise RefreshError(
                "deadline", f"the refresh took longer than fleet.refresh_timeout_seconds ({limit:g} s)"
            ) from exc

    async def _evaluate(self, at: float) -> FleetResult:
        t0 = time.perf_counter()
        fleet = self.settings.fleet
        out = FleetResult(at)
        per_version: dict[str, dict[str, WindowEntry]] = {}
        replicas: dict[str, dict[str, int]] = {}
        every = await window_sums(self.api, self.scope, at, self.windows, fleet.lookback_seconds)
        for name, sums in every.items():
            out.queries += sums.queries
            out.restarted_replicas = max(out.restarted_replicas, sums.restarted_replicas)
            out.unknown |= sums.unknown
            checked: dict[str, WindowStats] = {}
            bundles: dict[str, set[str]] = {}
            for (_, version, bundle), items in sums.stats.items():
                if bundle == self.bundle_label:  # every window of this bundle is checked, estimated or not
                    where = f"model {self.model} version {version}, window {name}"
                    checked[version] = self.scope.schema.window(
                        items, sums.scale.get((self.model, version, bundle), 0.0), where
                    )
                if items.get("n", 0) >= 0.5:
                    bundles.setdefault(version, set()).add(bundle)
            for version, seen in bundles.items():
                if len(seen) > 1:
                    out.mismatches.add((version, "mixed"))
                elif seen != {self.bundle_label}:
                    out.mismatches.add((version, "other_bundle"))
                else:
                    per_version.setdefault(version, {})[name] = self._entry(name, checked[version])
                    replicas.setdefault(version, {})[name] = sums.replicas.get(
                        (self.model, version, self.bundle_label), 0
                    )
        for version, reason in sorted(out.mismatches):
            log.error(
                "fleet: model %s version %s: %s; no estimate for it",
                self.model,
                version,
                "replicas report statistics of several bundles (a mixed estimate would mean nothing)"
                if reason == "mixed"
                else f"replicas serve another bundle than this evaluator's ({self.bundle_label})",
            )
        bad = {v for v, _ in out.mismatches}
        for version, wins in per_version.items():
            if version not in bad:
                out.versions[version] = VersionWindows(wins, replicas.get(version, {}))
        for companion in self.companions:
            part = await companion.evaluate(self.api, at, self.windows, fleet.lookback_seconds)
            out.parts.append(part)
            out.queries += part.queries
        out.seconds = time.perf_counter() - t0
        return out

    def _entry(self, name: str, stats: WindowStats) -> WindowEntry:
        """Window ``name`` of the summed ``stats`` estimated as an agent estimates its own; the
        per-class figures where the replicas export per-class sums (up to their class cap)."""
        return window_entry(
            name, stats, self.calibration, self.headline, self.classes, per_class_cap=self.per_class_cap
        )

    def _labels_failed(self, reason: str, message: str) -> None:
        with self._lock:
            self.label_errors[reason] += 1
            self.labels_error = f"{reason}: {printable(message, 500)}"
        log.warning("fleet: reading the labels failed (%s); label-free estimates only: %s", reason, message)

    def refresh(self) -> bool:
        """Evaluate now; on any failure keep the last result and count the failure under its reason.
        True on success."""
        now = self.clock()
        self.last_attempt = now
        try:
            result = self.evaluate(now)
        except RefreshError as exc:
            self._failed(exc.reason, str(exc))
            log.warning("fleet: refresh failed (%s), keeping the last estimates: %s", exc.reason, printable(exc, 500))
            return False
        except Exception as exc:  # a bug: counted like any failure, the loop goes on
            self._failed("internal", f"{type(exc).__name__}: {exc}")
            log.exception("fleet: refresh raised, keeping the last estimates")
            return False
        if result.unknown:
            names = ", ".join(sorted({stat for _, stat in result.unknown})[:UNKNOWN_NAMES_KEPT])
            log.warning(
                "fleet: %d series of statistics this bundle does not define were ignored (%s%s)",
                len(result.unknown),
                names,
                ", ..." if len({stat for _, stat in result.unknown}) > UNKNOWN_NAMES_KEPT else "",
            )
        with self._lock:
            self.result = result
            self.unknown_stats_total += len(result.unknown)
            self.last_error = None
            self.last_error_reason = None
        return True

    def _failed(self, reason: Reason, message: str) -> None:
        with self._lock:
            self.errors[reason] = self.errors.get(reason, 0) + 1
            self.last_error = f"{reason}: {printable(message, 500)}"
            self.last_error_reason = reason

    # -- what is served ------------------------------------------------------------------------
    def stale(self, now: float | None = None) -> bool:
        r = self.result
        now = self.clock() if now is None else now
        return r is None or now - r.at > self.settings.fleet.stale_seconds

    def version_of(self, asked: str | None) -> str | None:
        r = self.result
        if r is None:
            return None
        if asked is not None:
            return asked if asked in r.versions else None
        if self.settings.model.version in r.versions:
            return self.settings.model.version
        return min(r.versions) if r.versions else None

    def estimates(self, version: str | None = None) -> dict[str, Any]:
        """``/v1/estimates``: an agent's answer for one version (``version``, else the configured one,
        else the first seen), plus the fleet's own fields and every version under ``versions``."""
        now = self.clock()
        r = self.result
        v = self.version_of(version)
        windows = self._windows_json(r.versions[v]) if r is not None and v is not None else {}
        return {
            "model": {"name": self.model, "version": v or version or self.settings.model.version},
            **BundleSection(self.headline, self.calibration).to_json(),
            "windows": windows,
            "timestamp": r.at if r is not None else None,
            "fleet": {
                "bundle": self.bundle_label,
                "stale": self.stale(now),
                "age_seconds": (now - r.at) if r is not None else None,
                "last_error": self.last_error,
                "last_error_reason": self.last_error_reason,
                "query_errors_total": self.errors_total,
                "query_errors": {k: v for k, v in self.errors.items() if v},
                "unknown_stats_total": self.unknown_stats_total,
                "mismatches": [{"version": mv, "reason": why} for mv, why in sorted(r.mismatches)] if r else [],
                "labels": self._labels_json(),
            },
            "versions": {name: self._windows_json(vw) for name, vw in r.versions.items()} if r is not None else {},
            **self._companion_sections(r, v or version or self.settings.model.version),
        }

    def _part(self, index: int) -> FleetPart | None:
        """The part of companion ``index`` in the last successful refresh (None before one)."""
        r = self.result
        return r.parts[index] if r is not None else None

    def _companion_sections(self, r: FleetResult | None, version: str) -> dict[str, Any]:
        """Every companion's sections of a version, from the refresh ``r`` (None before one)."""
        out: dict[str, Any] = {}
        for i, companion in enumerate(self.companions):
            out.update(companion.sections(r.parts[i] if r is not None else None, version))
        return out

    def companion_collectors(self) -> list[Collector]:
        """Every companion's collectors, each reading its part of the last successful refresh."""
        return [col for i, c in enumerate(self.companions) for col in c.collectors(functools.partial(self._part, i))]

    def _windows_json(self, vw: VersionWindows) -> dict[str, Any]:
        """The windows as an agent reports them (:meth:`~agent.results.window.WindowEntry.to_json`),
        each with its replicas and, from the store's labels, its ``realized`` section."""
        return {name: entry.to_json(self.calibration, vw.sections(name)) for name, entry in vw.windows.items()}

    def _labels_json(self) -> dict[str, Any]:
        """The state of the store's labels: whether they are read, how many, and the last failure."""
        return {
            "enabled": self.labels is not None,
            "version": self.settings.model.version if self.labels is not None else None,
            "read": self.labels_read,
            "truncated_windows": list(self.labels_truncated),
            "last_error": self.labels_error,
            "errors": {k: v for k, v in self.label_errors.items() if v},
        }

    def snapshot(self) -> FleetSnapshot:
        r = self.result
        versions = []
        if r is not None:
            for version, vw in r.versions.items():
                points = snapshot_points(vw.windows.values())
                samples = {w.window: w.n for w in points.windows}
                classes = {w.window: w.classes for w in points.windows if w.classes is not None}
                flags = {
                    w.window: (w.flagged, w.flag_reason or "none") for w in points.windows if w.flagged is not None
                }
                versions.append(
                    FleetVersion(
                        version,
                        points.estimates,
                        samples,
                        dict(vw.replicas),
                        points.headline,
                        classes,
                        flags,
                        points.segments,
                    )
                )
        return FleetSnapshot(
            model=self.model,
            versions=versions,
            mismatches=sorted(r.mismatches) if r is not None else [],
            last_success=r.at if r is not None else None,
            refresh_seconds=r.seconds if r is not None else None,
            errors=dict(self.errors),
            stale=self.stale(),
            restarted_replicas=r.restarted_replicas if r is not None else 0,
            unknown_stats_total=self.unknown_stats_total,
            label_errors=dict(self.label_errors) if self.labels is not None else {},
        )


def _release_frames(exc: BaseException) -> None:
    """Drop the local variables of the finished frames behind ``exc`` (and the exceptions chained to
    it): an exception out of :func:`asyncio.run` is in a cycle with its task (the runner's frame holds
    the task, the task the exception), so the answer a refused query had parsed (tens of MB) would
    otherwise stay until a full garbage collection, and the next refresh would parse beside it."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 16:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]
