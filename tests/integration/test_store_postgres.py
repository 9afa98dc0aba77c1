"""The prediction store in a real PostgreSQL (started by the ``postgres`` fixture): schema made on an
empty database and kept on re-open, retention, two agent processes sharing one database (a label
posted to either joins), and PostgreSQL stopped and started during traffic (serving never fails,
buffered writes land after recovery, counted). The URL's password never leaves the agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import pytest

from agent.data.datasets import Splits
from agent.labels.postgres_backend import SCHEMA_VERSION, migrate
from agent.labels.rows import PendingBatch
from agent.labels.store import PredictionStore
from agent.model.classifier import OnnxClassifier, default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.postgres import PostgresDatabase, PostgresServer
from tests.support.traffic import Clients
from tests.support.waiting import wait_until


def batch(rid: str, n: int, ts: float, k: int = 3, seed: int = 0) -> PendingBatch:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k), n).astype(np.float32)
    return PendingBatch(rid, ts, "m:b", p, p.argmax(axis=1), rng.integers(0, 4, n).astype(np.int8))


def pg_store(url: str, **kw: float) -> PredictionStore:
    s = PredictionStore(
        None,
        max_predictions=int(kw.get("max_predictions", 1000)),
        max_age_seconds=kw.get("max_age_seconds", 1e12),
        store_url=url,
    )
    s.open()
    s.backend.evict_interval = 0  # type: ignore[attr-defined]  # evict at every flush here
    return s


def test_schema_from_an_empty_database_reopen_and_retention(postgres: PostgresDatabase) -> None:  # noqa: F811
    s = pg_store(postgres.url, max_predictions=100)
    with psycopg.connect(postgres.url) as conn:
        assert conn.execute("SELECT MAX(version) FROM icos_store_schema").fetchone() == (SCHEMA_VERSION,)
        with conn.transaction():
            assert migrate(conn) == SCHEMA_VERSION  # applied once: a second run finds it current
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE 'icos_%'")}
    assert tables == {
        "icos_store_schema",
        "icos_requests",
        "icos_labels",
        "icos_calibration",
        "icos_store_counts",
        "icos_inputs",
    }
    for i in range(30):  # 150 predictions, 100 kept: the oldest whole requests go
        s.enqueue(batch(f"r{i}", 5, 100.0 + i, seed=i))
    assert s.flush(now=200.0) == 150
    assert (s.rows, s.labeled) == (100, 0)
    out = s.apply_labels([("r29:0", 1), ("r29:4", 0), ("r0:0", 1)], now=300.0)
    assert (out.n_accepted, out.unknown) == (2, ["r0:0"])  # r0 was evicted by count
    assert s.apply_labels([("r29:0", 2)], now=301.0).duplicate == ["r29:0"]
    s.enqueue(batch("r28", 2, 130.0))  # a request id used again replaces its predictions
    s.enqueue(batch("nul\x00id", 4, 130.0))  # text PostgreSQL cannot hold: dropped alone
    s.enqueue(batch("r29", 3, 130.0))  # and their labels
    assert s.flush(now=200.0) == 5
    assert (s.rows, s.labeled) == (95, 0)
    s.put_calibration("m:b", '{"calibration": {}}')
    s.stop()
    again = pg_store(postgres.url, max_predictions=100, max_age_seconds=1000.0)  # re-open: data kept
    assert (again.rows, again.labeled) == (95, 0)
    assert again.get_calibration("m:b") == '{"calibration": {}}'
    assert again.apply_labels([("r27:1", 1), ("r29:2", 0), ("r28:2", 0)], now=400.0).unknown == ["r28:2"]
    assert again.labeled_rows("m:b").n == 2
    assert again.evict(now=1115.0) == 25  # by age: r10..r14 (t < 115) of the r10..r29 kept
    assert again.rows == 70 and again.labeled == 2
    assert again.evict(now=10_000.0) == 70 and (again.rows, again.labeled) == (0, 0)  # labels go with them
    again.stop()


def _config(bundle: Path, durability: str = "batched") -> dict[str, object]:
    return {
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(bundle)},
        "windows": {"time": ["5m"], "count": 100000},
        "audits": {"reservoir": {"size": 0}},
        "labels": {"durability": durability, "flush_interval_seconds": 0.2, "fleet_refresh_seconds": 0.5},
    }


def test_two_replicas_share_predictions_and_labels(
    tmp_path: Path,
    postgres: PostgresDatabase,  # noqa: F811
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    mnist_model: OnnxClassifier,
) -> None:
    env = {"ICOS_AGENT_LABELS__STORE_URL": postgres.url}
    a = AgentProcess(tmp_path, _config(mnist_bundle_dir, "commit"), env).start()
    b = AgentProcess(tmp_path, _config(mnist_bundle_dir, "commit"), env).start()
    try:
        x, y = mnist_splits.test.x[:200], mnist_splits.test.y[:200]
        truth: dict[str, int] = {}
        row_of: dict[str, int] = {}
        for agent, tag in ((a, "a"), (b, "b")):
            clients = Clients(agent.url, "serve", x, x, n=2, per_request=5, prefix=tag, max_requests=10).start()
            clients.finish()
            assert not clients.acked.refused
            for per in clients.acked.ids:
                for pid in per:
                    rid, _, i = pid.rpartition(":")
                    c, k = rid[len(tag) :].split("-")
                    row_of[pid] = (int(c) * 7919 + int(k) * 5 + int(i)) % len(y)
                    truth[pid] = int(y[row_of[pid]])
        assert len(truth) == 200
        # every label goes to the *other* replica than the one that served the prediction
        to_b = [{"id": i, "label": t} for i, t in truth.items() if i.startswith("a")]
        to_a = [{"id": i, "label": t} for i, t in truth.items() if i.startswith("b")]
        for agent, labels in ((b, to_b), (a, to_a)):
            r = httpx.post(f"{agent.url}/v1/labels", json={"labels": labels}, timeout=30)
            assert r.status_code == 200 and r.json()["accepted"] == 100 and r.json()["unknown"] == 0, r.text
        predicted = mnist_model.predict(x).predicted
        accuracy = float(np.mean([predicted[r] == y[r] for r in row_of.values()]))  # over both replicas' predictions

        def fleet_realized(agent: AgentProcess) -> bool:
            w = httpx.get(f"{agent.url}/v1/estimates", timeout=10).json()["windows"]["last100000"]["realized"]
            return bool(w.get("n") == 200)

        for agent in (a, b):  # each replica's realized window holds the whole fleet's labels
            assert wait_until(lambda agent=agent: fleet_realized(agent), timeout=30)
            w = httpx.get(f"{agent.url}/v1/estimates", timeout=10).json()["windows"]["last100000"]["realized"]
            assert w["accuracy"]["value"] == pytest.approx(accuracy)

            def store_status(agent: AgentProcess = agent) -> dict[str, Any]:
                return dict(httpx.get(f"{agent.url}/v1/labels", timeout=10).json()["store"])

            # the fleet's counts, as of the last eviction pass (every 10 s)
            # (the other replica's labels reach this one's counts on its next pass: wait for both)
            assert wait_until(
                lambda: (store_status()["predictions"], store_status()["labeled"]) == (200, 200), timeout=30
            )
            status = store_status()
            assert status["backend"] == "postgresql"
            assert PostgresServer.PASSWORD not in str(status) and "***" in status["location"]
            assert PostgresServer.PASSWORD not in httpx.get(f"{agent.url}/metrics", timeout=10).text
    finally:
        a.terminate()
        b.terminate()
    for agent in (a, b):
        assert PostgresServer.PASSWORD not in agent.log()


def test_postgres_outage_during_traffic_is_buffered_and_recovered(
    tmp_path: Path,
    postgres: PostgresDatabase,  # noqa: F811
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
) -> None:
    url_file = tmp_path / "store-url"
    url_file.write_text(postgres.url + "\n")
    cfg = _config(mnist_bundle_dir)
    cfg["labels"] = {**cfg["labels"], "store_url_file": str(url_file)}  # type: ignore[dict-item]
    agent = AgentProcess(tmp_path, cfg).start()
    x = mnist_splits.test.x[:300]
    clients = Clients(agent.url, "serve", x, x, n=3, max_requests=100_000, max_seconds=120).start()
    try:
        assert wait_until(lambda: clients.count() >= 100, timeout=30)
        postgres.stop()
        during = clients.count()
        assert wait_until(lambda: agent.metrics().get("icos_prediction_store_buffered_total", 0) > 0, timeout=30)
        assert wait_until(lambda: clients.count() >= during + 200, timeout=60)  # serving goes on
        assert agent.metrics()["icos_prediction_store_reachable"] == 0
        postgres.start()
        restarted = clients.count()
        assert wait_until(lambda: clients.count() > restarted, timeout=30)  # served after the restart too
        clients.join()
        assert wait_until(
            lambda: (
                (m := agent.metrics())["icos_prediction_store_queued"] == 0
                and m["icos_prediction_store_reachable"] == 1
            ),
            timeout=90,
        )
        m = agent.metrics()
        assert m.get("icos_prediction_store_dropped_total{reason=queue_full}", 0) == 0
        assert m.get("icos_prediction_store_dropped_total{reason=write_failed}", 0) == 0
    finally:
        clients.join()
        agent.terminate()
    acked = clients.acked
    assert not acked.refused, acked.refused  # serving never failed
    with psycopg.connect(postgres.url) as conn:
        stored = {r[0] for r in conn.execute("SELECT rid FROM icos_requests")}
    assert {pid.rpartition(":")[0] for pid in acked.all_ids()} <= stored  # nothing acknowledged was lost
    assert PostgresServer.PASSWORD not in agent.log()


def test_commit_mode_refuses_with_503_while_postgres_is_down(
    tmp_path: Path,
    postgres: PostgresDatabase,  # noqa: F811
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
) -> None:
    cfg = _config(mnist_bundle_dir, "commit")
    agent = AgentProcess(tmp_path, cfg, {"ICOS_AGENT_LABELS__STORE_URL": postgres.url}).start()
    x = mnist_splits.test.x[:4]
    body = {
        "id": "first",
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
    }
    try:
        assert httpx.post(f"{agent.url}/v2/models/mnist/infer", json=body, timeout=30).status_code == 200
        postgres.stop()
        r = httpx.post(f"{agent.url}/v2/models/mnist/infer", json={**body, "id": "during"}, timeout=60)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert "prediction store" in r.json()["error"]
        assert agent.metrics()["icos_invalid_requests_total{reason=prediction_store_unavailable}"] >= 1
        postgres.start()

        def answered() -> bool:
            return (
                httpx.post(f"{agent.url}/v2/models/mnist/infer", json={**body, "id": "after"}, timeout=60).status_code
                == 200
            )

        assert wait_until(answered, timeout=90, interval=1.0)
    finally:
        agent.terminate()
