"""Recalibration from delayed labels: the estimator calibration refitted on the stored labeled
predictions and swapped into the runtime.

``POST /v1/recalibrate`` (admin bearer token) refits the estimator calibration (oracle TPR/FPR,
calibration accuracy and mean confidence, ATC threshold; the ``shift_aware`` part stays the bundle's)
from every stored labeled prediction of the current model and bundle, at least
``labels.min_recalibration_samples`` of them with right and wrong ones among them (else 409), swaps it
into the runtime atomically, keeps it in the store (restored at restart for the same model and
bundle; a reload of the model or bundle discards it) and answers with the values before and after.
``labels.auto_recalibrate_every`` (a label count) triggers the same automatically. Each label weighs the
inverse of the probability its prediction was drawn with (:func:`label_weights`), so labels of active or
stratified draws recalibrate without bias toward the predictions those designs favour.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from agent.config.settings import LabelsConfig
from agent.core.tasks import cancel_all
from agent.errors import ClientError
from agent.estimation.calibration import EstimatorCalibration
from agent.judging.runtime import Runtime
from agent.labels.realized import realized_window
from agent.labels.store import PredictionStore, StoreUnavailable
from exporters.label_metrics import LabelMetrics

log = logging.getLogger("icos_agent.labels")

#: Fields of :class:`EstimatorCalibration` refitted from labels (``shift`` and ``flag`` stay the bundle's).
REFITTED_FIELDS = ("tpr", "fpr", "n_wrong", "n_right", "accuracy", "avg_conf", "atc_threshold")


def label_weights(draw_probability: np.ndarray | None) -> np.ndarray | None:
    """Each labeled prediction's weight in a refit: the inverse of the probability it was drawn into the
    labeling sample with, so that labels of active or stratified draws refit the traffic's calibration
    rather than the one of the predictions the design favoured. A label without a known probability
    (outside the sample, or stored before probabilities were kept) counts as a uniform draw at the mean
    probability of those known; None (unweighted) when no probability is known or all are equal."""
    if draw_probability is None:
        return None
    p = np.asarray(draw_probability, dtype=np.float64).reshape(-1)
    known = np.isfinite(p) & (p > 0)
    if not bool(known.any()):
        return None
    p = np.where(known, p, float(p[known].mean()))
    return None if float(np.ptp(p)) == 0.0 else 1.0 / p


class RecalibrationRefused(ClientError):
    """Recalibration is not possible now (too few labels, or only right / only wrong predictions)."""

    status = 409
    reason = "recalibration_refused"


class RuntimeSwap(Protocol):
    """The agent's runtime holder as recalibration sees it (:class:`agent.dataplane.runtimes.RuntimeHolder`)."""

    @property
    def current(self) -> Runtime:
        """The runtime requests are served with now."""

    def swap(self, new: Runtime) -> None:
        """Serve ``new`` from now on (atomically)."""


def calibration_fields(cal: EstimatorCalibration) -> dict[str, Any]:
    """The refitted fields of a calibration, as reports show them."""
    return {k: getattr(cal, k) for k in REFITTED_FIELDS}


class Recalibrator:
    """Refits, installs, persists and restores the calibration refitted from labels."""

    def __init__(
        self,
        config: LabelsConfig,
        store: PredictionStore,
        runtimes: RuntimeSwap,
        metrics: LabelMetrics,
        run_in_thread: Callable[..., Awaitable[Any]],
    ) -> None:
        self.config = config
        self.store = store
        self.runtimes = runtimes
        self.metrics = metrics
        self.run = run_in_thread
        self._recalibrated: Runtime | None = None
        self._lock = asyncio.Lock()
        self._since = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.last: dict[str, Any] | None = None

    @property
    def source(self) -> str:
        """Where the calibration in use comes from: ``labels`` (refitted) or ``bundle``."""
        done = self._recalibrated
        return "labels" if done is not None and self.runtimes.current is done else "bundle"

    def restore(self) -> None:
        """At start: install the calibration saved for the current model and bundle, if any."""
        rt = self.runtimes.current
        saved = self._saved(rt)
        if saved is not None:
            self._install(rt, saved)
            log.info("restored the calibration refitted from labels", extra={"identity": rt.identity})

    def follow(self, rt: Runtime) -> None:
        """A refitted calibration is discarded (and forgotten) once a reload replaced its runtime."""
        done = self._recalibrated
        if done is not None and rt is not done:
            self._recalibrated = None
            with contextlib.suppress(StoreUnavailable, Exception):
                self.store.delete_calibration(done.identity)
            log.info("reload: the calibration refitted from labels is discarded")

    def _saved(self, rt: Runtime) -> EstimatorCalibration | None:
        try:
            text = self.store.get_calibration(rt.identity)
            if text is None:
                return None
            d = json.loads(text)["calibration"]
            return (
                EstimatorCalibration.from_dict(d)
                .with_shift(rt.calibration.shift)
                .with_flag(rt.calibration.flag)
                .with_segments(rt.calibration.segments)
            )
        except Exception as exc:  # a damaged record only costs the refit
            self.metrics.store_errors.labels("read").inc()
            log.warning("ignoring a saved calibration that cannot be read", extra={"error": str(exc)})
            return None

    def refit(self, rt: Runtime) -> tuple[EstimatorCalibration, dict[str, Any]]:
        """The calibration refitted from the stored labels of ``rt``'s model and bundle, and a report."""
        self.store.flush()
        rows = self.store.labeled_rows(rt.identity)
        n, need = rows.n, self.config.min_recalibration_samples
        if n < need:
            raise RecalibrationRefused(
                f"recalibration needs at least {need} labeled predictions of this model and bundle "
                f"(labels.min_recalibration_samples); {n} are stored"
            )
        right = int(rows.correct.sum())
        if right == 0 or right == n:
            which = "right" if right == 0 else "wrong"
            raise RecalibrationRefused(
                f"the {n} labeled predictions hold no {which} prediction: the oracle's TPR and FPR need both"
            )
        old = rt.calibration
        weights = label_weights(rows.draw_probability)
        fitted = EstimatorCalibration.fit(rows.confidence, rows.correct, rows.verdict != 0, weights)
        new = fitted.with_shift(old.shift).with_flag(old.flag).with_segments(old.segments)  # the bundle's
        before, after = realized_window(rows, old), realized_window(rows, new)
        assert before is not None and after is not None
        report = {
            "samples": n,
            "weighted": weights is not None,
            "before": calibration_fields(old),
            "after": calibration_fields(new),
            "labeled": {
                "accuracy": before.accuracy.value,
                "estimates_before": {k: e.value for k, e in before.estimates.items()},
                "estimates_after": {k: e.value for k, e in after.estimates.items()},
                "abs_error_before": before.abs_errors,
                "abs_error_after": after.abs_errors,
                "note": "after-values are in-sample: the calibration was fitted on these labeled predictions",
            },
        }
        return new, report

    def _install(self, rt: Runtime, calibration: EstimatorCalibration) -> Runtime:
        new = replace(rt, calibration=calibration)
        self.runtimes.swap(new)  # requests in flight keep the runtime they started with
        self._recalibrated = new
        return new

    def _persist(self, identity: str, calibration: EstimatorCalibration, report: dict[str, Any]) -> bool:
        record = {"calibration": calibration_fields(calibration), "samples": report["samples"], "created": time.time()}
        try:
            self.store.put_calibration(identity, json.dumps(record))
            return True
        except Exception as exc:
            self.metrics.store_errors.labels("write").inc()
            log.warning("the refitted calibration could not be saved", extra={"error": str(exc)})
            return False

    async def recalibrate(self, trigger: str) -> dict[str, Any]:
        """Refit, swap and persist; raises :class:`RecalibrationRefused`."""
        async with self._lock:
            rt = self.runtimes.current
            await self.run(self.follow, rt)
            try:
                new_cal, report = await self.run(self.refit, rt)
            except RecalibrationRefused:
                self.metrics.recalibrations.labels(trigger, "refused").inc()
                raise
            if self.runtimes.current is not rt:
                self.metrics.recalibrations.labels(trigger, "refused").inc()
                raise RecalibrationRefused("the model was reloaded during recalibration; try again")
            self._install(rt, new_cal)
            self._since = 0
            report["persisted"] = await self.run(self._persist, rt.identity, new_cal, report)
            report.update({"recalibrated": True, "trigger": trigger, "timestamp": time.time()})
            self.last = report
            self.metrics.recalibrations.labels(trigger, "applied").inc()
            log.info(
                "recalibrated from labels",
                extra={"trigger": trigger, "samples": report["samples"], "tpr": new_cal.tpr, "fpr": new_cal.fpr},
            )
            return report

    def labels_accepted(self, n: int) -> None:
        """Count accepted labels (from any thread's call on the loop); every
        ``labels.auto_recalibrate_every`` of them start a recalibration in the background."""
        every = self.config.auto_recalibrate_every
        self._since += n
        if every and self._since >= every and not self._lock.locked():
            self._since = 0
            task = asyncio.get_running_loop().create_task(self._auto())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _auto(self) -> None:
        try:
            await self.recalibrate("auto")
        except RecalibrationRefused as exc:
            log.info("automatic recalibration refused", extra={"reason": str(exc)})
        except Exception:
            log.exception("automatic recalibration failed")

    async def stop(self) -> None:
        await cancel_all(self._tasks)
