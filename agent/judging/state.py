"""The sidecar's persistent state: one SQLite database (WAL) in the state directory.

Two tables: ``kv`` holds JSON documents (the estimator windows of each model), ``pending`` holds work
accepted but not yet judged (observe mode), as NumPy ``.npz`` archives written and read with
``allow_pickle=False``. Safe to use from several threads.

Nothing damaged stops a start: a document or pending item that does not decode is moved to the
table ``quarantine`` (the newest :data:`QUARANTINE_KEEP` kept for inspection) and a file that fails
``PRAGMA quick_check`` or is no database is renamed ``<name>.corrupt-<time>``; each is logged once and
reported to ``on_quarantine(what)`` (``windows``/``document``, ``pending``, ``file``), and the agent
starts without it. Valid pending items are never lost with a damaged one: items are decoded first
and only what was decoded or quarantined is deleted.
"""

from __future__ import annotations

import io
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from agent.core import logs
from agent.core.sqlite_files import DamagedFile, move_aside, open_checked

STATE_FILE = "agent-state.sqlite3"
#: quarantined entries kept (the oldest are deleted beyond this)
QUARANTINE_KEEP = 100

log = logs.get("state")
T = TypeVar("T")


class StateStore:
    def __init__(self, directory: str | Path, on_quarantine: Callable[[str], None] = lambda _what: None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / STATE_FILE
        self.on_quarantine = on_quarantine
        self._lock = threading.Lock()
        try:
            self._db = open_checked(self.path, self._init)
        except DamagedFile as exc:
            self._move_aside(str(exc))
            self._db = open_checked(self.path, self._init)

    @staticmethod
    def _init(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated REAL)")
        db.execute(
            "CREATE TABLE IF NOT EXISTS pending "
            "(id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, payload BLOB NOT NULL, created REAL)"
        )
        db.execute(
            "CREATE TABLE IF NOT EXISTS quarantine (id INTEGER PRIMARY KEY AUTOINCREMENT, source TEXT NOT NULL,"
            " key TEXT, value BLOB, reason TEXT, created REAL)"
        )

    def _move_aside(self, why: str) -> None:
        """Rename the damaged file (and its WAL) aside, kept for inspection; log and count it."""
        moved = move_aside(self.path)
        log.error(
            "the state database is damaged; moved aside, starting with empty state",
            extra={"path": str(self.path), "moved_to": str(moved), "error": why},
        )
        self.on_quarantine("file")

    def _quarantine(self, what: str, source: str, key: str, value: Any, reason: str) -> None:
        """Move one entry that does not decode to ``quarantine`` (caller holds the lock, in a transaction)."""
        self._db.execute(
            "INSERT INTO quarantine(source, key, value, reason, created) VALUES(?, ?, ?, ?, ?)",
            (source, key, value, reason[:500], time.time()),
        )
        self._db.execute("DELETE FROM quarantine WHERE id <= (SELECT MAX(id) FROM quarantine) - ?", (QUARANTINE_KEEP,))
        log.error(
            "a damaged state entry was quarantined; starting without it",
            extra={"what": what, "key": key, "error": reason[:500]},
        )

    # -- documents --------------------------------------------------------------------------------
    def put_json(self, key: str, value: Any) -> None:
        text = json.dumps(value, separators=(",", ":"))
        with self._lock:
            self._db.execute(
                "INSERT INTO kv(key, value, updated) VALUES(?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value, updated=excluded.updated",
                (key, text, time.time()),
            )

    def get_json(self, key: str, check: Callable[[Any], object] | None = None, what: str = "document") -> Any | None:
        """The document under ``key``, or None. One that is not JSON, or that ``check`` refuses (raises),
        is quarantined (logged, reported as ``what``) and None returned: a damaged entry never fails
        a start."""
        with self._lock:
            row = self._db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            if row is None:
                return None
            damaged = False
            try:
                value = json.loads(row[0])
                if check is not None:
                    check(value)
            except Exception as exc:  # noqa: BLE001 - whatever garbage raises, it is quarantined
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._quarantine(what, "kv", key, row[0], f"{type(exc).__name__}: {exc}")
                    self._db.execute("DELETE FROM kv WHERE key = ?", (key,))
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                value, damaged = None, True
        if damaged:
            self.on_quarantine(what)
        return value

    # -- pending work -----------------------------------------------------------------------------
    def add_pending(self, kind: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> int:
        buf = io.BytesIO()
        payload: dict[str, Any] = {"__meta__": np.asarray(json.dumps(meta)), **arrays}
        np.savez(buf, allow_pickle=False, **payload)
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO pending(kind, payload, created) VALUES(?, ?, ?)", (kind, buf.getvalue(), time.time())
            )
            return int(cur.lastrowid or 0)

    def take_pending(
        self,
        decode: Callable[[str, dict[str, np.ndarray], dict[str, Any]], T],
        limit: int | None = None,
    ) -> list[T]:
        """Remove and return pending items (the oldest ``limit`` at most), each as ``decode(kind, arrays,
        meta)``. Items are decoded before anything is deleted: one that does not decode (or that
        ``decode`` refuses) is quarantined, the others are returned, and those beyond ``limit`` stay."""
        out: list[T] = []
        n_bad = 0
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = self._db.execute(
                    "SELECT id, kind, payload FROM pending ORDER BY id LIMIT ?", (-1 if limit is None else limit,)
                ).fetchall()
                for rid, kind, payload in rows:
                    try:
                        out.append(decode(str(kind), *_unpack(payload)))
                    except Exception as exc:  # noqa: BLE001 - whatever garbage raises, it is quarantined
                        self._quarantine("pending", "pending", str(rid), payload, f"{type(exc).__name__}: {exc}")
                        n_bad += 1
                if rows:
                    self._db.execute("DELETE FROM pending WHERE id <= ?", (rows[-1][0],))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        for _ in range(n_bad):
            self.on_quarantine("pending")
        return out

    def count_pending(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM pending").fetchone()[0])

    def count_quarantined(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM quarantine").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _unpack(payload: object) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and the metadata of one pending ``.npz`` payload (no pickles)."""
    if not isinstance(payload, bytes):
        raise ValueError(f"payload is {type(payload).__name__}, not bytes")
    with np.load(io.BytesIO(payload), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "__meta__"}
        meta = json.loads(str(z["__meta__"]))
    if not isinstance(meta, dict):
        raise ValueError("the metadata is not an object")
    return arrays, meta
