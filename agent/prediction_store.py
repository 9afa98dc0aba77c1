"""A bounded store of judged predictions waiting for their true labels (SQLite, WAL).

The request pipeline hands every judged request to :meth:`PredictionStore.enqueue`, which only
appends it to a memory-bounded queue (at most ``queue_limit`` predictions; beyond that a batch is
dropped and counted). A background thread writes the queue every ``flush_interval`` seconds in one
transaction and evicts what is over the bounds: predictions older than ``max_age_seconds`` and, past
``max_predictions`` rows, the oldest ones.

One row per prediction (table ``predictions``): its id ``<request id>:<index>``, the prediction
time, the identity of the model and bundle that judged it, the predicted class, the top-class
probability, the oracle verdict (index into :data:`invariants.oracle.VERDICTS`) and the probability
vector (float32 little-endian bytes), and the inputs of the full ``shift_aware`` model when the
runtime computed them (column ``extras``: margin, TDI rule, agreement, coverage and PCA error of
:class:`agent.estimators.SampleExtras`, 5 float64 little-endian; NULL otherwise); once labeled,
the true class, the label's arrival time and the prediction's absolute and squared error sums over
the classes against the one-hot truth. A request id used twice replaces the earlier predictions with
that id. The table ``calibration`` keeps an estimator calibration refitted from labels, per model
identity. A file from before the ``extras`` column gains it when opened (its rows keep NULL).

The file is ``<state_dir>/predictions.sqlite3``. Without a state directory, or when the file cannot
be opened, the store lives in memory (same bounds, lost at restart) and the failure is reported to
``on_error("open")``; a failed write drops its batch and reports ``on_error("write")``. Inference
never depends on the store.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.estimators import SampleExtras

log = logging.getLogger("icos_agent.labels")

STORE_FILE = "predictions.sqlite3"
_CHUNK = 500  # ids per SQL statement (well below SQLite's variable limit)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS predictions ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, pid TEXT NOT NULL UNIQUE, ts REAL NOT NULL,"
    " identity TEXT NOT NULL, predicted INTEGER NOT NULL, confidence REAL NOT NULL, verdict INTEGER NOT NULL,"
    " probs BLOB NOT NULL, label INTEGER, labeled_at REAL, abs_err REAL, sq_err REAL, extras BLOB)",
    "CREATE INDEX IF NOT EXISTS predictions_ts ON predictions(ts)",
    "CREATE INDEX IF NOT EXISTS predictions_labeled ON predictions(identity, labeled_at) WHERE label IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS calibration (identity TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)",
)
#: The :class:`SampleExtras` fields kept per prediction, in the order of the ``extras`` column.
EXTRAS_FIELDS: tuple[str, ...] = ("margin", "rules", "agree", "covered", "pca_error")
_EXTRAS_DTYPE = "<f8"


def extras_columns(extras: SampleExtras) -> np.ndarray:
    """The extras as float64 ``[N, 5]`` (columns :data:`EXTRAS_FIELDS`; integer and bool fields exactly)."""
    return np.column_stack([np.asarray(getattr(extras, f), dtype=np.float64).reshape(-1) for f in EXTRAS_FIELDS])


def extras_from_columns(cols: np.ndarray) -> SampleExtras:
    """The inverse of :func:`extras_columns`."""
    c = np.asarray(cols, dtype=np.float64).reshape(-1, len(EXTRAS_FIELDS))
    return SampleExtras(
        margin=c[:, 0].copy(),
        rules=c[:, 1].astype(np.int64),
        agree=c[:, 2] != 0,
        covered=c[:, 3] != 0,
        pca_error=c[:, 4].copy(),
    )


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
    #: The inputs of the full ``shift_aware`` model, when the runtime computed them.
    extras: SampleExtras | None = None

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

    def __post_init__(self) -> None:
        if self.extras is None:
            object.__setattr__(self, "extras", np.full((len(self.timestamp), len(EXTRAS_FIELDS)), np.nan))

    @property
    def n(self) -> int:
        return len(self.timestamp)

    def sample_extras(self) -> SampleExtras | None:
        """The extras of every row, or None when any row has none (the reduced model applies then)."""
        cols = self.extras
        if cols is None or self.n == 0 or np.isnan(cols).any():
            return None
        return extras_from_columns(cols)

    @classmethod
    def empty(cls) -> LabeledRows:
        z = np.zeros(0)
        return cls(z, np.zeros(0, np.int8), z, np.zeros(0, bool), z, z, np.zeros(0, np.int64))

    @classmethod
    def from_tuples(
        cls,
        rows: Sequence[tuple[float, int, float, bool, float, float, int]],
        extras: Sequence[np.ndarray] | None = None,
    ) -> LabeledRows:
        """From ``(ts, verdict, confidence, correct, abs_err, sq_err, n_classes)`` rows and, optionally,
        one extras row (5 floats, NaN when absent) per row."""
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
        self.rows = 0
        self.labeled = 0

    # -- opening ---------------------------------------------------------------------------------
    def open(self) -> None:
        """Open the file in the state directory, or fall back to memory (reported as an ``open`` error)."""
        if self.directory is not None:
            path = self.directory / STORE_FILE
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                db = self._connect(str(path))
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                self._init_schema(db)
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
        for stmt in _SCHEMA:
            db.execute(stmt)
        # a file written before the ``extras`` column existed: add it (its old rows keep NULL)
        columns = {str(r[1]) for r in db.execute("PRAGMA table_info(predictions)")}
        if "extras" not in columns:
            try:
                db.execute("ALTER TABLE predictions ADD COLUMN extras BLOB")
            except sqlite3.OperationalError as exc:  # another process added it meanwhile
                if "duplicate column" not in str(exc):
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
        batches = self._take()
        written = 0
        if batches:
            rows = list(_rows(batches))
            try:
                with self._db_lock:
                    db = self._conn()
                    db.execute("BEGIN")
                    try:
                        db.executemany(
                            "INSERT OR REPLACE INTO predictions"
                            "(pid, ts, identity, predicted, confidence, verdict, probs, extras)"
                            " VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                            rows,
                        )
                        db.execute("COMMIT")
                    except BaseException:
                        db.execute("ROLLBACK")
                        raise
                written = len(rows)
            except (sqlite3.Error, OSError, StoreUnavailable) as exc:
                self.on_error("write")
                log.warning("writing predictions failed; batch dropped", extra={"rows": len(rows), "error": str(exc)})
        self.evict(time.time() if now is None else now)
        return written

    def evict(self, now: float) -> int:
        """Delete predictions older than ``max_age_seconds`` and the oldest beyond ``max_predictions``."""
        try:
            with self._db_lock:
                db = self._conn()
                gone = db.execute("DELETE FROM predictions WHERE ts < ?", (now - self.max_age_seconds,)).rowcount
                row = db.execute(
                    "SELECT seq FROM predictions ORDER BY seq DESC LIMIT 1 OFFSET ?", (self.max_predictions,)
                ).fetchone()
                if row is not None:
                    gone += db.execute("DELETE FROM predictions WHERE seq <= ?", (row[0],)).rowcount
        except (sqlite3.Error, OSError, StoreUnavailable) as exc:
            self.on_error("write")
            log.warning("evicting predictions failed", extra={"error": str(exc)})
            return 0
        self._refresh_counts()
        return int(max(gone, 0))

    def _refresh_counts(self) -> None:
        try:
            with self._db_lock:
                n, labeled = self._conn().execute("SELECT COUNT(*), COUNT(label) FROM predictions").fetchone()
            self.rows, self.labeled = int(n), int(labeled)
        except (sqlite3.Error, StoreUnavailable):
            self.on_error("read")

    # -- background writer -----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="icos-prediction-store", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
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
        unknown: list[str] = []
        duplicate: list[str] = []
        n_accepted = 0
        try:
            with self._db_lock:
                db = self._conn()
                db.execute("BEGIN")
                try:
                    for start in range(0, len(labels), _CHUNK):
                        chunk = labels[start : start + _CHUNK]
                        marks = ",".join("?" * len(chunk))
                        found = {
                            r[0]: r
                            for r in db.execute(
                                "SELECT pid, ts, identity, predicted, confidence, verdict, probs, label, extras "
                                f"FROM predictions WHERE pid IN ({marks})",  # noqa: S608 - placeholders only
                                [pid for pid, _ in chunk],
                            )
                        }
                        updates = []
                        for pid, label in chunk:
                            r = found.get(pid)
                            if r is None:
                                unknown.append(pid)
                                continue
                            if r[7] is not None:
                                duplicate.append(pid)
                                continue
                            probs = np.frombuffer(r[6], dtype="<f4")
                            a, s = onehot_errors(probs, label)
                            updates.append((label, now, a, s, pid))
                            by_identity.setdefault(str(r[2]), []).append(
                                (float(r[1]), int(r[5]), float(r[4]), int(r[3]) == label, a, s, len(probs))
                            )
                            extras_by_identity.setdefault(str(r[2]), []).append(_extras_row(r[8]))
                        db.executemany(
                            "UPDATE predictions SET label = ?, labeled_at = ?, abs_err = ?, sq_err = ? WHERE pid = ?",
                            updates,
                        )
                        n_accepted += len(updates)
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
        except (sqlite3.Error, OSError) as exc:
            self.on_error("write")
            raise StoreUnavailable(f"the prediction store failed: {exc}") from exc
        self.labeled += n_accepted
        accepted = [(k, LabeledRows.from_tuples(v, extras_by_identity[k])) for k, v in by_identity.items()]
        return LabelOutcome(accepted, n_accepted, unknown, duplicate)

    def labeled_rows(self, identity: str, since: float | None = None, limit: int | None = None) -> LabeledRows:
        """Labeled predictions of one model identity (prediction time ≥ ``since``; the newest ``limit``)."""
        sql = (
            "SELECT ts, verdict, confidence, predicted = label, abs_err, sq_err, length(probs) / 4, extras "
            "FROM predictions WHERE identity = ? AND label IS NOT NULL AND ts >= ? ORDER BY ts DESC, seq DESC"
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
            [(r[0], r[1], r[2], bool(r[3]), r[4], r[5], r[6]) for r in rows], [_extras_row(r[7]) for r in rows]
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


def _rows(batches: Iterable[PendingBatch]) -> Iterable[tuple[str, float, str, int, float, int, bytes, bytes | None]]:
    """The ``predictions`` rows of queued batches (columns built per batch with numpy, not per value)."""
    for b in batches:
        n = b.n
        p = np.ascontiguousarray(np.asarray(b.probabilities, dtype="<f4").reshape(n, -1))
        conf = p.max(axis=1) if p.shape[1] else np.zeros(n, dtype="<f4")
        labels = np.asarray(b.labels, dtype=np.int64).reshape(-1).tolist()
        verdicts = np.asarray(b.verdicts, dtype=np.int64).reshape(-1).tolist()
        probs = _split_bytes(p.tobytes(), n)
        ext: list[bytes | None]
        if b.extras is not None and len(b.extras.margin) == n:
            ext = list(_split_bytes(np.ascontiguousarray(extras_columns(b.extras), dtype=_EXTRAS_DTYPE).tobytes(), n))
        else:
            ext = [None] * n
        rid, ts, identity = b.request_id, b.timestamp, b.identity
        yield from zip(
            [f"{rid}:{i}" for i in range(n)],
            [ts] * n,
            [identity] * n,
            labels,
            conf.astype(np.float64).tolist(),
            verdicts,
            probs,
            ext,
            strict=True,
        )


def _split_bytes(data: bytes, n: int) -> list[bytes]:
    """``data`` cut into ``n`` equal consecutive pieces (the rows of a C-contiguous array)."""
    if n == 0:
        return []
    step = len(data) // n
    return [data[i : i + step] for i in range(0, step * n, step)] if step else [b""] * n
