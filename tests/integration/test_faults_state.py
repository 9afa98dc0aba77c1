"""The state directory turns read-only or fills up while the agent serves: serving goes on, the
``icos_state_writable`` gauge drops to 0 and ``icos_state_write_failures_total`` grows, one log line
says so, and once the directory is writable again the state is saved (and restored at restart).
Damaged state (a windows document, a pending item, the whole file) is quarantined at start: the
agent comes up ready without it and counts it in ``icos_state_quarantined_total{what}``.

The read-only and full cases use real mounts (a read-only bind mount, a small tmpfs), so they need
root (requirement ``mount``).
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import httpx
import numpy as np
import pytest

from agent.data.datasets import Splits
from agent.dataplane.observe import ObserveItem
from agent.judging.state import STATE_FILE, StateStore
from agent.model.classifier import default_model_path
from agent.model.inputs import Inputs
from tests.support.agent_process import AgentProcess
from tests.support.mounts import mount, umount
from tests.support.v2 import verdict_body
from tests.support.waiting import wait_until


def _config(bundle: Path, state: Path) -> dict[str, object]:
    return {
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(bundle)},
        "state_dir": str(state),
        "state": {"flush_interval_seconds": 0.3},
        "windows": {"time": ["5m"], "count": 100000},
        "audits": {"reservoir": {"size": 0}, "mlflow": {"enabled": False}},
    }


def _serve_some(agent: AgentProcess, x: object, n: int) -> int:
    with httpx.Client(timeout=30) as c:
        for _ in range(n):
            r = c.post(f"{agent.url}/v2/models/mnist/infer", json=verdict_body(x))
            assert r.status_code == 200, r.text
    return n


def _agent(tmp_path: Path, bundle: Path, state: Path) -> AgentProcess:
    return AgentProcess(tmp_path, _config(bundle, state))


def _restart_total(tmp_path: Path, bundle: Path, state: Path) -> int:
    with _agent(tmp_path, bundle, state) as again:
        return int(httpx.get(f"{again.url}/v1/estimates").json()["total_judged"])


@pytest.mark.needs("mount")
def test_read_only_state_dir(tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    """A read-only volume (a file system cannot turn read-only under open writers, so it is read-only
    from the start): the agent serves, says so, and saves as soon as the volume is writable."""
    src, state = tmp_path / "src", tmp_path / "state"
    src.mkdir()
    state.mkdir()
    mount("--bind", str(src), str(state))
    mount("-o", "remount,bind,ro", str(state))
    try:
        x = mnist_splits.test.x[:4]
        with _agent(tmp_path, mnist_bundle_dir, state) as agent:
            sent = _serve_some(agent, x, 5) * 4  # serving goes on
            assert wait_until(lambda: agent.metrics().get("icos_state_writable") == 0.0, 10), agent.log()[-2000:]
            assert wait_until(lambda: agent.metrics()["icos_state_write_failures_total"] >= 3, 10)
            sent += _serve_some(agent, x, 5) * 4
            assert wait_until(lambda: "saving state failed" in agent.log(), 5)
            assert agent.log().count("saving state failed") == 1  # one line per outage, not per flush
            mount("-o", "remount,bind,rw", str(state))
            assert wait_until(lambda: agent.metrics().get("icos_state_writable") == 1.0, 10), agent.log()[-2000:]
            assert wait_until(lambda: "saving state recovered" in agent.log(), 5)
            sent += _serve_some(agent, x, 5) * 4
            assert agent.terminate() == 0
        assert _restart_total(tmp_path, mnist_bundle_dir, state) == sent
    finally:
        umount(state)


@pytest.mark.needs("mount")
def test_full_state_dir(tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    state = tmp_path / "state"
    state.mkdir()
    mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(state))
    try:
        x = mnist_splits.test.x[:4]
        with _agent(tmp_path, mnist_bundle_dir, state) as agent:
            filler = state / "filler"
            with contextlib.suppress(OSError), filler.open("wb") as f:
                for _ in range(1024):  # 64 MiB: the 4 MiB file system is full long before
                    f.write(b"\0" * 65536)
                    f.flush()
            sent = 0
            for _ in range(40):  # new windows need new pages: writes fail on the full file system
                sent += _serve_some(agent, x, 2) * 4
                if agent.metrics().get("icos_state_writable") == 0.0:
                    break
            assert agent.metrics().get("icos_state_writable") == 0.0, agent.log()[-2000:]
            assert wait_until(lambda: "saving state failed" in agent.log(), 5)
            sent += _serve_some(agent, x, 5) * 4
            filler.unlink()
            assert wait_until(lambda: agent.metrics().get("icos_state_writable") == 1.0, 10), agent.log()[-2000:]
            assert wait_until(lambda: "saving state recovered" in agent.log(), 5)
            assert agent.terminate() == 0
        assert _restart_total(tmp_path, mnist_bundle_dir, state) == sent
    finally:
        umount(state)


def _corrupt(state: Path, sql: str, *args: object) -> None:
    db = sqlite3.connect(state / STATE_FILE)
    try:
        db.execute(sql, args)
        db.commit()
    finally:
        db.close()


def _total(agent: AgentProcess) -> int:
    return int(httpx.get(f"{agent.url}/v1/estimates", timeout=30).json()["total_judged"])


def test_damaged_windows_are_quarantined_at_start(tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    """Before, a windows document that was not JSON made every start exit 3 (a crash loop). Now it
    is quarantined (one log line, ``icos_state_quarantined_total{what="windows"}``), the agent comes
    up ready with empty windows, and saves (and restores) them again."""
    state = tmp_path / "state"
    x = mnist_splits.test.x[:4]
    with _agent(tmp_path, mnist_bundle_dir, state) as agent:
        _serve_some(agent, x, 3)
        assert agent.terminate() == 0
    _corrupt(state, "UPDATE kv SET value = ? WHERE key LIKE 'windows:%'", '{"identity": "x", "windows": {"ti')
    with _agent(tmp_path, mnist_bundle_dir, state) as agent:
        assert _total(agent) == 0
        assert agent.metrics()["icos_state_quarantined_total{what=windows}"] == 1
        assert agent.log().count("quarantined") == 1
        sent = _serve_some(agent, x, 2) * 4
        assert agent.terminate() == 0
    assert _restart_total(tmp_path, mnist_bundle_dir, state) == sent


def test_windows_that_do_not_restore_are_quarantined(
    tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits
) -> None:
    """Valid JSON of the wrong shape (here: of this model, windows a list) is quarantined too."""
    state = tmp_path / "state"
    with _agent(tmp_path, mnist_bundle_dir, state) as agent:
        _serve_some(agent, mnist_splits.test.x[:4], 1)
        assert agent.terminate() == 0
    _corrupt(
        state,
        "UPDATE kv SET value = json_set(value, '$.windows.time', json('[1, 2]')) WHERE key LIKE 'windows:%'",
    )
    with _agent(tmp_path, mnist_bundle_dir, state) as agent:
        assert _total(agent) == 0
        assert agent.metrics()["icos_state_quarantined_total{what=windows}"] == 1


def test_a_damaged_state_file_is_moved_aside_at_start(tmp_path: Path, mnist_bundle_dir: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / STATE_FILE).write_bytes(b"no database here" * 512)
    with _agent(tmp_path, mnist_bundle_dir, state) as agent:
        assert agent.metrics()["icos_state_quarantined_total{what=file}"] == 1
        assert wait_until(lambda: agent.metrics().get("icos_state_writable") == 1.0, 10)  # saves again
    assert len(list(state.glob(STATE_FILE + ".corrupt-*"))) == 1


def test_observe_pending_keeps_valid_items_past_a_damaged_one(
    tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits
) -> None:
    """Before, one garbage ``pending`` row failed the start, and the rows were deleted before they
    were decoded (the valid ones lost). Now the garbage is quarantined and the valid ones judged."""
    state = tmp_path / "state"
    x = mnist_splits.test.x[:4]
    probs = np.full((4, 10), 0.1, dtype=np.float32)
    store = StateStore(state)
    for i in range(2):
        store.add_pending("observe", *ObserveItem(f"ok-{i}", Inputs({"input": x}), probs, None, 1.0).to_arrays())
    store.close()
    _corrupt(state, "INSERT INTO pending(kind, payload, created) VALUES('observe', ?, 0)", b"PK\x03\x04 torn")
    cfg = {**_config(mnist_bundle_dir, state), "mode": "observe"}
    agent = AgentProcess(tmp_path, cfg).start()
    try:
        assert wait_until(lambda: _total(agent) == 8, 20), agent.log()[-2000:]
        assert agent.metrics()["icos_state_quarantined_total{what=pending}"] == 1
    finally:
        agent.kill()
