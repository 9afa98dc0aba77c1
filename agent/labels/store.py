"""A bounded store of judged predictions waiting for their true labels: the queue, the writer thread
and the durability modes, over a backend that holds the tables.

The request pipeline hands every judged request to :meth:`PredictionStore.enqueue`, which only
appends it to a memory-bounded queue (at most ``queue_limit`` predictions; beyond that a batch is
dropped and counted). A background thread writes the queue in one transaction and evicts what is
over the bounds: predictions older than ``max_age_seconds`` and, past ``max_predictions``
predictions, the oldest ones (:mod:`agent.labels.eviction`, one policy for both backends). Two
durability modes (``labels.durability``):

* ``batched`` — the writer commits every ``flush_interval`` seconds. A request is answered before its
  predictions are committed, so an agent killed with SIGKILL loses what was queued: at most one flush
  interval's predictions (plus, with PostgreSQL, what was buffered while it was unreachable). That
  window is the gauge ``icos_prediction_store_queued``.
* ``commit`` — acknowledge after commit: the request waits (:meth:`committed`) until a transaction
  holding its predictions has committed. The writer commits as soon as something is queued and
  everything that arrived during one commit goes into the next (group commit), so one commit serves
  many concurrent requests (:mod:`agent.labels.commit_waits`). A request whose predictions cannot be
  committed within ``commit_timeout`` (the store failing or unreachable) is refused with 503: it was
  not acknowledged.

Backends (:class:`agent.labels.backend.StoreBackend`): SQLite in the state directory
(:mod:`agent.labels.sqlite_backend`, the default) or PostgreSQL shared by replicas
(:mod:`agent.labels.postgres_backend`, ``labels.store_url``). A write the database could not take
because it is unreachable (:class:`StoreUnreachable`) stays queued, counted in ``on_buffered``, and is
retried every ``flush_interval``; past ``queue_limit`` the oldest buffered requests are dropped and
counted (``queue_full``). Other failed writes drop their batch (``write_failed``).

The tables (the same in both backends): one row per *request* (``requests``), so that a batch of 32
predictions costs one insert and, later, one delete: the request id, the prediction time, the
identity of the model and bundle that judged it, the number of classes and, as little-endian arrays
over the request's predictions, the predicted classes (int32), the oracle verdicts (int8, indices
into :data:`invariants.oracle.VERDICTS`), the probability vectors (float32 ``[n, K]``) and the inputs
of the full ``shift_aware`` model when the runtime computed them (``extras``: margin, TDI rule,
agreement, coverage and PCA error of :class:`agent.estimation.statistics.window.SampleExtras`, float64
``[n, 5]``; NULL otherwise) and the indices of the predictions drawn into the labeling sample
(``sampled``, int32; NULL when none was). Prediction ``i`` of a request has the id
``<request id>:<i>``. A row holds the predictions ``start ≤ i < hi`` of its request; those below
``lo`` were evicted. A request id used twice replaces every earlier prediction with that id, and
their labels. Labels live in their own table (``labels``, one row per labeled prediction, keyed by
the request row and the index) with a copy of what the realized windows and recalibration read (and
whether the prediction was in the labeling sample), so reading labeled predictions never decodes
request rows. Evicting a request deletes its labels. ``calibration`` keeps an estimator calibration
refitted from labels, per model identity. ``inputs`` keeps the inputs of sampled predictions when
``labels.keep_sampled_inputs`` is on (:mod:`agent.labels.kept_inputs`), written after their requests
and bounded in bytes.

A label may arrive for a prediction that is still on its way to the store (answered a moment ago):
:meth:`wait_written` waits, bounded, until the requests it names have left the queue, written or
dropped (:mod:`agent.labels.in_flight`), so that the label finds its prediction without anyone
draining the queue.

Predictions not stored are reported to ``on_drop(n, reason)``: ``queue_full``, ``invalid`` (a request
whose id or identity UTF-8 cannot encode or holds a NUL character, or whose arrays disagree: dropped
alone) and ``write_failed``. Failures are reported to ``on_error(operation)``. Inference never depends
on the store in ``batched`` mode. The row and batch types are in :mod:`agent.labels.rows`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from agent.config.settings import LabelsConfig
from agent.core.os_threads import name_os_thread
from agent.labels.backend import StoreBackend, StoreUnavailable, StoreUnreachable
from agent.labels.commit_waits import CommitWaits
from agent.labels.in_flight import InFlight
from agent.labels.kept_inputs import KeptInput, KeptInputsPolicy, KeptMap, kept_inputs
from agent.labels.rows import LabeledRows, LabelOutcome, PendingBatch, batch_problem
from agent.labels.sqlite_backend import STORE_FILE, SQLiteBackend
from agent.labels.sqlite_schema import last_per_request

log = logging.getLogger("icos_agent.labels")

Durability = Literal["batched", "commit"]


def _setting(name: str) -> Any:
    """The default of ``labels.<name>``: stated once, on the setting."""
    return LabelsConfig.model_fields[name].default


__all__ = ["STORE_FILE", "Durability", "PredictionStore", "StoreUnavailable", "StoreUnreachable"]


class PredictionStore:
    """See the module docstring. Thread-safe; ``start()`` runs the background writer."""

    def __init__(
        self,
        directory: str | Path | None,
        *,
        max_predictions: int,
        max_age_seconds: float,
        queue_limit: int = _setting("queue_limit"),
        flush_interval: float = _setting("flush_interval_seconds"),
        durability: Durability = _setting("durability"),
        store_url: str | None = None,
        pool_size: int = _setting("pool_size"),
        on_error: Callable[[str], None] = lambda _op: None,
        on_drop: Callable[[int, str], None] = lambda _n, _reason: None,
        on_buffered: Callable[[int], None] = lambda _n: None,
        kept: KeptInputsPolicy = KeptInputsPolicy(),
        on_inputs_dropped: Callable[[int, str], None] = lambda _n, _reason: None,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.max_predictions = int(max_predictions)
        self.max_age_seconds = float(max_age_seconds)
        self.queue_limit = int(queue_limit)
        self.flush_interval = float(flush_interval)
        self.durability: Durability = durability
        self.on_error = on_error
        self.on_drop = on_drop
        self.on_buffered = on_buffered
        #: whether the inputs of sampled predictions are kept, and their byte bounds
        self.kept = kept
        self.on_inputs_dropped = on_inputs_dropped
        self.backend: StoreBackend
        if store_url:
            from agent.labels.postgres_backend import PostgresBackend  # psycopg only when configured

            self.backend = PostgresBackend(
                store_url,
                max_predictions=self.max_predictions,
                max_age_seconds=self.max_age_seconds,
                pool_size=pool_size,
                on_error=on_error,
            )
        else:
            self.backend = SQLiteBackend(
                self.directory,
                max_predictions=self.max_predictions,
                max_age_seconds=self.max_age_seconds,
                full_sync=durability == "commit",
                on_error=on_error,
            )
        self._queue: deque[PendingBatch] = deque()
        self._queued = 0
        self._queue_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_evict = 0.0
        #: the database could not be reached at the last write; retried after ``_retry_at``
        self.unreachable = False
        self._retry_at = 0.0
        #: commit mode: requests waiting for their commit, and outcomes nobody waited for yet
        self.commits = CommitWaits()
        #: every mode: batches per request id queued or being written, and who waits for them
        self.in_flight = InFlight()

    # -- the backend ---------------------------------------------------------------------------
    def open(self) -> None:
        """Open the backend (SQLite falls back to memory when its file cannot be opened; PostgreSQL
        starts unreachable and connects in the background when it is down)."""
        self.backend.open()

    @property
    def persistent(self) -> bool:
        return self.backend.persistent

    @property
    def shared(self) -> bool:
        """Whether other replicas write the same store (PostgreSQL)."""
        return self.backend.shared

    @property
    def location(self) -> str | None:
        """A path, or the database URL without its password."""
        return self.backend.location

    @property
    def path(self) -> Path | None:
        return self.backend.path if isinstance(self.backend, SQLiteBackend) else None

    def _conn(self) -> object:
        """The SQLite connection (tests damage it on purpose)."""
        assert isinstance(self.backend, SQLiteBackend)
        return self.backend.conn()

    @property
    def rows(self) -> int:
        """Predictions stored (the whole fleet's with a shared store, as last counted)."""
        return self.backend.counts()[0]

    @property
    def labeled(self) -> int:
        return self.backend.counts()[1]

    # -- writing ---------------------------------------------------------------------------------
    def enqueue(self, batch: PendingBatch) -> bool:
        """Queue a judged request for the writer (cheap). ``False`` when the queue is full (dropped)."""
        return self.enqueue_many((batch,))[0]

    def enqueue_many(self, batches: Sequence[PendingBatch]) -> list[bool]:
        """Queue judged requests for the writer in order (a recording call's), each lock taken once for them
        all: the request path records dozens at a time. Per batch, whether it was kept (``False``: the queue
        was full, it is dropped and counted)."""
        self.in_flight.arrived_many([b.request_id for b in batches])
        kept: list[bool] = []
        with self._queue_lock:
            for batch in batches:
                if self._queued + batch.n > self.queue_limit:
                    kept.append(False)
                else:
                    self._queue.append(batch)
                    self._queued += batch.n
                    kept.append(True)
        wake = False
        for batch, ok in zip(batches, kept, strict=True):
            if not ok:
                self.in_flight.left([batch.request_id])
                self.on_drop(batch.n, "queue_full")
                self._settle([batch.request_id], ok=False)
            elif self.durability == "commit" or self.in_flight.awaited(batch.request_id):
                wake = True  # somebody waits for this commit, or for this request to be written
        if wake:
            self._wake.set()
        return kept

    @property
    def queued(self) -> int:
        """Predictions queued or buffered, not yet committed (what a SIGKILL loses in ``batched`` mode)."""
        return self._queued

    def _take(self) -> list[PendingBatch]:
        with self._queue_lock:
            batches = list(self._queue)
            self._queue.clear()
            self._queued = 0
        return batches

    def _put_back(self, batches: list[PendingBatch]) -> None:
        """Return unwritten batches to the front of the queue, dropping the oldest past ``queue_limit``."""
        with self._queue_lock:
            self._queue.extendleft(reversed(batches))
            self._queued += sum(b.n for b in batches)
            dropped: list[PendingBatch] = []
            while self._queued > self.queue_limit and self._queue:
                b = self._queue.popleft()
                self._queued -= b.n
                dropped.append(b)
        if dropped:
            self.on_drop(sum(b.n for b in dropped), "queue_full")
            self.in_flight.left([b.request_id for b in dropped])

    def flush(self, now: float | None = None) -> int:
        """Write everything queued now, then evict; returns the predictions written. A batch that
        cannot be stored (:func:`batch_problem`) is dropped alone; a failed write drops what it held;
        a write to an unreachable database is kept for the next try. All of it is counted, never raised."""
        with self._flush_lock:
            written = self._flush_locked()
            t = time.time() if now is None else now
            due = time.monotonic() - self._last_evict >= self.flush_interval
            if now is not None or self.durability == "batched" or due:
                self._last_evict = time.monotonic()
                try:
                    self.backend.evict(t)
                except StoreUnavailable as exc:
                    log.debug("eviction postponed", extra={"error": str(exc)})
            return written

    def _flush_locked(self) -> int:
        if self.unreachable and time.monotonic() < self._retry_at:
            return 0
        taken = self._take()
        if not taken:
            return 0
        try:
            return self._write(taken)
        finally:
            if not self.unreachable:  # put back when unreachable: still on its way
                self.in_flight.left([b.request_id for b in taken])

    def _write(self, taken: list[PendingBatch]) -> int:
        batches = self._storable(last_per_request(taken))
        if not batches:
            self._settle([b.request_id for b in taken], ok=False)
            return 0
        try:
            written = self.backend.write(batches)
        except StoreUnreachable as exc:
            self._unreachable(taken, exc)
            return 0
        except Exception as exc:  # noqa: BLE001 - whatever failed, the batch is counted, the writer lives
            n = sum(b.n for b in batches)
            self.on_error("write")
            self.on_drop(n, "write_failed")
            log.warning(
                "writing predictions failed; batch dropped",
                extra={"predictions": n, "error": f"{type(exc).__name__}: {exc}"},
            )
            self._settle([b.request_id for b in taken], ok=False)
            return 0
        if self.unreachable:
            self.unreachable = False
            log.warning("the prediction store is reachable again; buffered predictions written")
        kept = {id(b) for b in batches}
        self._settle([b.request_id for b in taken if id(b) in kept or batch_problem(b) is None], ok=True)
        self._settle([b.request_id for b in taken if id(b) not in kept and batch_problem(b) is not None], ok=False)
        if self.kept.enabled:  # after the acknowledgements: a request never waits for its inputs
            self._keep_inputs(batches)
        return written

    def _keep_inputs(self, batches: list[PendingBatch]) -> None:
        """Write the inputs of the sampled predictions of written batches, within the byte bounds
        (counted when not kept); a failure loses only these inputs."""
        rows: list[KeptInput] = []
        too_large = 0
        for b in batches:
            got, over = kept_inputs(
                b.request_id, b.inputs, b.sampled, b.predicted, b.probabilities, self.kept.max_input_bytes
            )
            rows += got
            too_large += over
        if too_large:
            self.on_inputs_dropped(too_large, "too_large")
        if not rows:
            return
        try:
            evicted = self.backend.keep_inputs(rows, self.kept.max_total_bytes)
        except Exception as exc:  # noqa: BLE001 - the predictions are written; their inputs are optional
            self.on_error("write")
            log.warning("keeping sampled inputs failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            return
        if evicted:
            self.on_inputs_dropped(evicted, "evicted")

    def _unreachable(self, taken: list[PendingBatch], exc: Exception) -> None:
        n = sum(b.n for b in taken)
        if not self.unreachable:
            log.warning(
                "the prediction store is unreachable; buffering predictions in memory (labels.queue_limit)",
                extra={"predictions": n, "error": f"{type(exc).__name__}: {exc}"},
            )
        self.unreachable = True
        self._retry_at = time.monotonic() + self.flush_interval
        self.on_error("write")
        self.on_buffered(n)
        self._put_back(taken)
        self.commits.fail_all()

    def _storable(self, batches: list[PendingBatch]) -> list[PendingBatch]:
        """The batches that can be written; the others are counted as ``invalid`` and logged (one line)."""
        bad = [(b, p) for b in batches if (p := batch_problem(b)) is not None]
        if not bad:
            return batches
        n = sum(b.n for b, _ in bad)
        self.on_drop(n, "invalid")
        log.warning(
            "predictions not stored: their request cannot be written",
            extra={"requests": len(bad), "predictions": n, "reason": bad[0][1]},
        )
        skip = {id(b) for b, _ in bad}
        return [b for b in batches if id(b) not in skip]

    def evict(self, now: float) -> int:
        """Delete predictions older than ``max_age_seconds`` and the oldest beyond ``max_predictions``."""
        return self.backend.evict(now)

    # -- acknowledge after commit ----------------------------------------------------------------
    async def committed(self, request_id: str, timeout: float) -> bool:
        """Wait until the predictions of ``request_id`` are committed (``commit`` mode): ``True`` once
        they are, ``False`` when they were dropped, the database is unreachable, or ``timeout`` passed."""
        return await self.commits.wait(request_id, timeout, unreachable=self.unreachable)

    def _settle(self, request_ids: Sequence[str], *, ok: bool) -> None:
        """Tell the requests waiting for these ids whether their commit happened (``commit`` mode)."""
        if self.durability == "commit" and request_ids:
            self.commits.settle(request_ids, ok=ok)

    # -- labels for predictions on their way ------------------------------------------------------
    def holds(self, request_id: str) -> bool:
        """Whether predictions of ``request_id`` are queued or being written now."""
        return self.in_flight.holds(request_id)

    def unwritten_ids(self) -> list[str]:
        """The request ids of every batch queued or being written now."""
        return self.in_flight.ids()

    def write_soon(self) -> None:
        """Have the writer write the queue now rather than at its next flush interval."""
        self._wake.set()

    async def wait_written(
        self, request_ids: Iterable[str], pending_before: Callable[[str], bool], timeout: float
    ) -> None:
        """Return once none of ``request_ids`` is on its way to the store any more (written or dropped),
        or after ``timeout`` (:meth:`InFlight.wait`; ``pending_before``: still before the store)."""
        await self.in_flight.wait(request_ids, pending_before, timeout, self.write_soon)

    # -- background writer -----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="icos-prediction-store", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        name_os_thread("icos-store")
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # never let the writer die
                log.exception("prediction store writer failed")

    def stop(self) -> None:
        """Stop the writer, write what is queued (one last try) and close."""
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout=30)
            self._thread = None
        self._retry_at = 0.0
        self.flush()
        if self._queued:
            log.error(
                "predictions still buffered at shutdown are lost (the store is unreachable)",
                extra={"predictions": self._queued},
            )
            self.on_drop(self._queued, "write_failed")
        self.commits.fail_all()
        self.backend.close()

    # -- labels ----------------------------------------------------------------------------------
    def apply_labels(
        self, labels: Sequence[tuple[str, int]], now: float, source: str = "anonymous", replace: bool = False
    ) -> LabelOutcome:
        """Record true classes for prediction ids (ids must be distinct), each with its ``source`` and
        time. Unknown ids (never seen or evicted) are listed; already labeled ones are ``duplicate``
        (the first label stays) or, with ``replace``, ``corrected`` (the newer label replaces it)."""
        outcome, corrupt = self.backend.apply_labels(labels, now, source, replace)
        if corrupt:
            self.on_error("corrupt")
            log.error(
                "stored predictions are damaged; their labels count as unknown",
                extra={"predictions": len(corrupt), "error": corrupt[0]},
            )
        return outcome

    def drop_labels(self, source: str | None, since: float | None, until: float | None) -> int:
        """Delete the labels of ``source`` (any when None) given in ``[since, until)``; returns how many."""
        return self.backend.drop_labels(source, since, until)

    def labeled_rows(self, identity: str, since: float | None = None, limit: int | None = None) -> LabeledRows:
        """Labeled predictions of one model identity (prediction time ≥ ``since``; the newest ``limit``)."""
        return self.backend.labeled_rows(identity, since, limit)

    def label_requests(self, identity: str, limit: int) -> list[tuple[str, float]]:
        """``(prediction id, time)`` of the newest sampled predictions of ``identity`` still without a label."""
        return self.backend.label_requests(identity, limit)

    def kept_inputs(self, ids: Sequence[str]) -> KeptMap:
        """The kept inputs (with the predicted class and its probability) of these prediction ids."""
        return self.backend.kept_inputs(ids) if ids else {}

    # -- refitted calibrations -------------------------------------------------------------------
    def put_calibration(self, identity: str, value_json: str) -> None:
        self.backend.put_calibration(identity, value_json)

    def get_calibration(self, identity: str) -> str | None:
        return self.backend.get_calibration(identity)

    def delete_calibration(self, identity: str) -> None:
        self.backend.delete_calibration(identity)
