"""A bounded store of judged predictions waiting for their true labels (SQLite, WAL).

The request pipeline hands every judged request to :meth:`PredictionStore.enqueue`, which only
appends it to a memory-bounded queue (at most ``queue_limit`` predictions; beyond that a batch is
dropped and counted). A background thread writes the queue every ``flush_interval`` seconds in one
transaction and evicts what is over the bounds: predictions older than ``max_age_seconds`` and, past
``max_predictions`` predictions, the oldest ones.

One row per *request* (table ``requests``), so that a batch of 32 predictions costs one insert and,
later, one delete: the request id, the prediction time, the identity of the model and bundle that
judged it, the number of classes and, as little-endian arrays over the request's predictions, the
predicted classes (int32), the oracle verdicts (int8, indices into
:data:`invariants.oracle.VERDICTS`), the probability vectors (float32 ``[n, K]``) and the inputs of
the full ``shift_aware`` model when the runtime computed them (``extras``: margin, TDI rule,
agreement, coverage and PCA error of :class:`agent.estimation.statistics.SampleExtras`, float64 ``[n, 5]``;
NULL otherwise). Prediction ``i`` of a request has the id ``<request id>:<i>``. A row holds the
predictions ``start ≤ i < hi`` of its request; those below ``lo`` were evicted (eviction by count
keeps exactly the newest ``max_predictions`` predictions, also inside a request). A request id used
twice replaces every earlier prediction with that id, and their labels.

Labels live in their own table (``labels``, one row per labeled prediction, keyed by the request
row and the index): the true class, the label's arrival time, the prediction's absolute and squared
error sums over the classes against the one-hot truth, and a copy of what the realized windows and
recalibration read (prediction time, verdict, confidence, correctness, K, predicted class, extras), so
reading labeled predictions never decodes request rows. Evicting a request deletes its labels. The table
``calibration`` keeps an estimator calibration refitted from labels, per model identity.

A file written by earlier versions (one row per prediction in a table ``predictions``, with or
without its ``extras`` column) is converted when opened, labels included, in one transaction.

The file is ``<state_dir>/predictions.sqlite3``. Without a state directory, or when the file cannot
be opened, the store lives in memory (same bounds, lost at restart) and the failure is reported to
``on_error("open")``; a damaged file (``PRAGMA quick_check`` at open) is moved aside and reported to
``on_error("corrupt")``, as are stored rows whose arrays do not match their counts (their labels
count as unknown). Predictions not stored are reported to ``on_drop(n, reason)``: ``queue_full``,
``invalid`` (a request whose id or identity UTF-8 cannot encode, or whose arrays disagree: dropped
alone, the rest of the flush is written) and ``write_failed`` (a failed write, e.g. a full disk, drops
its batch and also reports ``on_error("write")``). Inference never depends on the store.

The row and batch types are in :mod:`agent.labels.rows`; the schema, the conversion of older files
and the SQL statements in :mod:`agent.labels.sqlite_schema`.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.core.os_threads import name_os_thread
from agent.core.sqlite_files import DamagedFile, connect, move_aside, open_checked
from agent.labels.rows import (
    CorruptRow,
    LabeledRows,
    LabelOutcome,
    PendingBatch,
    _extras_blob,
    _extras_row,
    batch_problem,
    onehot_errors,
    split_prediction_id,
    storable_text,
)
from agent.labels.sqlite_schema import (
    CHUNK,
    INSERT_LABEL,
    delete_requests,
    init_schema,
    labeled_indices,
    last_per_request,
    request_rows,
    requests_by_id,
)

log = logging.getLogger("icos_agent.labels")

STORE_FILE = "predictions.sqlite3"


class StoreUnavailable(Exception):
    """The store could not be read or written (the message says why)."""


class PredictionStore:
    """See the module docstring. Thread-safe; ``start()`` runs the background writer."""

    def __init__(
        self,
        directory: str | Path | None,
        *,
        max_predictions: int,
        max_age_seconds: float,
        queue_limit: int = 100_000,
        flush_interval: float = 1.0,
        on_error: Callable[[str], None] = lambda _op: None,
        on_drop: Callable[[int, str], None] = lambda _n, _reason: None,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.max_predictions = int(max_predictions)
        self.max_age_seconds = float(max_age_seconds)
        self.queue_limit = int(queue_limit)
        self.flush_interval = float(flush_interval)
        self.on_error = on_error
        self.on_drop = on_drop
        self.persistent = False
        self.path: Path | None = None
        self._db: sqlite3.Connection | None = None
        self._db_lock = threading.Lock()
        self._queue: deque[PendingBatch] = deque()
        self._queued = 0
        self._queue_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: predictions stored (not evicted) and, of them, labeled ones
        self.rows = 0
        self.labeled = 0
        self._oldest_ts = float("inf")  # the oldest stored request's time (age eviction skips until then)

    # -- opening ---------------------------------------------------------------------------------
    def open(self) -> None:
        """Open the file in the state directory, or fall back to memory (reported as an ``open`` error).
        A damaged file (``PRAGMA quick_check`` fails, or it is no database) is moved aside, counted as a
        ``corrupt`` error and replaced by an empty one: its rows would read back as garbage."""
        if self.directory is not None:
            path = self.directory / STORE_FILE
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                try:
                    db = open_checked(path, init_schema)
                except DamagedFile as exc:
                    self._move_aside(path, str(exc))
                    db = open_checked(path, init_schema)
                self._db, self.path, self.persistent = db, path, True
            except (sqlite3.Error, OSError, DamagedFile) as exc:
                self.on_error("open")
                log.warning(
                    "prediction store not writable; keeping predictions in memory (lost at restart)",
                    extra={"path": str(path), "error": str(exc)},
                )
        if self._db is None:
            db = connect(":memory:")
            init_schema(db)
            self._db = db
        self._refresh_counts()

    def _move_aside(self, path: Path, why: str) -> None:
        """Rename a damaged store file (and its WAL) aside, kept for inspection; count and log it."""
        moved = move_aside(path)
        self.on_error("corrupt")
        log.error(
            "the prediction store file is damaged; moved aside, starting an empty store",
            extra={"path": str(path), "moved_to": str(moved), "error": why},
        )

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreUnavailable("the prediction store is not open")
        return self._db

    # -- writing ---------------------------------------------------------------------------------
    def enqueue(self, batch: PendingBatch) -> bool:
        """Queue a judged request for the writer (cheap). ``False`` when the queue is full (dropped)."""
        with self._queue_lock:
            if self._queued + batch.n > self.queue_limit:
                dropped = True
            else:
                self._queue.append(batch)
                self._queued += batch.n
                dropped = False
        if dropped:
            self.on_drop(batch.n, "queue_full")
        return not dropped

    @property
    def queued(self) -> int:
        return self._queued

    def _take(self) -> list[PendingBatch]:
        with self._queue_lock:
            batches = list(self._queue)
            self._queue.clear()
            self._queued = 0
        return batches

    def flush(self, now: float | None = None) -> int:
        """Write everything queued now, then evict; returns the predictions written. A batch that
        cannot be stored (:func:`batch_problem`) is dropped alone; a failed write drops what it held.
        Both are counted (``on_drop``), never raised: the other requests' predictions are written."""
        batches = self._storable(last_per_request(self._take()))
        written = 0
        if batches:
            try:
                written = self._write(batches)
            except Exception as exc:  # noqa: BLE001 - whatever failed, the batch is counted, the writer lives
                n = sum(b.n for b in batches)
                self.on_error("write")
                self.on_drop(n, "write_failed")
                log.warning(
                    "writing predictions failed; batch dropped",
                    extra={"predictions": n, "error": f"{type(exc).__name__}: {exc}"},
                )
        self.evict(time.time() if now is None else now)
        return written

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

    def _write(self, batches: list[PendingBatch]) -> int:
        rows = request_rows(batches)
        with self._db_lock:
            db = self._conn()
            db.execute("BEGIN")
            try:
                replaced_rows, replaced_labels = delete_requests(db, [b.request_id for b in batches])
                db.executemany(
                    "INSERT INTO requests(rid, start, lo, hi, ts, identity, k, predicted, verdict, probs,"
                    " extras) VALUES(?, 0, 0, ?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # SQLite may have rolled back already (e.g. a full disk)
                    db.execute("ROLLBACK")
                raise
        written = sum(b.n for b in batches)
        self.rows += written - replaced_rows
        self.labeled -= replaced_labels
        self._oldest_ts = min(self._oldest_ts, min(b.timestamp for b in batches))
        return written

    def evict(self, now: float) -> int:
        """Delete predictions older than ``max_age_seconds`` and the oldest beyond ``max_predictions``."""
        cutoff = now - self.max_age_seconds
        if self._oldest_ts >= cutoff and self.rows <= self.max_predictions:
            return 0  # nothing is over a bound: no statement at all
        try:
            with self._db_lock:
                db = self._conn()
                db.execute("BEGIN")
                try:
                    gone = self._evict_older(db, cutoff) + self._evict_beyond_count(db)
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
        except (sqlite3.Error, OSError, StoreUnavailable) as exc:
            self.on_error("write")
            log.warning("evicting predictions failed", extra={"error": str(exc)})
            self._refresh_counts()
            return 0
        return gone

    def _evict_older(self, db: sqlite3.Connection, cutoff: float) -> int:
        n, oldest = db.execute(
            "SELECT COALESCE(SUM(hi - lo), 0), MIN(ts) FROM requests WHERE ts < ?", (cutoff,)
        ).fetchone()
        if int(n) == 0 and oldest is None:
            row = db.execute("SELECT MIN(ts) FROM requests").fetchone()
            self._oldest_ts = float("inf") if row[0] is None else float(row[0])
            return 0
        self.labeled -= db.execute(
            "DELETE FROM labels WHERE seq IN (SELECT seq FROM requests WHERE ts < ?)", (cutoff,)
        ).rowcount
        db.execute("DELETE FROM requests WHERE ts < ?", (cutoff,))
        self.rows -= int(n)
        row = db.execute("SELECT MIN(ts) FROM requests").fetchone()
        self._oldest_ts = float("inf") if row[0] is None else float(row[0])
        return int(n)

    def _evict_beyond_count(self, db: sqlite3.Connection) -> int:
        excess = self.rows - self.max_predictions
        if excess <= 0:
            return 0
        whole_upto: int | None = None  # delete request rows with seq <= this
        cut: tuple[int, int] | None = None  # (seq, new lo) of a request evicted in part
        left = excess
        after = -1
        while left > 0:
            page = db.execute(
                "SELECT seq, lo, hi FROM requests WHERE seq > ? ORDER BY seq LIMIT 1000", (after,)
            ).fetchall()
            if not page:
                break
            for seq, lo, hi in page:
                live = int(hi) - int(lo)
                if live <= left:
                    whole_upto, left = int(seq), left - live
                else:
                    cut, left = (int(seq), int(lo) + left), 0
                if left == 0:
                    break
            after = int(page[-1][0])
        if whole_upto is not None:
            self.labeled -= db.execute("DELETE FROM labels WHERE seq <= ?", (whole_upto,)).rowcount
            db.execute("DELETE FROM requests WHERE seq <= ?", (whole_upto,))
        if cut is not None:
            seq, lo = cut
            self.labeled -= db.execute("DELETE FROM labels WHERE seq = ? AND idx < ?", (seq, lo)).rowcount
            db.execute("UPDATE requests SET lo = ? WHERE seq = ?", (lo, seq))
        gone = excess - left
        self.rows -= gone
        return gone

    def _refresh_counts(self) -> None:
        try:
            with self._db_lock:
                db = self._conn()
                n, oldest = db.execute("SELECT COALESCE(SUM(hi - lo), 0), MIN(ts) FROM requests").fetchone()
                (labeled,) = db.execute("SELECT COUNT(*) FROM labels").fetchone()
            self.rows, self.labeled = int(n), int(labeled)
            self._oldest_ts = float("inf") if oldest is None else float(oldest)
        except (sqlite3.Error, StoreUnavailable):
            self.on_error("read")

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
        """Stop the writer, write what is queued and close."""
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout=30)
            self._thread = None
        self.flush()
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- labels ----------------------------------------------------------------------------------
    def apply_labels(self, labels: Sequence[tuple[str, int]], now: float) -> LabelOutcome:
        """Record true classes for prediction ids (ids must be distinct). Unknown ids (never seen or
        evicted) and already labeled ones (``duplicate``; the first label stays) are listed."""
        by_identity: dict[str, list[tuple[float, int, float, bool, float, float, int]]] = {}
        extras_by_identity: dict[str, list[np.ndarray]] = {}
        predicted_by_identity: dict[str, list[int | None]] = {}
        unknown: list[str] = []
        duplicate: list[str] = []
        corrupt: list[str] = []
        n_accepted = 0
        try:
            with self._db_lock:
                db = self._conn()
                db.execute("BEGIN")
                try:
                    for first in range(0, len(labels), CHUNK):
                        chunk = []
                        for pid, label in labels[first : first + CHUNK]:
                            if storable_text(pid):
                                chunk.append((pid, label, *split_prediction_id(pid)))
                            else:  # no stored prediction has an id that SQLite cannot hold
                                unknown.append(pid)
                        requests = requests_by_id(db, {rid for _, _, rid, _ in chunk})
                        done = labeled_indices(db, {r.seq for rows in requests.values() for r in rows})
                        inserts = []
                        for pid, label, rid, idx in chunk:
                            row = next((r for r in requests.get(rid, ()) if r.holds(idx)), None)
                            if row is None:
                                unknown.append(pid)
                                continue
                            if (row.seq, idx) in done:
                                duplicate.append(pid)
                                continue
                            try:
                                predicted, verdict, probs, ext = row.prediction(idx)
                            except CorruptRow as exc:
                                corrupt.append(str(exc))
                                unknown.append(pid)
                                continue
                            done.add((row.seq, idx))
                            a, s = onehot_errors(probs, label)
                            confidence = float(probs.max()) if len(probs) else 0.0
                            correct = predicted == label
                            inserts.append(
                                (row.seq, idx, row.identity, row.ts, verdict, confidence, int(correct), len(probs))
                                + (label, now, a, s, _extras_blob(None if np.isnan(ext).any() else ext), predicted)
                            )
                            by_identity.setdefault(row.identity, []).append(
                                (row.ts, verdict, confidence, correct, a, s, len(probs))
                            )
                            extras_by_identity.setdefault(row.identity, []).append(ext)
                            predicted_by_identity.setdefault(row.identity, []).append(predicted)
                        db.executemany(
                            INSERT_LABEL,
                            inserts,
                        )
                        n_accepted += len(inserts)
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
        except (sqlite3.Error, OSError) as exc:
            self.on_error("write")
            raise StoreUnavailable(f"the prediction store failed: {exc}") from exc
        if corrupt:
            self.on_error("corrupt")
            log.error(
                "stored predictions are damaged; their labels count as unknown",
                extra={"predictions": len(corrupt), "error": corrupt[0]},
            )
        self.labeled += n_accepted
        accepted = [
            (k, LabeledRows.from_tuples(v, extras_by_identity[k], predicted_by_identity[k]))
            for k, v in by_identity.items()
        ]
        return LabelOutcome(accepted, n_accepted, unknown, duplicate)

    def labeled_rows(self, identity: str, since: float | None = None, limit: int | None = None) -> LabeledRows:
        """Labeled predictions of one model identity (prediction time ≥ ``since``; the newest ``limit``)."""
        sql = (
            "SELECT ts, verdict, confidence, correct, abs_err, sq_err, k, extras, predicted "
            "FROM labels WHERE identity = ? AND ts >= ? ORDER BY ts DESC, seq DESC, idx DESC"
        )
        args: list[Any] = [identity, float("-inf") if since is None else since]
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        try:
            with self._db_lock:
                rows = self._conn().execute(sql, args).fetchall()
        except (sqlite3.Error, OSError) as exc:
            self.on_error("read")
            raise StoreUnavailable(f"the prediction store failed: {exc}") from exc
        rows.reverse()
        return LabeledRows.from_tuples(
            [(r[0], r[1], r[2], bool(r[3]), r[4], r[5], r[6]) for r in rows],
            [_extras_row(r[7]) for r in rows],
            [r[8] for r in rows],
        )

    # -- refitted calibrations -------------------------------------------------------------------
    def put_calibration(self, identity: str, value_json: str) -> None:
        with self._db_lock:
            self._conn().execute(
                "INSERT OR REPLACE INTO calibration(identity, value, created) VALUES(?, ?, ?)",
                (identity, value_json, time.time()),
            )

    def get_calibration(self, identity: str) -> str | None:
        with self._db_lock:
            row = self._conn().execute("SELECT value FROM calibration WHERE identity = ?", (identity,)).fetchone()
        return str(row[0]) if row else None

    def delete_calibration(self, identity: str) -> None:
        with self._db_lock:
            self._conn().execute("DELETE FROM calibration WHERE identity = ?", (identity,))
