"""The prediction store's embedded backend: one SQLite file in the state directory (WAL).

The file is ``<state_dir>/predictions.sqlite3``. Without a state directory, or when the file cannot
be opened, the tables live in memory (same bounds, lost at restart) and the failure is reported to
``on_error("open")``; a damaged file (``PRAGMA quick_check`` at open) is moved aside and reported to
``on_error("corrupt")``. The schema, the conversion of older files and the statements shared with
the conversion are in :mod:`agent.labels.sqlite_schema`.

Durability: ``synchronous=NORMAL`` (a commit survives the agent being killed, not a power cut) in
``batched`` mode; ``synchronous=FULL`` in ``commit`` mode, where a request is acknowledged only
after its commit, so that an acknowledged prediction also survives a power cut.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.core.sqlite_files import DamagedFile, connect, move_aside, open_checked
from agent.labels.backend import (
    SAMPLE_PAGE,
    BackendCounts,
    StoreUnavailable,
    join_labels,
    label_filter,
    unlabeled_sample,
)
from agent.labels.eviction import EvictionStatements, evict
from agent.labels.kept_inputs import KeptInput, KeptMap, SQLiteKeptInputs
from agent.labels.rows import LABELED_COLUMNS, LabeledRows, LabelOutcome, PendingBatch
from agent.labels.sqlite_schema import (
    INSERT_LABEL,
    REPLACE_LABEL,
    delete_requests,
    init_schema,
    labeled_indices,
    request_rows,
    requests_by_id,
    sample_page,
)

log = logging.getLogger("icos_agent.labels")

STORE_FILE = "predictions.sqlite3"
SQLITE_EVICTION = EvictionStatements("requests", "labels", "?")


class SQLiteBackend(BackendCounts):
    """The tables in ``<directory>/predictions.sqlite3`` (or in memory). Thread-safe (one lock)."""

    shared = False

    def __init__(
        self,
        directory: Path | None,
        *,
        max_predictions: int,
        max_age_seconds: float,
        full_sync: bool = False,
        on_error: Callable[[str], None] = lambda _op: None,
    ) -> None:
        super().__init__(max_predictions, max_age_seconds, on_error)
        self.directory = directory
        self.full_sync = full_sync
        self.persistent = False
        self.path: Path | None = None
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._oldest_ts = float("inf")  # the oldest stored request's time (age eviction skips until then)

    @property
    def location(self) -> str | None:
        return str(self.path) if self.path else None

    def open(self) -> None:
        """Open the file, or fall back to memory (reported as an ``open`` error). A damaged file is
        moved aside, counted as ``corrupt`` and replaced by an empty one: its rows would read back as garbage."""
        if self.directory is not None:
            path = self.directory / STORE_FILE
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                try:
                    db = open_checked(path, init_schema)
                except DamagedFile as exc:
                    self._move_aside(path, str(exc))
                    db = open_checked(path, init_schema)
                if self.full_sync:
                    db.execute("PRAGMA synchronous=FULL")
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
        moved = move_aside(path)
        self.on_error("corrupt")
        log.error(
            "the prediction store file is damaged; moved aside, starting an empty store",
            extra={"path": str(path), "moved_to": str(moved), "error": why},
        )

    def conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreUnavailable("the prediction store is not open")
        return self._db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- writing ---------------------------------------------------------------------------------
    def write(self, batches: Sequence[PendingBatch]) -> int:
        rows = request_rows(batches)
        with self._lock:
            db = self.conn()
            db.execute("BEGIN")
            try:
                replaced_rows, replaced_labels = delete_requests(db, [b.request_id for b in batches])
                db.executemany(
                    "INSERT INTO requests(rid, start, lo, hi, ts, identity, k, predicted, verdict, probs,"
                    " extras, sampled, sampled_p, sampled_seg) VALUES(?, 0, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
        """Evict what is over the bounds (:mod:`agent.labels.eviction`); no statement at all while
        nothing is."""
        if self._oldest_ts >= self.retention.cutoff(now) and self.rows <= self.retention.max_predictions:
            return 0
        try:
            with self._lock:
                db = self.conn()
                db.execute("BEGIN")
                try:
                    gone = evict(db, SQLITE_EVICTION, self.retention, now, lambda aged: self.rows - aged.predictions)
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                self.rows -= gone.predictions
                self.labeled -= gone.labels
                row = db.execute("SELECT MIN(ts) FROM requests").fetchone()
                self._oldest_ts = float("inf") if row[0] is None else float(row[0])
        except (sqlite3.Error, OSError, StoreUnavailable) as exc:
            self.on_error("write")
            log.warning("evicting predictions failed", extra={"error": str(exc)})
            self._refresh_counts()
            return 0
        return gone.predictions

    def _refresh_counts(self) -> None:
        try:
            with self._lock:
                db = self.conn()
                n, oldest = db.execute("SELECT COALESCE(SUM(hi - lo), 0), MIN(ts) FROM requests").fetchone()
                (labeled,) = db.execute("SELECT COUNT(*) FROM labels").fetchone()
            self.rows, self.labeled = int(n), int(labeled)
            self._oldest_ts = float("inf") if oldest is None else float(oldest)
        except (sqlite3.Error, StoreUnavailable):
            self.on_error("read")

    # -- labels ----------------------------------------------------------------------------------
    def apply_labels(
        self, labels: Sequence[tuple[str, int]], now: float, source: str, replace: bool
    ) -> tuple[LabelOutcome, list[str]]:
        try:
            with self._lock:
                db = self.conn()
                db.execute("BEGIN")
                try:
                    joined = join_labels(
                        labels,
                        now,
                        lambda rids: requests_by_id(db, rids),
                        lambda seqs: labeled_indices(db, seqs),
                        lambda rows, replacing: _insert_labels(db, rows, replacing),
                        source=source,
                        replace=replace,
                    )
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
        except (sqlite3.Error, OSError) as exc:
            self.on_error("write")
            raise StoreUnavailable(f"the prediction store failed: {exc}") from exc
        self.labeled += joined.new
        return joined.outcome(), joined.corrupt

    def drop_labels(self, source: str | None, since: float | None, until: float | None) -> int:
        where, args = label_filter(source, since, until)
        try:
            with self._lock:
                n = self.conn().execute(f"DELETE FROM labels WHERE {where}", args).rowcount  # noqa: S608 - fixed text
        except (sqlite3.Error, OSError) as exc:
            self.on_error("write")
            raise StoreUnavailable(f"the prediction store failed: {exc}") from exc
        self.labeled -= n
        return n

    def labeled_rows(self, identity: str, since: float | None = None, limit: int | None = None) -> LabeledRows:
        sql = f"SELECT {LABELED_COLUMNS} FROM labels WHERE identity = ? AND ts >= ?"  # noqa: S608
        sql += " ORDER BY ts DESC, seq DESC, idx DESC"
        args: list[Any] = [identity, float("-inf") if since is None else since]
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        try:
            with self._lock:
                rows = self.conn().execute(sql, args).fetchall()
        except (sqlite3.Error, OSError) as exc:
            self.on_error("read")
            raise StoreUnavailable(f"the prediction store failed: {exc}") from exc
        return LabeledRows.from_selected(rows)

    def label_requests(self, identity: str, limit: int) -> list[tuple[str, float]]:
        try:
            with self._lock:
                db = self.conn()
                return unlabeled_sample(
                    lambda ts, seq: sample_page(db, identity, ts, seq, SAMPLE_PAGE),
                    lambda seqs: labeled_indices(db, seqs),
                    limit,
                )
        except (sqlite3.Error, OSError) as exc:
            self.on_error("read")
            raise StoreUnavailable(f"the prediction store failed: {exc}") from exc

    # -- kept inputs of sampled predictions -----------------------------------------------------
    def keep_inputs(self, rows: Sequence[KeptInput], max_total_bytes: int) -> int:
        with self._lock:
            db = self.conn()
            db.execute("BEGIN")
            try:
                dropped = SQLiteKeptInputs.write(db, rows, max_total_bytes)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return dropped

    def kept_inputs(self, ids: Sequence[str]) -> KeptMap:
        try:
            with self._lock:
                return SQLiteKeptInputs.read(self.conn(), ids)
        except (sqlite3.Error, OSError) as exc:
            self.on_error("read")
            raise StoreUnavailable(f"the prediction store failed: {exc}") from exc

    # -- refitted calibrations -------------------------------------------------------------------
    def put_calibration(self, identity: str, value_json: str) -> None:
        with self._lock:
            self.conn().execute(
                "INSERT OR REPLACE INTO calibration(identity, value, created) VALUES(?, ?, ?)",
                (identity, value_json, time.time()),
            )

    def get_calibration(self, identity: str) -> str | None:
        with self._lock:
            row = self.conn().execute("SELECT value FROM calibration WHERE identity = ?", (identity,)).fetchone()
        return str(row[0]) if row else None

    def delete_calibration(self, identity: str) -> None:
        with self._lock:
            self.conn().execute("DELETE FROM calibration WHERE identity = ?", (identity,))


def _insert_labels(db: sqlite3.Connection, rows: list[tuple[Any, ...]], replacing: bool) -> None:
    db.executemany(REPLACE_LABEL if replacing else INSERT_LABEL, rows)
