"""The prediction store under bad rows and a failing or damaged file: one request the store cannot
hold is dropped alone (the others of its flush are written), predictions lost to a failed write are
counted, and a damaged file or row is detected, logged and counted instead of read back as zeros."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from agent.labels.rows import PendingBatch
from agent.labels.store import STORE_FILE, PredictionStore


def batch(rid: str, n: int, ts: float, k: int = 3, seed: int = 0, identity: str = "m:b") -> PendingBatch:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k), n).astype(np.float32)
    return PendingBatch(rid, ts, identity, p, p.argmax(axis=1), rng.integers(0, 4, n).astype(np.int8))


class Counts:
    """What the store reported through ``on_error`` and ``on_drop``."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.dropped: dict[str, int] = {}

    def drop(self, n: int, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n


def store(path: Path | None, counts: Counts, **kw: int) -> PredictionStore:
    s = PredictionStore(
        path,
        max_predictions=kw.get("max_predictions", 100_000),
        max_age_seconds=1e12,  # nothing ages out (the batches are dated near the epoch)
        on_error=counts.errors.append,
        on_drop=counts.drop,
    )
    s.open()
    return s


def test_one_unencodable_id_drops_only_its_request(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A lone surrogate cannot be encoded as UTF-8: before, it failed the whole flush's transaction
    (every client's predictions of that second lost, nothing counted); now it alone is dropped."""
    c = Counts()
    s = store(tmp_path, c)
    s.enqueue(batch("good-1", 4, 10.0))
    s.enqueue(batch("bad\ud800", 3, 10.0))
    s.enqueue(batch("good-2", 5, 10.0, identity="m:\udcff"))  # a poisoned identity is dropped too
    s.enqueue(batch("good-3", 2, 10.0))
    with caplog.at_level(logging.WARNING, logger="icos_agent.labels"):
        assert s.flush(now=11.0) == 6
    assert c.dropped == {"invalid": 8} and c.errors == []
    assert s.rows == 6
    assert sum("cannot be written" in r.getMessage() for r in caplog.records) == 1  # one line per flush
    out = s.apply_labels([("good-1:0", 0), ("good-3:1", 1), ("bad\ud800:0", 0), ("good-2:0", 0)], now=12.0)
    assert out.n_accepted == 2
    assert out.unknown == ["bad\ud800:0", "good-2:0"]  # an unencodable label id is unknown, not a failure
    s.stop()


def test_arrays_of_inconsistent_lengths_drop_only_their_request(tmp_path: Path) -> None:
    c = Counts()
    s = store(tmp_path, c)
    good = batch("ok", 4, 10.0)
    bad = PendingBatch("odd", 10.0, "m:b", good.probabilities, good.predicted, good.verdicts[:2])
    s.enqueue(bad)
    s.enqueue(good)
    assert s.flush(now=11.0) == 4
    assert c.dropped == {"invalid": 4}
    assert s.apply_labels([("ok:3", 0)], now=12.0).n_accepted == 1
    s.stop()


def test_a_failed_write_is_counted_as_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SQLITE_FULL (the file may not grow: ``max_page_count``, as on a full disk) fails the write:
    its predictions are counted in ``dropped{reason=write_failed}`` and the writer goes on."""
    c = Counts()
    s = store(tmp_path, c)
    s.enqueue(batch("first", 2, 10.0))
    assert s.flush(now=11.0) == 2
    db = s._conn()
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.execute(f"PRAGMA max_page_count = {int(pages)}")
    for i in range(20):  # large requests need new pages
        s.enqueue(batch(f"big{i}", 500, 10.0, k=10, seed=i))
    with caplog.at_level(logging.WARNING, logger="icos_agent.labels"):
        assert s.flush(now=11.0) == 0
    assert c.dropped == {"write_failed": 10_000} and c.errors == ["write"]
    assert any("batch dropped" in r.getMessage() for r in caplog.records)
    assert s.rows == 2
    db.execute("PRAGMA max_page_count = 1073741823")  # space again: writes resume
    s.enqueue(batch("later", 3, 10.0))
    assert s.flush(now=11.0) == 3
    assert s.apply_labels([("first:1", 0), ("later:2", 0), ("big0:0", 0)], now=12.0).unknown == ["big0:0"]
    s.stop()


def test_a_write_to_a_closed_connection_is_counted(tmp_path: Path) -> None:
    c = Counts()
    s = store(tmp_path, c)
    s._conn().close()  # e.g. the file became unusable under the writer
    s.enqueue(batch("x", 7, 10.0))
    assert s.flush(now=11.0) == 0
    assert c.dropped == {"write_failed": 7} and "write" in c.errors


def _damage_a_page(path: Path) -> None:
    """Overwrite a b-tree page in the middle of the file with garbage (a torn or bit-rotten page)."""
    db = sqlite3.connect(path)
    (page_size,) = db.execute("PRAGMA page_size").fetchone()
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.close()
    assert pages > 4
    with path.open("r+b") as f:
        f.seek(page_size * (pages // 2))
        f.write(bytes([0x0D, 0xFF, 0xFF]) + b"\xa5" * (page_size - 3))


def test_a_damaged_file_is_moved_aside_at_open(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before, a damaged page read back as zeros without a word; now ``quick_check`` at open finds
    it: the file is moved aside (kept), counted as ``corrupt``, logged, and an empty store starts."""
    c = Counts()
    s = store(tmp_path, c)
    for i in range(40):
        s.enqueue(batch(f"r{i}", 100, 10.0, k=10, seed=i))
    s.flush(now=11.0)
    s.stop()
    _damage_a_page(tmp_path / STORE_FILE)
    c2 = Counts()
    with caplog.at_level(logging.ERROR, logger="icos_agent.labels"):
        s2 = store(tmp_path, c2)
    assert c2.errors == ["corrupt"]
    assert any("damaged" in r.getMessage() for r in caplog.records)
    assert s2.persistent and s2.rows == 0
    assert len(list(tmp_path.glob(STORE_FILE + ".corrupt-*"))) == 1
    s2.enqueue(batch("new", 3, 10.0))
    assert s2.flush(now=11.0) == 3
    s2.stop()


def test_a_file_that_is_no_database_is_moved_aside(tmp_path: Path) -> None:
    (tmp_path / STORE_FILE).write_bytes(b"not a database at all" * 100)
    c = Counts()
    s = store(tmp_path, c)
    assert c.errors == ["corrupt"] and s.persistent
    s.stop()


def test_a_row_whose_arrays_do_not_match_its_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    c = Counts()
    s = store(tmp_path, c)
    s.enqueue(batch("a", 4, 10.0))
    s.enqueue(batch("b", 4, 10.0))
    s.flush(now=11.0)
    s._conn().execute("UPDATE requests SET probs = x'0000' WHERE rid = 'a'")
    with caplog.at_level(logging.ERROR, logger="icos_agent.labels"):
        out = s.apply_labels([("a:1", 0), ("b:1", 0)], now=12.0)
    assert out.unknown == ["a:1"] and out.n_accepted == 1
    assert c.errors == ["corrupt"]
    assert any("damaged" in r.getMessage() for r in caplog.records)
    s.stop()
