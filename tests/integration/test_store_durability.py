"""``labels.durability`` under SIGKILL, with the agent as a real process and concurrent clients.

``commit``: every prediction id the agent acknowledged is in the store after the kill, and its label
joins after the restart. ``batched``: what is lost is only each client's tail that was not yet
committed (the ``icos_prediction_store_queued`` gauge's window), all of it answered within one flush
interval (plus the judge's and writer's own time, 5 s on a loaded machine) before the kill."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from agent.data.datasets import Splits
from agent.labels.store import STORE_FILE
from agent.model.classifier import OnnxClassifier, default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.traffic import Clients
from tests.support.waiting import wait_until

FLUSH = 1.0


def _config(mode: str, durability: str, bundle: Path, state: Path) -> dict[str, object]:
    cfg: dict[str, object] = {
        "mode": mode,
        "bundle": {"path": str(bundle)},
        "state_dir": str(state),
        "windows": {"time": ["5m"], "count": 100000},
        "audits": {"reservoir": {"size": 0}},
        "labels": {"durability": durability, "flush_interval_seconds": FLUSH},
    }
    if mode == "serve":
        cfg["model"] = {"name": "mnist", "path": str(default_model_path())}
    else:
        cfg["model"] = {"name": "mnist"}
    return cfg


def _stored_rids(state: Path) -> set[str]:
    db = sqlite3.connect(state / STORE_FILE)
    try:
        return {str(r[0]) for r in db.execute("SELECT rid FROM requests")}
    finally:
        db.close()


@pytest.mark.parametrize("mode", ["serve", "observe"])
@pytest.mark.parametrize("durability", ["commit", "batched"])
def test_sigkill_loses_no_acknowledged_prediction_in_commit_mode(
    tmp_path: Path,
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    mnist_model: OnnxClassifier,
    mode: str,
    durability: str,
) -> None:
    state = tmp_path / "state"
    x, y = mnist_splits.test.x[:500], mnist_splits.test.y[:500]
    probs = mnist_model.predict(x).probabilities
    cfg = _config(mode, durability, mnist_bundle_dir, state)
    agent = AgentProcess(tmp_path, cfg).start()
    clients = Clients(agent.url, mode, x, probs).start()
    try:
        assert wait_until(lambda: clients.count() >= 200, timeout=60), "no traffic acknowledged"
        assert "icos_prediction_store_queued" in agent.metrics()
        agent.proc.kill()  # type: ignore[union-attr]  # SIGKILL in the middle of traffic
        killed_at = time.monotonic()
        agent.proc.wait(timeout=30)  # type: ignore[union-attr]
    finally:
        clients.join()
        agent.kill()
    acked = clients.acked
    assert not acked.refused, acked.refused
    stored = _stored_rids(state)
    lost = [
        (c, j) for c, per in enumerate(acked.ids) for j, pid in enumerate(per) if pid.rpartition(":")[0] not in stored
    ]
    if durability == "commit":
        assert lost == []
    else:
        for c, per in enumerate(acked.ids):  # only each client's uncommitted tail, of the last flush interval
            tail = sorted(j for cc, j in lost if cc == c)
            assert tail == list(range(len(per) - len(tail), len(per)))
            assert all(acked.times[c][j] >= killed_at - FLUSH - 5.0 for j in tail)
    # restart on the same state directory: the labels of the stored predictions join
    again = AgentProcess(tmp_path, cfg).start()
    try:
        ids = acked.all_ids()
        truth = {pid: int(y[hash(pid) % len(y)]) for pid in ids}
        accepted = unknown = 0
        for first in range(0, len(ids), 5000):
            chunk = ids[first : first + 5000]
            r = httpx.post(
                f"{again.url}/v1/labels", json={"labels": [{"id": i, "label": truth[i]} for i in chunk]}, timeout=60
            )
            assert r.status_code == 200, r.text
            accepted += r.json()["accepted"]
            unknown += r.json()["unknown"]
        assert accepted == len(ids) - len(lost) and unknown == len(lost)
        if durability == "commit":
            assert accepted == len(ids) > 0
    finally:
        again.kill()
