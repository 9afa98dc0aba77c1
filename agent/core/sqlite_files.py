"""SQLite files the agent keeps in its state directory (the state database, the prediction store).

Both open the same way: WAL, ``synchronous=NORMAL``, and ``PRAGMA quick_check`` first, so that a file
damaged by a crash or a full disk is recognised at open instead of reading back garbage later. A damaged
file is renamed aside (:func:`move_aside`), kept for inspection, and the caller starts an empty one.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from agent.errors import DamagedData


class DamagedFile(DamagedData):
    """The SQLite file is damaged (the message says how): move it aside and start anew."""


def connect(target: str) -> sqlite3.Connection:
    """A connection in autocommit mode, shareable across threads (callers hold their own lock)."""
    return sqlite3.connect(target, check_same_thread=False, isolation_level=None, timeout=10.0)


def open_checked(path: Path, init: Callable[[sqlite3.Connection], None]) -> sqlite3.Connection:
    """Open ``path`` (WAL), check it with ``PRAGMA quick_check`` and run ``init`` (the schema).

    Raises :class:`DamagedFile` for a damaged file or one that is no database; ``sqlite3.OperationalError``
    (locked, read-only, full: not damage) passes through for the caller to report."""
    db = connect(str(path))
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        (check,) = db.execute("PRAGMA quick_check(1)").fetchone()
        if check != "ok":
            raise DamagedFile(f"quick_check: {check}")
        init(db)
    except sqlite3.OperationalError:
        db.close()
        raise
    except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
        db.close()
        raise DamagedFile(str(exc)) from exc
    except BaseException:
        db.close()
        raise
    return db


def move_aside(path: Path) -> Path:
    """Rename ``path`` and its WAL files to ``<name>.corrupt-<time>``; returns the file's new path."""
    suffix = f".corrupt-{int(time.time())}"
    for part in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if part.exists():
            part.rename(part.with_name(part.name + suffix))
    return path.with_name(path.name + suffix)
