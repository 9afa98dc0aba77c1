"""The state database under damage: a document that does not decode, a pending item that does not
decode and a damaged file are quarantined (logged, reported) and the store opens without them;
valid pending items are never lost with a damaged one."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.judging.state import STATE_FILE, StateStore


def _raw(path: Path, sql: str, *args: object) -> None:
    db = sqlite3.connect(path / STATE_FILE)
    db.execute(sql, args)
    db.commit()
    db.close()


def _item(kind: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> tuple[str, int, str]:
    return kind, int(arrays["x"].sum()), str(meta["id"])


def test_a_document_that_is_not_json_is_quarantined(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []
    s = StateStore(tmp_path, seen.append)
    s.put_json("windows:m", {"ok": 1})
    s.close()
    _raw(tmp_path, "UPDATE kv SET value = ? WHERE key = ?", '{"identity": "m", "windows": {tru', "windows:m")
    with caplog.at_level(logging.ERROR, logger="icos_agent"):
        s = StateStore(tmp_path, seen.append)
        assert s.get_json("windows:m", what="windows") is None
    assert seen == ["windows"] and s.count_quarantined() == 1
    assert sum("quarantined" in r.getMessage() for r in caplog.records) == 1
    assert s.get_json("windows:m") is None and seen == ["windows"]  # moved: reported once
    s.put_json("windows:m", {"ok": 2})
    assert s.get_json("windows:m") == {"ok": 2}
    s.close()


def test_a_document_its_check_refuses_is_quarantined(tmp_path: Path) -> None:
    seen: list[str] = []
    s = StateStore(tmp_path, seen.append)
    s.put_json("k", {"windows": "not a mapping"})
    s.put_json("fine", None)

    def check(value: Any) -> None:
        if not isinstance(value["windows"], dict):
            raise TypeError("windows is not a mapping")

    assert s.get_json("k", check, "windows") is None
    assert s.get_json("fine") is None and seen == ["windows"]  # a stored null is no damage
    s.close()


def test_take_pending_decodes_first_and_keeps_valid_items(tmp_path: Path) -> None:
    """Before, the rows were deleted and committed before decoding: one garbage row raised and lost
    every valid one. Now the garbage is quarantined and the valid ones returned, in order."""
    seen: list[str] = []
    s = StateStore(tmp_path, seen.append)
    s.add_pending("observe", {"x": np.ones(3)}, {"id": "a"})
    s.close()
    _raw(tmp_path, "INSERT INTO pending(kind, payload, created) VALUES('observe', ?, 0)", b"garbage, not an npz")
    s = StateStore(tmp_path, seen.append)
    s.add_pending("observe", {"x": np.ones(5)}, {"id": "b"})
    s.add_pending("observe", {"y": np.ones(5)}, {"id": "no x"})  # decode refuses it (KeyError)
    assert s.take_pending(_item) == [("observe", 3, "a"), ("observe", 5, "b")]
    assert seen == ["pending", "pending"] and s.count_quarantined() == 2
    assert s.count_pending() == 0
    s.close()


def test_take_pending_leaves_what_is_over_the_limit(tmp_path: Path) -> None:
    s = StateStore(tmp_path)
    for i in range(5):
        s.add_pending("observe", {"x": np.full(1, i)}, {"id": str(i)})
    assert [r[2] for r in s.take_pending(_item, limit=3)] == ["0", "1", "2"]
    assert s.count_pending() == 2
    assert [r[2] for r in s.take_pending(_item)] == ["3", "4"]
    s.close()


def test_a_damaged_file_is_moved_aside(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_bytes(b"this is no SQLite database" * 200)
    seen: list[str] = []
    s = StateStore(tmp_path, seen.append)
    assert seen == ["file"]
    assert len(list(tmp_path.glob(STATE_FILE + ".corrupt-*"))) == 1
    s.put_json("k", [1])
    assert s.get_json("k") == [1]
    s.close()
