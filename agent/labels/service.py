"""Delayed labels: true classes for earlier predictions, realized accuracy, estimator errors, recalibration.

Every judged prediction has an id ``<request id>:<index>`` (V2 answers carry the request id and, in
the parameter ``icos_prediction_count``, the number of predictions; ``/v1/observe`` answers the
``id`` and the ``accepted`` count). The pipeline hands
judged requests to a :class:`~agent.labels.store.PredictionStore` (bounded, written off the
request path). Later, true labels arrive by id:

* ``POST /v1/labels`` ``{"labels": [{"id": "<request id>:<i>", "label": 3 | "cat"}, ...]}`` →
  ``{"accepted": n, "unknown": n, "duplicate": n, "invalid": n, "problems": [...]}``. A label is a
  class index or a class name. Unknown ids (never seen, evicted, or from a request not judged yet),
  ids already labeled (the first label stays) and invalid entries are counted, never fatal; at most
  ``labels.max_batch`` labels per request.
* ``GET /v1/labels`` — the store (size, labeled, queued), the calibration in use, the last
  recalibration.
* ``GET /v1/labels/requests?limit=N`` — the labeling sample: every judged prediction is drawn into it
  independently with probability ``labels.sample_rate`` (from the agent's own random source, so no
  client can choose what is sampled); this lists the newest sampled predictions still without a label
  (``{"sample_rate", "n", "requests": [{"id", "timestamp"}]}``). Their labels, posted as any other,
  give every time window the estimator ``with_labels`` (prediction-powered inference,
  :func:`~agent.labels.realized.with_labels_estimates`): valid whatever the shift because the sample is
  uniform. Labels of predictions outside the sample count for the realized accuracy and
  recalibration, not for ``with_labels``.
* ``POST /v1/recalibrate`` (admin bearer token) — refits the estimator calibration (oracle TPR/FPR,
  calibration accuracy and mean confidence, ATC threshold; the ``shift_aware`` part stays the
  bundle's) from every stored labeled prediction of the current model and bundle, at least
  ``labels.min_recalibration_samples`` of them with right and wrong ones among them (else 409), swaps
  it into the runtime atomically, keeps it in the store (restored at restart for the same model and
  bundle; a reload of the model or bundle discards it) and answers with the values before and after.
  ``labels.auto_recalibrate_every`` (a label count) triggers the same automatically.

Labeled predictions feed :class:`~agent.labels.realized.RealizedWindows` by their prediction time; each
window of ``GET /v1/estimates`` gains a ``realized`` section and Prometheus the realized metrics of
:mod:`exporters.label_metrics`.

With a shared store (PostgreSQL, ``labels.store_url``) a label posted to any replica joins the
prediction whichever replica served it, recalibration reads every replica's labels, and each replica
re-reads the labeled predictions every ``labels.fleet_refresh_seconds``: its realized windows, and so
its ``icos_realized_*`` metrics, are the fleet's (any replica's value is the fleet's value).

In ``labels.durability: commit`` the agent answers a request only once its predictions are committed
(:meth:`LabelService.acknowledge`, a gate of the host); when they cannot be (the store failing, or
PostgreSQL unreachable) within ``labels.commit_timeout_seconds`` the request is refused with 503
:class:`PredictionNotStored` — its predictions were not acknowledged, the client retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import anyio.to_thread
from prometheus_client import CollectorRegistry

from agent.config.settings import AgentSettings
from agent.errors import ClientError
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.intervals import Estimate
from agent.estimation.statistics import WindowStats
from agent.judging.runtime import Runtime
from agent.labels.realized import RealizedWindow, RealizedWindows, realized_window, with_labels_estimates
from agent.labels.rows import LabeledRows
from agent.labels.store import PredictionStore, StoreUnavailable
from agent.protocol.v2 import MAX_REQUEST_ID_BYTES
from exporters.label_metrics import LABEL_OUTCOMES, LabelMetrics, RealizedCollector, RealizedPoint, RealizedSnapshot

log = logging.getLogger("icos_agent.labels")

#: The longest prediction id a label may name: a request id (bounded by the decoders) and an index.
MAX_ID_LENGTH = MAX_REQUEST_ID_BYTES + 21
MAX_PROBLEMS = 20
#: Fields of :class:`EstimatorCalibration` refitted from labels (``shift`` stays the bundle's).
REFITTED_FIELDS = ("tpr", "fpr", "n_wrong", "n_right", "accuracy", "avg_conf", "atc_threshold")


class RecalibrationRefused(ClientError):
    """Recalibration is not possible now (too few labels, or only right / only wrong predictions)."""

    status = 409
    reason = "recalibration_refused"


class PredictionNotStored(ClientError):
    """``commit`` durability: the request's predictions could not be committed, so it is not acknowledged."""

    status = 503
    reason = "prediction_store_unavailable"
    headers = {"Retry-After": "1"}


class RuntimeSwap(Protocol):
    """The agent's runtime holder as the label service sees it (:class:`agent.dataplane.runtimes.RuntimeHolder`)."""

    current: Runtime

    def swap(self, new: Runtime) -> None:
        """Serve ``new`` from now on (atomically)."""


def resolve_label(value: object, classes: list[str]) -> int | None:
    """A class index from a label given as an index (``3``) or a class name (``"cat"``, ``"3"``)."""
    k = len(classes)
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return value if 0 <= value < k else None
    if isinstance(value, str):
        if value in classes:
            return classes.index(value)
        text = value.strip()
        if text.isdigit() and int(text) < k:
            return int(text)
    return None


@dataclass
class ParsedLabels:
    labels: list[tuple[str, int]]
    invalid: int
    duplicate_in_request: list[str]
    problems: list[dict[str, Any]]


def parse_labels(obj: object, classes: list[str], max_batch: int) -> ParsedLabels:
    """Validate a ``POST /v1/labels`` body; raises ``ValueError`` for a body that is not a label list."""
    if not isinstance(obj, dict) or not isinstance(obj.get("labels"), list):
        raise ValueError('the body must be a JSON object {"labels": [{"id": "...", "label": ...}, ...]}')
    entries = obj["labels"]
    if len(entries) > max_batch:
        raise OverflowError(f"{len(entries)} labels in one request; the limit is {max_batch} (labels.max_batch)")
    seen: set[str] = set()
    out = ParsedLabels([], 0, [], [])

    def problem(i: int, pid: object, error: str) -> None:
        if len(out.problems) < MAX_PROBLEMS:
            out.problems.append({"index": i, "id": pid if isinstance(pid, str) else None, "error": error})

    for i, e in enumerate(entries):
        pid = e.get("id") if isinstance(e, dict) else None
        if not isinstance(e, dict) or not isinstance(pid, str) or not pid or len(pid) > MAX_ID_LENGTH:
            out.invalid += 1
            # the id is echoed in the answer's problems only when it has a prediction id's size
            problem(
                i,
                pid if isinstance(pid, str) and len(pid) <= MAX_ID_LENGTH else None,
                f"needs an 'id': a prediction id string of 1 to {MAX_ID_LENGTH} characters",
            )
            continue
        label = resolve_label(e.get("label"), classes)
        if label is None:
            out.invalid += 1
            problem(
                i, pid, f"'label' {e.get('label')!r} is neither a class index 0..{len(classes) - 1} nor a class name"
            )
            continue
        if pid in seen:
            out.duplicate_in_request.append(pid)
            problem(i, pid, "duplicate: this id appears earlier in the request")
            continue
        seen.add(pid)
        out.labels.append((pid, label))
    return out


def _base(cal: EstimatorCalibration) -> dict[str, Any]:
    return {k: getattr(cal, k) for k in REFITTED_FIELDS}


class LabelService:
    """The prediction store, the realized windows and the recalibration of one agent (served on
    ``/v1/labels`` and ``/v1/recalibrate`` by :mod:`agent.server.labels_routes`)."""

    def __init__(
        self,
        settings: AgentSettings,
        registry: CollectorRegistry,
        metrics: LabelMetrics,
        store: PredictionStore,
        runtimes: RuntimeSwap,
        run_in_thread: Callable[..., Awaitable[Any]],
        flush_judged: Callable[[], None],
    ) -> None:
        config = settings.labels
        self.config = config
        self.settings = settings
        self.runtimes = runtimes
        self.run = run_in_thread
        #: Records what waits in the judge queue, so that a label finds a prediction answered a moment ago.
        self.flush_judged = flush_judged
        self.metrics = metrics
        registry.register(RealizedCollector(self.snapshot))
        self.store = store
        self._fleet_read = 0.0  # monotonic time the realized windows last re-read a shared store
        self.metrics.store_reachable.set_function(lambda: 0.0 if self.store.unreachable else 1.0)
        s = settings
        self.realized = RealizedWindows(s.window_seconds, s.windows.count, capacity=config.max_predictions)
        self._identity = runtimes.current.identity
        self._recalibrated: Runtime | None = None
        self._recal_lock = asyncio.Lock()
        self._since_recalibration = 0
        self.last_recalibration: dict[str, Any] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    @property
    def started(self) -> bool:
        """Whether the service runs (``labels.enabled`` and started with the agent)."""
        return self._started

    def _open(self) -> None:
        self.store.open()
        rt = self.runtimes.current
        self.realized.reset(self._labeled(rt.identity))
        saved = self._saved_calibration(rt)
        if saved is not None:
            self._install(rt, saved)
            log.info("restored the calibration refitted from labels", extra={"identity": rt.identity})
        self._fleet_read = time.monotonic()
        self._set_store_metrics()

    def _set_store_metrics(self) -> None:
        self.metrics.set_store(self.store.rows, self.store.labeled)

    def _labeled(self, identity: str) -> LabeledRows:
        try:
            return self.store.labeled_rows(identity, limit=self.config.max_predictions)
        except StoreUnavailable:
            return LabeledRows.empty()

    def _saved_calibration(self, rt: Runtime) -> EstimatorCalibration | None:
        try:
            text = self.store.get_calibration(rt.identity)
            if text is None:
                return None
            d = json.loads(text)["calibration"]
            return EstimatorCalibration.from_dict(d).with_shift(rt.calibration.shift)
        except Exception as exc:  # a damaged record only costs the refit
            self.metrics.store_errors.labels("read").inc()
            log.warning("ignoring a saved calibration that cannot be read", extra={"error": str(exc)})
            return None

    async def start(self, _app: object = None) -> None:
        if not self.config.enabled:
            return
        await self.run(self._open)
        self.store.start()
        self._tasks.append(asyncio.create_task(self._watch_loop()))
        self._started = True

    async def stop(self, _app: object = None) -> None:
        if not self._started:
            return
        self._started = False
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        await anyio.to_thread.run_sync(self.check_runtime)
        await anyio.to_thread.run_sync(self.store.stop)

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.run(self.check_runtime)
                if self.store.shared and time.monotonic() - self._fleet_read >= self.config.fleet_refresh_seconds:
                    await self.run(self.read_fleet_labels)
                self._set_store_metrics()
            except Exception:
                log.exception("label bookkeeping failed")

    async def acknowledge(self, request_id: str) -> None:
        """``commit`` durability: return once the predictions of ``request_id`` are committed; raise
        :class:`PredictionNotStored` (503) when they cannot be within ``labels.commit_timeout_seconds``."""
        if not await self.store.committed(request_id, self.config.commit_timeout_seconds):
            why = "unreachable" if self.store.unreachable else "not committed in time or dropped"
            raise PredictionNotStored(
                f"the prediction store is {why}; in labels.durability: commit a request is answered only "
                "after its predictions are stored: retry"
            )

    def read_fleet_labels(self) -> None:
        """Refill the realized windows from the shared store: the labels every replica received."""
        self._fleet_read = time.monotonic()
        try:
            rows = self._window_rows(self._identity)
        except StoreUnavailable as exc:
            log.warning("re-reading the fleet's labels failed; realized windows wait", extra={"error": str(exc)})
            return
        self.realized.reset(rows)

    def _window_rows(self, identity: str) -> LabeledRows:
        """The labeled predictions the realized windows can hold, and no more: those of the longest time
        window, or the newest ``windows.count`` when these are more (each at most ``max_predictions``)."""
        cap = self.config.max_predictions
        longest = max(self.realized.time.values(), default=None)
        count = self.realized.count or 0
        if longest is not None:
            rows = self.store.labeled_rows(identity, since=time.time() - longest, limit=cap)
            if rows.n >= min(count, cap):
                return rows  # the newest `count` are among them
        return self.store.labeled_rows(identity, limit=min(count, cap) if count else cap)

    def check_runtime(self) -> None:
        """Follow reloads: realized windows restart for a new model or bundle; a refitted calibration
        is discarded (and forgotten) once a reload has replaced the runtime carrying it."""
        rt = self.runtimes.current
        if rt.identity != self._identity:
            self._identity = rt.identity
            self.realized.reset(self._labeled(rt.identity))
        done = self._recalibrated
        if done is not None and rt is not done:
            self._recalibrated = None
            with contextlib.suppress(StoreUnavailable, Exception):
                self.store.delete_calibration(done.identity)
            log.info("reload: the calibration refitted from labels is discarded")

    # -- labels -------------------------------------------------------------------------------------
    def post_labels(self, body: bytes) -> dict[str, Any]:
        """Apply a ``POST /v1/labels`` body (runs in a worker thread); raises :class:`ClientError` for a
        body that is not a label list, :class:`StoreUnavailable` when the store cannot be written."""
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ClientError("labels body is not valid JSON", status=400, reason="malformed_json") from None
        except RecursionError:
            raise ClientError("labels body is nested too deeply", status=400, reason="malformed_json") from None
        rt = self.runtimes.current
        try:
            parsed = parse_labels(obj, rt.classes, self.config.max_batch)
        except OverflowError as exc:
            raise ClientError(str(exc), status=413, reason="too_large") from None
        except ValueError as exc:
            raise ClientError(str(exc), status=400, reason="malformed_json") from None
        self.check_runtime()
        self.flush_judged()  # predictions judged off the request path are judged now
        self.store.flush()  # and written, so that a label right after its prediction finds it
        outcome = self.store.apply_labels(parsed.labels, time.time())
        for identity, rows in outcome.accepted:
            if identity == self._identity:
                self.realized.add(rows)
        counts = {
            "accepted": outcome.n_accepted,
            "unknown": len(outcome.unknown),
            "duplicate": len(outcome.duplicate) + len(parsed.duplicate_in_request),
            "invalid": parsed.invalid,
        }
        self.metrics.count_labels(counts)
        self._set_store_metrics()
        problems = list(parsed.problems)
        for kind, ids in (("unknown", outcome.unknown), ("duplicate", outcome.duplicate)):
            for pid in ids[: max(0, MAX_PROBLEMS - len(problems))]:
                text = "no stored prediction has this id" if kind == "unknown" else "already labeled"
                problems.append({"id": pid, "error": f"{kind}: {text}"})
        return {**counts, "problems": problems}

    # -- recalibration ------------------------------------------------------------------------------
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
        new = EstimatorCalibration.fit(rows.confidence, rows.correct, rows.verdict != 0).with_shift(old.shift)
        before, after = realized_window(rows, old), realized_window(rows, new)
        assert before is not None and after is not None
        report = {
            "samples": n,
            "before": _base(old),
            "after": _base(new),
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
        record = {"calibration": _base(calibration), "samples": report["samples"], "created": time.time()}
        try:
            self.store.put_calibration(identity, json.dumps(record))
            return True
        except Exception as exc:
            self.metrics.store_errors.labels("write").inc()
            log.warning("the refitted calibration could not be saved", extra={"error": str(exc)})
            return False

    async def recalibrate(self, trigger: str) -> dict[str, Any]:
        """Refit, swap and persist; raises :class:`RecalibrationRefused`."""
        async with self._recal_lock:
            await self.run(self.check_runtime)
            rt = self.runtimes.current
            try:
                new_cal, report = await self.run(self.refit, rt)
            except RecalibrationRefused:
                self.metrics.recalibrations.labels(trigger, "refused").inc()
                raise
            if self.runtimes.current is not rt:
                self.metrics.recalibrations.labels(trigger, "refused").inc()
                raise RecalibrationRefused("the model was reloaded during recalibration; try again")
            self._install(rt, new_cal)
            self._since_recalibration = 0
            report["persisted"] = await self.run(self._persist, rt.identity, new_cal, report)
            report.update({"recalibrated": True, "trigger": trigger, "timestamp": time.time()})
            self.last_recalibration = report
            self.metrics.recalibrations.labels(trigger, "applied").inc()
            log.info(
                "recalibrated from labels",
                extra={"trigger": trigger, "samples": report["samples"], "tpr": new_cal.tpr, "fpr": new_cal.fpr},
            )
            return report

    async def _auto_recalibrate(self) -> None:
        try:
            await self.recalibrate("auto")
        except RecalibrationRefused as exc:
            log.info("automatic recalibration refused", extra={"reason": str(exc)})
        except Exception:
            log.exception("automatic recalibration failed")

    async def accept(self, body: bytes) -> dict[str, Any]:
        """``POST /v1/labels``: apply ``body`` in a worker thread (see :meth:`post_labels`); every
        ``labels.auto_recalibrate_every`` accepted labels start a recalibration in the background."""
        result: dict[str, Any] = await self.run(self.post_labels, body)
        every = self.config.auto_recalibrate_every
        self._since_recalibration += int(result["accepted"])
        if every and self._since_recalibration >= every and not self._recal_lock.locked():
            self._since_recalibration = 0
            self._tasks.append(asyncio.create_task(self._auto_recalibrate()))
            self._tasks = [t for t in self._tasks if not t.done()]
        return result

    # -- read side ----------------------------------------------------------------------------------
    def _realized(self, rt: Runtime, now: float) -> dict[str, RealizedWindow | None]:
        """The realized windows of ``rt``, per-class figures included (per class up to the class cap)."""
        cap = self.settings.metrics.per_class_label_cap
        return self.realized.compute(rt.calibration, now, rt.classes, per_class=len(rt.classes) <= cap)

    def estimate_section(self, rt: Runtime, now: float) -> dict[str, dict[str, Any]]:
        """``/v1/estimates``: the ``realized`` section of every window."""
        out: dict[str, dict[str, Any]] = {}
        for name, w in self._realized(rt, now).items():
            out[name] = {"realized": w.to_dict() if w is not None else {"n": 0}}
        return out

    def labeled_estimates(
        self, rt: Runtime, now: float, stats: Mapping[str, WindowStats]
    ) -> dict[str, dict[str, Estimate]]:
        """The estimator ``with_labels`` of every time window (:func:`with_labels_estimates`)."""
        return with_labels_estimates(self._realized(rt, now), stats, self.realized.time)

    def label_requests(self, limit: int) -> dict[str, Any]:
        """``GET /v1/labels/requests``: the newest predictions of the labeling sample without a label."""
        self.check_runtime()
        self.flush_judged()
        self.store.flush()  # a prediction answered a moment ago is listed
        rows = self.store.label_requests(self._identity, limit)
        return {
            "sample_rate": self.config.sample_rate,
            "n": len(rows),
            "requests": [{"id": pid, "timestamp": ts} for pid, ts in rows],
        }

    def snapshot(self) -> RealizedSnapshot | None:
        if not self._started:
            return None
        rt = self.runtimes.current
        points = []
        for name, w in self._realized(rt, time.time()).items():
            if w is None:
                points.append(RealizedPoint(name, 0, 0.0))
            else:
                points.append(
                    RealizedPoint(name, w.n, w.accuracy.value, w.abs_errors, w.probability_errors.to_dict(), w.classes)
                )
        return RealizedSnapshot(rt.name, rt.version, points)

    def describe(self) -> dict[str, Any]:
        rt = self.runtimes.current
        return {
            "enabled": self.config.enabled,
            "store": {
                "backend": "postgresql" if self.store.shared else "sqlite",
                "persistent": self.store.persistent,
                "path": str(self.store.path) if self.store.path else None,
                "location": self.store.location,
                "durability": self.config.durability,
                "reachable": not self.store.unreachable,
                "predictions": self.store.rows,
                "labeled": self.store.labeled,
                "queued": self.store.queued,
                "max_predictions": self.config.max_predictions,
                "max_age": self.config.max_age,
            },
            "calibration": {
                "source": "labels" if self._recalibrated is not None and rt is self._recalibrated else "bundle",
                **_base(rt.calibration),
            },
            "sample_rate": self.config.sample_rate,
            "min_recalibration_samples": self.config.min_recalibration_samples,
            "auto_recalibrate_every": self.config.auto_recalibrate_every,
            "last_recalibration": self.last_recalibration,
        }


__all__ = [
    "LABEL_OUTCOMES",
    "RuntimeSwap",
    "LabelService",
    "PredictionNotStored",
    "RecalibrationRefused",
    "parse_labels",
    "resolve_label",
]
