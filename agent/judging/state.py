"""The sidecar's persistent state: one SQLite database (WAL) in the state directory.

Two tables: ``kv`` holds JSON documents (the estimator windows of each model), ``pending`` holds work
accepted but not yet judged (observe mode), as NumPy ``.npz`` archives written and read with
``allow_pickle=False``. Safe to use from several threads.
"""

from __future__ import annotations

import io
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

STATE_FILE = "agent-state.sqlite3"


class StateStore:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / STATE_FILE
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated REAL)")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS pending "
            "(id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, payload BLOB NOT NULL, created REAL)"
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

    def get_json(self, key: str) -> Any | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

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

    def take_pending(self) -> list[tuple[str, dict[str, np.ndarray], dict[str, Any]]]:
        """Remove and return every pending item, oldest first."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = self._db.execute("SELECT id, kind, payload FROM pending ORDER BY id").fetchall()
                self._db.execute("DELETE FROM pending")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        out = []
        for _id, kind, payload in rows:
            with np.load(io.BytesIO(payload), allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files if k != "__meta__"}
                meta = json.loads(str(z["__meta__"]))
            out.append((str(kind), arrays, meta))
        return out

    def count_pending(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM pending").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
