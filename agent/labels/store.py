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
``on_error("open")``; a failed write drops its batch and reports ``on_error("write")``. Inference
never depends on the store.
"""

from __future__ import annotations

import itertools
import logging
import math
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.core.os_threads import name_os_thread
from agent.estimation.statistics import EXTRAS_DTYPE as _EXTRAS_DTYPE
from agent.estimation.statistics import EXTRAS_FIELDS, SampleExtras, extras_columns, extras_from_columns

log = logging.getLogger("icos_agent.labels")

STORE_FILE = "predictions.sqlite3"
_CHUNK = 500  # ids per SQL statement (well below SQLite's variable limit)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS requests ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, rid TEXT NOT NULL, start INTEGER NOT NULL, lo INTEGER NOT NULL,"
    " hi INTEGER NOT NULL, ts REAL NOT NULL, identity TEXT NOT NULL, k INTEGER NOT NULL,"
    " predicted BLOB NOT NULL, verdict BLOB NOT NULL, probs BLOB NOT NULL, extras BLOB, UNIQUE(rid, start))",
    "CREATE INDEX IF NOT EXISTS requests_ts ON requests(ts)",
    "CREATE TABLE IF NOT EXISTS labels ("
    " seq INTEGER NOT NULL, idx INTEGER NOT NULL, identity TEXT NOT NULL, ts REAL NOT NULL,"
    " verdict INTEGER NOT NULL, confidence REAL NOT NULL, correct INTEGER NOT NULL, k INTEGER NOT NULL,"
    " label INTEGER NOT NULL, labeled_at REAL NOT NULL, abs_err REAL NOT NULL, sq_err REAL NOT NULL, extras BLOB,"
    " predicted INTEGER, PRIMARY KEY(seq, idx))",
    "CREATE INDEX IF NOT EXISTS labels_identity_ts ON labels(identity, ts)",
    "CREATE TABLE IF NOT EXISTS calibration (identity TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)",
)
_INSERT_LABEL = (
    "INSERT INTO labels(seq, idx, identity, ts, verdict, confidence, correct, k, label, labeled_at, abs_err,"
    " sq_err, extras, predicted) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_REQUEST_COLUMNS = "seq, rid, start, lo, hi, ts, identity, k, predicted, verdict, probs, extras"


def _extras_blob(row: np.ndarray | None) -> bytes | None:
    return None if row is None else np.asarray(row, dtype=_EXTRAS_DTYPE).tobytes()


def _extras_row(blob: object) -> np.ndarray:
    if isinstance(blob, bytes) and len(blob) == 8 * len(EXTRAS_FIELDS):
        return np.frombuffer(blob, dtype=_EXTRAS_DTYPE).astype(np.float64)
    return np.full(len(EXTRAS_FIELDS), np.nan)


class StoreUnavailable(Exception):
    """The store could not be read or written (the message says why)."""


@dataclass(frozen=True)
class PendingBatch:
    """One judged request waiting to be written."""

    request_id: str
    timestamp: float
    identity: str
    probabilities: np.ndarray
    labels: np.ndarray
    verdicts: np.ndarray
    #: The inputs of the full ``shift_aware`` model, when the runtime computed them: as
    #: :class:`SampleExtras` or as their float64 ``[n, 5]`` columns (:func:`extras_columns`).
    extras: SampleExtras | np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class LabeledRows:
    """Labeled predictions (arrays of equal length), e.g. for the realized windows or recalibration."""

    timestamp: np.ndarray  # prediction time (s since the epoch)
    verdict: np.ndarray  # int8, index into VERDICTS
    confidence: np.ndarray  # top-class probability
    correct: np.ndarray  # bool: predicted class == true class
    abs_err: np.ndarray  # sum over classes of |p_k - onehot_k|
    sq_err: np.ndarray  # sum over classes of (p_k - onehot_k)^2
    n_classes: np.ndarray  # K of each prediction
    #: float64 [N, 5]: the stored :class:`SampleExtras` (columns :data:`EXTRAS_FIELDS`), NaN rows where
    #: the prediction has none (``None`` given: all NaN)
    extras: np.ndarray | None = None
    #: int64 [N]: the predicted class, -1 where unknown (``None`` given: all unknown)
    predicted: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.extras is None:
            object.__setattr__(self, "extras", np.full((len(self.timestamp), len(EXTRAS_FIELDS)), np.nan))
        if self.predicted is None:
            object.__setattr__(self, "predicted", np.full(len(self.timestamp), -1, dtype=np.int64))

    @property
    def n(self) -> int:
        return len(self.timestamp)

    def sample_extras(self) -> SampleExtras | None:
        """The extras of every row, or None when any row has none (the reduced model applies then).
        They carry the predicted classes when every row has one (else the *inputs* model applies)."""
        cols = self.extras
        if cols is None or self.n == 0 or np.isnan(cols).any():
            return None
        extras = extras_from_columns(cols)
        pred = self.predicted
        if pred is not None and len(pred) == self.n and bool((pred >= 0).all()):
            extras = replace(extras, label=np.asarray(pred, dtype=np.int64))
        return extras

    @classmethod
    def empty(cls) -> LabeledRows:
        z = np.zeros(0)
        return cls(z, np.zeros(0, np.int8), z, np.zeros(0, bool), z, z, np.zeros(0, np.int64))

    @classmethod
    def from_tuples(
        cls,
        rows: Sequence[tuple[float, int, float, bool, float, float, int]],
        extras: Sequence[np.ndarray] | None = None,
        predicted: Sequence[int | None] | None = None,
    ) -> LabeledRows:
        """From ``(ts, verdict, confidence, correct, abs_err, sq_err, n_classes)`` rows and, optionally,
        one extras row (5 floats, NaN when absent) and one predicted class (None when unknown) per row."""
        if not rows:
            return cls.empty()
        ts, v, c, ok, a, s, k = zip(*rows, strict=True)
        return cls(
            np.asarray(ts, np.float64),
            np.asarray(v, np.int8),
            np.asarray(c, np.float64),
            np.asarray(ok, bool),
            np.asarray(a, np.float64),
            np.asarray(s, np.float64),
            np.asarray(k, np.int64),
            np.asarray(extras, np.float64).reshape(len(rows), len(EXTRAS_FIELDS)) if extras is not None else None,
            np.asarray([-1 if v is None else v for v in predicted], np.int64) if predicted is not None else None,
        )


def onehot_errors(probabilities: np.ndarray, label: int) -> tuple[float, float]:
    """``(sum_k |p_k − y_k|, sum_k (p_k − y_k)²)`` for one probability vector and its one-hot truth
    ``y`` (BenchMetrics Prob's absolute and squared error per instance, summed over the classes)."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    d = p.copy()
    if 0 <= label < len(d):
        d[label] -= 1.0
    return float(np.abs(d).sum()), float((d * d).sum())


@dataclass(frozen=True)
class LabelOutcome:
    """What :meth:`PredictionStore.apply_labels` did with each id."""

    accepted: list[tuple[str, LabeledRows]]  # per model identity, the newly labeled predictions
    n_accepted: int
    unknown: list[str]
    duplicate: list[str]


def split_prediction_id(pid: str) -> tuple[str, int]:
    """``<request id>:<index>`` → ``(request id, index)``; an id without an integer suffix maps to
    ``(id, -1)``, which no prediction of a new request has (it can only match a converted old row)."""
    rid, sep, tail = pid.rpartition(":")
    if sep and tail.isdigit() and len(tail) <= 9:
        return rid, int(tail)
    return pid, -1


@dataclass
class _RequestRow:
    """One ``requests`` row, its arrays decoded on first use."""

    seq: int
    rid: str
    start: int
    lo: int
    hi: int
    ts: float
    identity: str
    k: int
    predicted_blob: bytes
    verdict_blob: bytes
    probs_blob: bytes
    extras_blob: bytes | None

    @classmethod
    def of(cls, r: Sequence[Any]) -> _RequestRow:
        return cls(int(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), float(r[5]), str(r[6]), int(r[7]), *r[8:])

    def holds(self, idx: int) -> bool:
        return self.lo <= idx < self.hi

    def prediction(self, idx: int) -> tuple[int, int, np.ndarray, np.ndarray]:
        """``(predicted class, verdict, probabilities [K], extras row [5] (NaN when none))`` of index ``idx``."""
        j = idx - self.start
        k = self.k
        predicted = int(np.frombuffer(self.predicted_blob, dtype=_PREDICTED_DTYPE, count=1, offset=4 * j)[0])
        verdict = int(np.frombuffer(self.verdict_blob, dtype=np.int8, count=1, offset=j)[0])
        probs = np.frombuffer(self.probs_blob, dtype="<f4", count=k, offset=4 * k * j)
        n_ext = len(EXTRAS_FIELDS)
        if isinstance(self.extras_blob, bytes) and len(self.extras_blob) == 8 * n_ext * (self.hi - self.start):
            ext = np.frombuffer(self.extras_blob, dtype=_EXTRAS_DTYPE, count=n_ext, offset=8 * n_ext * j)
        else:
            ext = np.full(n_ext, np.nan)
        return predicted, verdict, probs, ext.astype(np.float64)


_PREDICTED_DTYPE = "<i4"


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
        on_drop: Callable[[int], None] = lambda _n: None,
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
        """Open the file in the state directory, or fall back to memory (reported as an ``open`` error)."""
        if self.directory is not None:
            path = self.directory / STORE_FILE
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                db = self._connect(str(path))
                try:
                    db.execute("PRAGMA journal_mode=WAL")
                    db.execute("PRAGMA synchronous=NORMAL")
                    self._init_schema(db)
                except BaseException:
                    db.close()
                    raise
                self._db, self.path, self.persistent = db, path, True
            except (sqlite3.Error, OSError) as exc:
                self.on_error("open")
                log.warning(
                    "prediction store not writable; keeping predictions in memory (lost at restart)",
                    extra={"path": str(path), "error": str(exc)},
                )
        if self._db is None:
            db = self._connect(":memory:")
            self._init_schema(db)
            self._db = db
        self._refresh_counts()

    @staticmethod
    def _connect(target: str) -> sqlite3.Connection:
        return sqlite3.connect(target, check_same_thread=False, isolation_level=None, timeout=10.0)

    @staticmethod
    def _init_schema(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _SCHEMA:
                db.execute(stmt)
            tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "predicted" not in {str(r[1]) for r in db.execute("PRAGMA table_info(labels)")}:
                db.execute("ALTER TABLE labels ADD COLUMN predicted INTEGER")  # labels of unknown class
            if "predictions" in tables:
                n = _convert_per_prediction_rows(db)
                log.info("converted the prediction store to one row per request", extra={"predictions": n})
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

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
            self.on_drop(batch.n)
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
        """Write everything queued now, then evict; returns the predictions written."""
        batches = _last_per_request(self._take())
        written = 0
        if batches:
            rows = _request_rows(batches)
            try:
                with self._db_lock:
                    db = self._conn()
                    db.execute("BEGIN")
                    try:
                        replaced_rows, replaced_labels = _delete_requests(db, [b.request_id for b in batches])
                        db.executemany(
                            "INSERT INTO requests(rid, start, lo, hi, ts, identity, k, predicted, verdict, probs,"
                            " extras) VALUES(?, 0, 0, ?, ?, ?, ?, ?, ?, ?, ?)",
                            rows,
                        )
                        db.execute("COMMIT")
                    except BaseException:
                        db.execute("ROLLBACK")
                        raise
                written = sum(b.n for b in batches)
                self.rows += written - replaced_rows
                self.labeled -= replaced_labels
                self._oldest_ts = min(self._oldest_ts, min(b.timestamp for b in batches))
            except (sqlite3.Error, OSError, StoreUnavailable) as exc:
                self.on_error("write")
                log.warning("writing predictions failed; batch dropped", extra={"rows": len(rows), "error": str(exc)})
        self.evict(time.time() if now is None else now)
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
        n_accepted = 0
        try:
            with self._db_lock:
                db = self._conn()
                db.execute("BEGIN")
                try:
                    for first in range(0, len(labels), _CHUNK):
                        chunk = [
                            (pid, label, *split_prediction_id(pid)) for pid, label in labels[first : first + _CHUNK]
                        ]
                        requests = _requests_by_id(db, {rid for _, _, rid, _ in chunk})
                        done = _labeled_indices(db, {r.seq for rows in requests.values() for r in rows})
                        inserts = []
                        for pid, label, rid, idx in chunk:
                            row = next((r for r in requests.get(rid, ()) if r.holds(idx)), None)
                            if row is None:
                                unknown.append(pid)
                                continue
                            if (row.seq, idx) in done:
                                duplicate.append(pid)
                                continue
                            done.add((row.seq, idx))
                            predicted, verdict, probs, ext = row.prediction(idx)
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
                            _INSERT_LABEL,
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


# -- SQL helpers (called inside a transaction) -------------------------------------------------------


def _last_per_request(batches: list[PendingBatch]) -> list[PendingBatch]:
    """The batches in queue order, keeping only the last one of a request id queued twice."""
    last = {b.request_id: i for i, b in enumerate(batches)}
    if len(last) == len(batches):
        return batches
    return [b for i, b in enumerate(batches) if last[b.request_id] == i]


def _request_rows(
    batches: Sequence[PendingBatch],
) -> list[tuple[str, int, float, str, int, bytes, bytes, bytes, bytes | None]]:
    """The ``requests`` values (after ``rid, start=0, lo=0``) of queued batches. The arrays of all
    batches are converted and serialised together and cut into one BLOB per request, so a request
    costs a few bytes slices, not a dozen small numpy calls."""
    ns = [b.n for b in batches]
    cuts = [0, *itertools.accumulate(ns)]
    predicted = _cut(np.concatenate([np.asarray(b.labels).reshape(-1) for b in batches]).astype(_PREDICTED_DTYPE), cuts)
    verdicts = _cut(np.concatenate([np.asarray(b.verdicts).reshape(-1) for b in batches]).astype(np.int8), cuts)
    probs2d = [np.asarray(b.probabilities).reshape(b.n, -1) for b in batches]
    ks = [p.shape[1] for p in probs2d]
    if len(set(ks)) == 1:
        probs = _cut(np.concatenate(probs2d).astype("<f4"), cuts)
    else:  # models with different class counts in one write (a reload): one array per request
        probs = [np.ascontiguousarray(p, dtype="<f4").tobytes() for p in probs2d]
    extras: list[bytes | None] = [None] * len(batches)
    with_extras = [i for i, b in enumerate(batches) if _extras_of(b) is not None]
    if with_extras:
        parts = [_extras_of(batches[i]) for i in with_extras]
        cols = np.concatenate([p for p in parts if p is not None]).astype(_EXTRAS_DTYPE)
        sub = _cut(cols, [0, *itertools.accumulate(ns[i] for i in with_extras)])
        for i, blob in zip(with_extras, sub, strict=True):
            extras[i] = blob
    return [
        (b.request_id, b.n, float(b.timestamp), b.identity, k, predicted[i], verdicts[i], probs[i], extras[i])
        for i, (b, k) in enumerate(zip(batches, ks, strict=True))
    ]


def _extras_of(b: PendingBatch) -> np.ndarray | None:
    """The batch's extras as float64 ``[n, 5]`` columns, or None when it has none (or a wrong count)."""
    e = b.extras
    if e is None:
        return None
    cols = e if isinstance(e, np.ndarray) else extras_columns(e)
    return cols if cols.shape == (b.n, len(EXTRAS_FIELDS)) else None


def _cut(a: np.ndarray, cuts: Sequence[int]) -> list[bytes]:
    """The bytes of rows ``cuts[i]:cuts[i+1]`` of a C-contiguous array, for every ``i``."""
    data = np.ascontiguousarray(a).tobytes()
    row = a.itemsize * (math.prod(a.shape[1:]) if a.ndim > 1 else 1)
    return [data[row * lo : row * hi] for lo, hi in itertools.pairwise(cuts)]


def _delete_requests(db: sqlite3.Connection, rids: Sequence[str]) -> tuple[int, int]:
    """Delete the stored requests with these ids and their labels: ``(predictions, labels)`` deleted.
    One lookup per :data:`_CHUNK` ids; deletes only for ids that exist (reused ids are rare)."""
    found: list[tuple[int, int]] = []  # (seq, live predictions)
    for first in range(0, len(rids), _CHUNK):
        chunk = list(rids[first : first + _CHUNK])
        marks = ",".join("?" * len(chunk))
        found += db.execute(
            f"SELECT seq, hi - lo FROM requests WHERE rid IN ({marks})",  # noqa: S608 - placeholders only
            chunk,
        ).fetchall()
    if not found:
        return 0, 0
    labels = 0
    for seq, _ in found:
        labels += db.execute("DELETE FROM labels WHERE seq = ?", (seq,)).rowcount
        db.execute("DELETE FROM requests WHERE seq = ?", (seq,))
    return sum(int(n) for _, n in found), labels


def _requests_by_id(db: sqlite3.Connection, rids: set[str]) -> dict[str, list[_RequestRow]]:
    out: dict[str, list[_RequestRow]] = {}
    if not rids:
        return out
    ids = list(rids)
    marks = ",".join("?" * len(ids))
    for r in db.execute(
        f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE rid IN ({marks})",  # noqa: S608 - placeholders only
        ids,
    ):
        row = _RequestRow.of(r)
        out.setdefault(row.rid, []).append(row)
    return out


def _labeled_indices(db: sqlite3.Connection, seqs: set[int]) -> set[tuple[int, int]]:
    done: set[tuple[int, int]] = set()
    ids = list(seqs)
    for first in range(0, len(ids), _CHUNK):
        chunk = ids[first : first + _CHUNK]
        marks = ",".join("?" * len(chunk))
        done.update(
            (int(s), int(i))
            for s, i in db.execute(
                f"SELECT seq, idx FROM labels WHERE seq IN ({marks})",  # noqa: S608 - placeholders only
                chunk,
            )
        )
    return done


def _convert_per_prediction_rows(db: sqlite3.Connection) -> int:
    """Move the rows of the earlier one-row-per-prediction table into ``requests`` (one row per
    prediction, ``start`` = its index) and ``labels``, then drop it. Returns the predictions moved."""
    columns = {str(r[1]) for r in db.execute("PRAGMA table_info(predictions)")}
    extras_col = "extras" if "extras" in columns else "NULL"
    moved = 0
    cursor = db.execute(
        "SELECT pid, ts, identity, predicted, confidence, verdict, probs, label, labeled_at, abs_err, sq_err,"
        f" {extras_col} FROM predictions ORDER BY seq"  # noqa: S608 - a fixed column name or NULL
    )
    while True:
        page = cursor.fetchmany(2000)
        if not page:
            break
        for pid, ts, identity, predicted, confidence, verdict, probs, label, labeled_at, a, s, extras in page:
            rid, idx = split_prediction_id(str(pid))
            k = len(probs) // 4
            ext = extras if isinstance(extras, bytes) and len(extras) == 8 * len(EXTRAS_FIELDS) else None
            seq = db.execute(
                "INSERT OR REPLACE INTO requests(rid, start, lo, hi, ts, identity, k, predicted, verdict, probs,"
                " extras) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    rid,
                    idx,
                    idx,
                    idx + 1,
                    ts,
                    identity,
                    k,
                    np.asarray([predicted], dtype=_PREDICTED_DTYPE).tobytes(),
                    np.asarray([verdict], dtype=np.int8).tobytes(),
                    probs,
                    ext,
                ),
            ).lastrowid
            if label is not None:
                db.execute(
                    _INSERT_LABEL.replace("INSERT", "INSERT OR REPLACE", 1),
                    (seq, idx, identity, ts, verdict, confidence, int(predicted == label), k)
                    + (label, labeled_at, a, s, ext, predicted),
                )
            moved += 1
    db.execute("DROP TABLE predictions")
    return moved
