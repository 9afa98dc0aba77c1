"""``labels.durability: commit`` in the prediction store itself: one commit answers every request
waiting for it (group commit), a request whose predictions cannot be stored is told so, and the
settings that choose the store keep the PostgreSQL URL's password out of the config file."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent.config.settings import load_settings
from agent.errors import UserError
from agent.labels.rows import PendingBatch
from agent.labels.store import PredictionStore

URL = "postgresql://icos:pw-5f1d@db.example:5432/icos"


def batch(rid: str, n: int = 2, ts: float = 10.0) -> PendingBatch:
    p = np.full((n, 3), 1 / 3, dtype=np.float32)
    return PendingBatch(rid, ts, "m:b", p, np.zeros(n, np.int64), np.zeros(n, np.int8))


async def _until(condition: Callable[[], bool], turns: int = 1000) -> None:
    """Let the loop run (other tasks reach their first wait) until ``condition`` holds, bounded in turns."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def test_one_commit_answers_every_waiting_request(tmp_path: Path) -> None:
    s = PredictionStore(tmp_path, max_predictions=1000, max_age_seconds=1e12, flush_interval=60, durability="commit")
    s.open()
    commits: list[int] = []
    write = s.backend.write

    def counted(batches: list[PendingBatch]) -> int:
        commits.append(len(batches))
        return write(batches)

    s.backend.write = counted  # type: ignore[method-assign]

    async def scenario() -> list[bool]:
        waiting = [asyncio.create_task(s.committed(f"r{i}", timeout=30)) for i in range(20)]
        await _until(lambda: len(s.commits.waiting()) == 20)  # all twenty wait
        for i in range(20):
            s.enqueue(batch(f"r{i}"))
        s.flush()  # the writer's next commit
        return await asyncio.gather(*waiting)

    assert asyncio.run(scenario()) == [True] * 20
    assert commits == [20] and s.rows == 40
    s.stop()


def test_a_request_is_told_when_its_predictions_are_not_stored(tmp_path: Path) -> None:
    s = PredictionStore(tmp_path, max_predictions=1000, max_age_seconds=1e12, queue_limit=1000, durability="commit")
    s.open()

    async def scenario() -> tuple[bool, bool, bool, bool]:
        bad = asyncio.create_task(s.committed("bad\ud800", timeout=30))
        late = asyncio.create_task(s.committed("never-sent", timeout=0.2))
        await _until(lambda: {"bad\ud800", "never-sent"} <= set(s.commits.waiting()))
        s.enqueue(batch("bad\ud800"))  # text no database can hold: dropped as invalid
        s.enqueue(batch("good"))
        s.flush()
        good = await s.committed("good", timeout=30)  # committed before it asked: still answered
        s.enqueue(batch("too-big", n=2000))  # over queue_limit: dropped at once
        too_big = await s.committed("too-big", timeout=30)
        return await bad, good, await late, too_big

    assert asyncio.run(scenario()) == (False, True, False, False)
    s.stop()


def test_the_store_url_comes_from_the_environment_or_a_file_never_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = {"model": {"path": "m.onnx"}, "bundle": {"path": "b"}}
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"model: {{path: m.onnx}}\nbundle: {{path: b}}\nlabels: {{store_url: '{URL}'}}\n")
    with pytest.raises(UserError, match="ICOS_AGENT_LABELS__STORE_URL") as err:
        load_settings(cfg)
    assert "pw-5f1d" not in str(err.value)
    monkeypatch.setenv("ICOS_AGENT_LABELS__STORE_URL", URL)
    s = load_settings(None, **base)
    assert s.labels.database_url() == URL and "pw-5f1d" not in repr(s) and "pw-5f1d" not in s.model_dump_json()
    monkeypatch.delenv("ICOS_AGENT_LABELS__STORE_URL")
    (tmp_path / "url").write_text(URL + "\n")
    cfg.write_text("model: {path: m.onnx}\nbundle: {path: b}\nlabels: {store_url_file: url}\n")
    assert load_settings(cfg).labels.database_url() == URL  # relative to the config file
    with pytest.raises(Exception, match="postgresql://"):
        load_settings(None, **base, labels={"store_url": "mysql://x@db/icos"})
    assert load_settings(None, **base).labels.database_url() is None  # SQLite in the state directory
