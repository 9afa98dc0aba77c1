"""SIGKILL: after a hard kill the state database is intact (SQLite WAL), the windows restart from the
last flush, and audit runs spooled for an unreachable MLflow are still pending after the restart."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import httpx
import numpy as np

from agent.data.datasets import Splits
from agent.judging.state import STATE_FILE
from agent.model.classifier import default_model_path
from exporters.spool import decode
from tests.support.agent_process import AgentProcess
from tests.support.ports import free_port
from tests.support.v2 import verdict_body
from tests.support.waiting import wait_until

TOKEN = "crash-test-token"


def _config(bundle: Path, state: Path, reference: Path) -> dict[str, object]:
    return {
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(bundle)},
        "state_dir": str(state),
        "state": {"flush_interval_seconds": 0.2},
        "windows": {"time": ["5m", "1h"], "count": 100000},
        "audits": {
            "reservoir": {"size": 0},
            "reference": {"path": str(reference)},
            "dscore": {"interval": "24h", "max_samples": 100, "n": 2, "time_budget": "5m"},
            "mlflow": {"tracking_uri": f"http://127.0.0.1:{free_port()}", "experiment": "crash"},
        },
    }


def _integrity(state: Path) -> str:
    db = sqlite3.connect(state / STATE_FILE)
    try:
        return str(db.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        db.close()


def test_sigkill_keeps_windows_and_spool(tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    state = tmp_path / "state"
    reference = tmp_path / "reference.npz"
    np.savez(reference, x=mnist_splits.test.x[:100], y=mnist_splits.test.y[:100])
    cfg = _config(mnist_bundle_dir, state, reference)
    env = {"ICOS_AGENT_ADMIN_TOKEN": TOKEN}
    x = mnist_splits.test.x[:5]

    agent = AgentProcess(tmp_path, cfg, env).start()
    try:
        with httpx.Client(timeout=30) as c:
            for _ in range(20):
                assert c.post(f"{agent.url}/v2/models/mnist/infer", json=verdict_body(x)).status_code == 200
            auth = {"Authorization": f"Bearer {TOKEN}"}
            out = c.post(f"{agent.url}/v1/audits/dscore?wait=true", headers=auth, timeout=300).json()
        assert out["status"] == "success" and out["mlflow"]["spooled"] is True, out
        # wait for a flush of all 100 predictions, then kill hard
        assert wait_until(lambda: agent.metrics().get("icos_state_last_write_timestamp_seconds", 0) > 0, 10)
        assert wait_until(lambda: _saved_total(state) == 100, 10)
        agent.proc.kill()  # type: ignore[union-attr]
        agent.proc.wait(timeout=30)  # type: ignore[union-attr]
    finally:
        agent.kill()

    assert _integrity(state) == "ok"
    spooled = sorted((state / "mlflow-spool").glob("*.json"))
    assert len(spooled) == 1
    _, record = decode(spooled[0].read_bytes())  # complete and parseable
    assert record.record_id == out["id"] or record.record_id

    again = AgentProcess(tmp_path, cfg, env).start()
    try:
        est = httpx.get(f"{again.url}/v1/estimates").json()
        assert est["total_judged"] == 100
        assert all(w["n"] == 100 for w in est["windows"].values())
        # the spooled run is still queued for MLflow (the flush job delivers it once MLflow answers)
        assert [p.name for p in (state / "mlflow-spool").glob("*.json")] == [spooled[0].name]

        # a kill in the middle of traffic: the database stays consistent, nothing judged twice
        ok = [0]
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(timeout=30) as c:
                while not stop.is_set():
                    try:
                        r = c.post(f"{again.url}/v2/models/mnist/infer", json=verdict_body(x))
                    except httpx.HTTPError:
                        return
                    ok[0] += r.status_code == 200

        threads = [threading.Thread(target=load) for _ in range(3)]
        for t in threads:
            t.start()
        assert wait_until(lambda: ok[0] >= 30, 30)
        again.proc.kill()  # type: ignore[union-attr]
        again.proc.wait(timeout=30)  # type: ignore[union-attr]
        stop.set()
        for t in threads:
            t.join(timeout=30)
    finally:
        again.kill()
    assert _integrity(state) == "ok"
    third = AgentProcess(tmp_path, cfg, env).start()
    try:
        total = httpx.get(f"{third.url}/v1/estimates").json()["total_judged"]
        assert 100 <= total <= 100 + ok[0] * 5
    finally:
        third.kill()


def _saved_total(state: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{state / STATE_FILE}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM kv WHERE key = 'windows:mnist'").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return -1
    if row is None:
        return 0
    return int(json.loads(row[0])["windows"].get("total", -1))
