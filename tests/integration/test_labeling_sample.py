"""The labeling sample: predictions drawn uniformly at random (``labels.sample_rate``), kept with their
request in the prediction store (SQLite and a real PostgreSQL alike, older stores migrated), listed by
``GET /v1/labels/requests`` until labeled, and the estimator ``with_labels`` that their labels give every
time window of a served agent (``/v1/estimates`` and Prometheus), exactly the prediction-powered
accuracy of the window from the sampled labels."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from agent.cli import main as cli_main
from agent.data.datasets import Splits
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.active import active_accuracy
from agent.estimation.estimators.prediction_powered import WITH_LABELS, prediction_powered_accuracy
from agent.labels.postgres_backend import MIGRATIONS, SCHEMA_VERSION
from agent.labels.rows import split_prediction_id
from agent.labels.store import STORE_FILE, PredictionStore
from agent.server.app import create_app
from invariants.bundle import Bundle
from tests.support.batches import batch
from tests.support.inprocess import RunningServer
from tests.support.metrics import scrape
from tests.support.postgres import PostgresDatabase
from tests.support.settings import stateful_settings
from tests.support.v2 import post_labels, send_traffic
from tests.support.waiting import wait_until


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = request.getfixturevalue("postgres").url if request.param == "postgresql" else None
    s = PredictionStore(tmp_path, max_predictions=20, max_age_seconds=1e12, store_url=url)
    s.open()
    if url is not None:
        s.backend.evict_interval = 0  # type: ignore[attr-defined]  # evict at every flush here
    yield s
    s.stop()


def test_the_sample_is_stored_listed_until_labeled_and_flagged_on_labels(store: PredictionStore) -> None:
    store.enqueue(batch("a", 4, 100.0, [1, 3]))
    store.enqueue(batch("b", 3, 101.0, None))  # none of its predictions was drawn
    store.enqueue(batch("c", 2, 102.0, [0]))
    store.enqueue(batch("other", 2, 103.0, [0, 1], identity="m2:b"))  # another model's sample
    store.flush(now=110.0)
    assert store.label_requests("m:b", 100) == [("c:0", 102.0), ("a:1", 100.0), ("a:3", 100.0)]
    assert store.label_requests("m:b", 2) == [("c:0", 102.0), ("a:1", 100.0)]
    assert store.label_requests("m2:b", 100) == [("other:0", 103.0), ("other:1", 103.0)]

    out = store.apply_labels([("a:1", 0), ("a:2", 0), ("b:0", 1)], now=120.0)
    assert out.n_accepted == 3
    rows = store.labeled_rows("m:b")
    assert rows.sampled is not None and rows.sampled.tolist() == [True, False, False]  # a:1, a:2, b:0
    assert store.label_requests("m:b", 100) == [("c:0", 102.0), ("a:3", 100.0)]

    # eviction past max_predictions (20) cuts into the oldest request: its evicted sample goes too
    store.enqueue(batch("d", 15, 104.0, [2]))
    store.flush(now=130.0)
    store.evict(now=130.0)
    assert store.rows == 20
    assert store.label_requests("m:b", 100) == [("d:2", 104.0), ("c:0", 102.0)]
    # a request id used again replaces its predictions and their sample
    store.enqueue(batch("c", 2, 105.0, None))
    store.flush(now=140.0)
    assert store.label_requests("m:b", 100) == [("d:2", 104.0)]


def test_draw_probabilities_are_kept_with_their_labels(store: PredictionStore) -> None:
    store.enqueue(batch("a", 4, 100.0, [1, 3], draw_p=[0.25, 0.75]))
    store.enqueue(batch("b", 3, 101.0, [0]))  # drawn without a kept probability (uniform sampling)
    store.flush(now=110.0)
    out = store.apply_labels([("a:3", 0), ("a:1", 1), ("a:2", 0), ("b:0", 1)], now=120.0)
    assert out.n_accepted == 4
    accepted = dict(out.accepted)["m:b"].draw_probability
    assert accepted is not None and accepted[:2].tolist() == [0.75, 0.25] and np.isnan(accepted[2:]).all()
    rows = store.labeled_rows("m:b")  # a:1, a:2, a:3, b:0 (by time, then position)
    assert rows.draw_probability is not None and rows.sampled is not None
    got = rows.draw_probability.tolist()
    assert got[0] == 0.25 and np.isnan(got[1]) and got[2] == 0.75 and np.isnan(got[3])
    assert rows.sampled.tolist() == [True, False, True, True]
    # a correction keeps the draw probability
    assert store.apply_labels([("a:1", 0)], now=130.0, replace=True).corrected == ["a:1"]
    again = store.labeled_rows("m:b").draw_probability
    assert again is not None and again[0] == 0.25


def test_a_store_file_from_before_the_sample_is_upgraded(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / STORE_FILE)  # the tables as written before the labeling sample existed
    db.execute(
        "CREATE TABLE requests (seq INTEGER PRIMARY KEY AUTOINCREMENT, rid TEXT NOT NULL, start INTEGER NOT NULL,"
        " lo INTEGER NOT NULL, hi INTEGER NOT NULL, ts REAL NOT NULL, identity TEXT NOT NULL, k INTEGER NOT NULL,"
        " predicted BLOB NOT NULL, verdict BLOB NOT NULL, probs BLOB NOT NULL, extras BLOB, UNIQUE(rid, start))"
    )
    db.execute(
        "CREATE TABLE labels (seq INTEGER NOT NULL, idx INTEGER NOT NULL, identity TEXT NOT NULL, ts REAL NOT NULL,"
        " verdict INTEGER NOT NULL, confidence REAL NOT NULL, correct INTEGER NOT NULL, k INTEGER NOT NULL,"
        " label INTEGER NOT NULL, labeled_at REAL NOT NULL, abs_err REAL NOT NULL, sq_err REAL NOT NULL,"
        " extras BLOB, predicted INTEGER, PRIMARY KEY(seq, idx))"
    )
    p = np.array([[0.7, 0.2, 0.1]], dtype="<f4")
    db.execute(
        "INSERT INTO requests(rid, start, lo, hi, ts, identity, k, predicted, verdict, probs)"
        " VALUES(?, 0, 0, 1, ?, ?, 3, ?, ?, ?)",
        ("old", 100.0, "m:b", np.zeros(1, "<i4").tobytes(), np.zeros(1, np.int8).tobytes(), p.tobytes()),
    )
    db.commit()
    db.close()
    s = PredictionStore(tmp_path, max_predictions=100, max_age_seconds=1e12)
    s.open()
    s.enqueue(batch("new", 2, 200.0, [1]))
    s.flush(now=210.0)
    assert s.label_requests("m:b", 10) == [("new:1", 200.0)]
    assert s.apply_labels([("old:0", 0), ("new:1", 1)], now=220.0).n_accepted == 2
    rows = s.labeled_rows("m:b")
    assert rows.sampled is not None and rows.sampled.tolist() == [False, True]
    s.stop()


def test_a_postgres_store_of_the_first_schema_is_migrated(postgres: PostgresDatabase) -> None:  # noqa: F811
    with psycopg.connect(postgres.url) as conn, conn.transaction():
        conn.execute("CREATE TABLE icos_store_schema (version INTEGER NOT NULL, applied DOUBLE PRECISION)")
        for stmt in MIGRATIONS[0][1]:
            conn.execute(stmt)  # type: ignore[call-overload]  # fixed text
        conn.execute("INSERT INTO icos_store_schema VALUES (1, 0)")
        p = np.array([[0.7, 0.2, 0.1]], dtype="<f4")
        conn.execute(
            "INSERT INTO icos_requests(rid, start, lo, hi, ts, identity, k, predicted, verdict, probs)"
            " VALUES ('old', 0, 0, 1, 100, 'm:b', 3, %s, %s, %s)",
            (np.zeros(1, "<i4").tobytes(), np.zeros(1, np.int8).tobytes(), p.tobytes()),
        )
    s = PredictionStore(None, max_predictions=100, max_age_seconds=1e12, store_url=postgres.url)
    s.open()
    s.enqueue(batch("new", 2, 200.0, [1]))
    s.flush(now=210.0)
    with psycopg.connect(postgres.url) as conn:
        assert conn.execute("SELECT MAX(version) FROM icos_store_schema").fetchone() == (SCHEMA_VERSION,)
        columns = {
            (str(t), str(c))
            for t, c in conn.execute(
                "SELECT table_name, column_name FROM information_schema.columns WHERE table_name LIKE 'icos_%'"
            )
        }
    assert SCHEMA_VERSION == 5
    # every later migration ran: the labeling sample, sources, draw probabilities, segment numbers
    assert {("icos_requests", "sampled"), ("icos_labels", "source"), ("icos_requests", "sampled_p")} <= columns
    assert {("icos_requests", "sampled_seg"), ("icos_labels", "segments")} <= columns
    assert s.label_requests("m:b", 10) == [("new:1", 200.0)]
    assert s.apply_labels([("old:0", 0), ("new:1", 1)], now=220.0).n_accepted == 2
    rows = s.labeled_rows("m:b")
    assert rows.sampled is not None and rows.sampled.tolist() == [False, True]
    s.stop()


def test_served_agent_lists_its_sample_and_estimates_with_labels(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = stateful_settings(mnist_bundle_dir, tmp_path, labels={"sample_rate": 0.3})
    srv = run_server(create_app(settings, CollectorRegistry()))
    x, y = mnist_splits.test.x[:1000], mnist_splits.test.y[:1000]
    traffic = send_traffic(srv.url, x)
    truth = dict(zip(traffic["ids"].tolist(), y.tolist(), strict=True))
    position = {pid: i for i, pid in enumerate(traffic["ids"].tolist())}

    listed = httpx.get(f"{srv.url}/v1/labels/requests", params={"limit": 1000}).json()
    assert listed["sample_rate"] == 0.3
    ids = [r["id"] for r in listed["requests"]]
    assert listed["n"] == len(ids) and 200 < len(ids) < 400  # Binomial(1000, 0.3): 300 ± 14.5
    assert set(ids) <= set(truth) and len(set(ids)) == len(ids)
    times = [r["timestamp"] for r in listed["requests"]]
    assert times == sorted(times, reverse=True)  # newest first
    drawn = scrape(srv.url).by_labels("icos_label_sample_total")
    assert list(drawn.values()) == [float(len(ids))]
    # the command line gives the same list as CSV, for a labeling job
    assert cli_main(["labels", "--url", srv.url, "--requests", "1000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "id,timestamp" and [line.split(",")[0] for line in lines[1:]] == ids
    assert cli_main(["labels", "--url", srv.url, "--requests", "0"]) == 2
    # inputs are kept only when asked (labels.keep_sampled_inputs): the export says so
    with_inputs = httpx.get(f"{srv.url}/v1/labels/requests", params={"limit": 5, "inputs": "true"}).json()
    assert with_inputs["keep_sampled_inputs"] is False and [r["inputs"] for r in with_inputs["requests"]] == [None] * 5
    assert cli_main(["labels", "export", "--url", srv.url, "--out", str(tmp_path / "tasks")]) == 2
    assert "labels.keep_sampled_inputs" in capsys.readouterr().err

    # labels for the sample and for 100 predictions outside it: only the sample's enter with_labels
    outside = [pid for pid in traffic["ids"].tolist() if pid not in set(ids)][:100]
    res = post_labels(srv.url, [{"id": pid, "label": truth[pid]} for pid in ids + outside])
    assert res["accepted"] == len(ids) + 100
    assert httpx.get(f"{srv.url}/v1/labels/requests").json()["requests"] == []  # nothing left to label

    probs = traffic["probabilities"]
    conf = probs.max(axis=1).astype(np.float64)
    sample = np.array([position[pid] for pid in ids])
    correct = traffic["labels"][sample] == y[sample]
    want = prediction_powered_accuracy(1000, float(conf.sum()), float((conf**2).sum()), conf[sample], correct)
    assert want is not None

    def windows() -> dict[str, Any]:
        return dict(httpx.get(f"{srv.url}/v1/estimates").json()["windows"])

    assert wait_until(lambda: windows()["5m"]["n"] == 1000)
    est = windows()
    for w in ("5m", "1h"):
        e = est[w]["estimates"][WITH_LABELS]
        assert e["n_labels"] == len(ids) and e["n"] == 1000
        assert e["value"] == pytest.approx(want.value, abs=1e-6)
        assert e["lower"] == pytest.approx(want.lower, abs=1e-6) and e["upper"] == pytest.approx(want.upper, abs=1e-6)
        assert est[w]["realized"]["n"] == len(ids) + 100 and est[w]["realized"]["n_sampled"] == len(ids)
    assert WITH_LABELS not in est["last100000"]["estimates"]  # count windows have none
    accuracy = float(np.mean(traffic["labels"] == y))
    assert abs(est["5m"]["estimates"][WITH_LABELS]["value"] - accuracy) < 0.1  # ~5 standard errors

    gauge = scrape(srv.url).by_labels("icos_estimated_accuracy_ratio")
    key = (("estimator", WITH_LABELS), ("model", "mnist"), ("version", "1"), ("window", "1h"))
    assert gauge[key] == pytest.approx(want.value, abs=1e-6)

    for bad in ("0", "abc", "1001", "-1", "9" * 40):
        r = httpx.get(f"{srv.url}/v1/labels/requests", params={"limit": bad})
        assert r.status_code == 400 and "limit" in r.json()["error"], bad
    invalid = scrape(srv.url).by_labels("icos_invalid_requests_total")
    assert sum(v for k, v in invalid.items() if ("reason", "invalid_parameter") in k) == 5


def test_no_sample_at_rate_zero(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path
) -> None:
    settings = stateful_settings(mnist_bundle_dir, tmp_path, labels={"sample_rate": 0.0})
    srv = run_server(create_app(settings, CollectorRegistry()))
    traffic = send_traffic(srv.url, mnist_splits.test.x[:200])
    assert httpx.get(f"{srv.url}/v1/labels/requests").json() == {
        "sample_rate": 0.0,
        "sampling": "uniform",
        "n": 0,
        "requests": [],
    }
    y = mnist_splits.test.y[:200]
    post_labels(srv.url, [{"id": str(pid), "label": int(t)} for pid, t in zip(traffic["ids"], y, strict=True)])
    est = httpx.get(f"{srv.url}/v1/estimates").json()["windows"]["5m"]
    assert est["realized"]["n"] == 200 and WITH_LABELS not in est["estimates"]


def test_served_agent_under_active_sampling_weights_its_labels(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path
) -> None:
    """Active sampling with a budget larger than the traffic: every prediction is drawn with a probability
    of its own (uncertain ones more often), kept in the store with its label, and ``with_labels`` is the
    inverse-probability-weighted estimate of the window computed from the stored predictions and draws."""
    labels = {"sampling": "active", "per_window": 100_000, "budget_window": "5m"}
    settings = stateful_settings(mnist_bundle_dir, tmp_path, labels=labels)
    srv = run_server(create_app(settings, CollectorRegistry()))
    x, y = mnist_splits.test.x[:1000], mnist_splits.test.y[:1000]
    traffic = send_traffic(srv.url, x)
    truth = dict(zip(traffic["ids"].tolist(), y.tolist(), strict=True))
    listed = httpx.get(f"{srv.url}/v1/labels/requests", params={"limit": 1000}).json()
    assert listed["sampling"] == "active"
    ids = [r["id"] for r in listed["requests"]]
    # how many are drawn follows the traffic's rate, measured as it arrives (how fast this machine sends it):
    # only that some are and some are not is certain
    assert 0 < len(ids) < 1000
    post_labels(srv.url, [{"id": pid, "label": truth[pid]} for pid in ids])

    def windows() -> dict[str, Any]:
        return dict(httpx.get(f"{srv.url}/v1/estimates").json()["windows"])

    assert wait_until(lambda: windows()["5m"]["n"] == 1000 and WITH_LABELS in windows()["5m"]["estimates"])
    e = windows()["5m"]["estimates"][WITH_LABELS]
    assert e["weighted"] is True and e["predictor"] == "calibrated" and e["n_labels"] == len(ids)

    # the same estimate from what the store holds: every prediction's probabilities and verdict, and
    # the draw probability of every labeled one
    calibration = EstimatorCalibration.from_dict(Bundle.load(mnist_bundle_dir).estimator_calibration)
    db = sqlite3.connect(tmp_path / STORE_FILE)
    requests = {r[0]: r[1:] for r in db.execute("SELECT rid, start, k, verdict, probs, seq FROM requests")}
    drawn = {(seq, idx): p for seq, idx, p in db.execute("SELECT seq, idx, draw_p FROM labels")}
    db.close()
    f, pi, correct, labeled = [], [], [], []
    for i, pid in enumerate(traffic["ids"].tolist()):
        rid, idx = split_prediction_id(pid)
        start, k, verdict, probs, seq = requests[rid]
        j = idx - start
        conf = float(np.frombuffer(probs, "<f4")[j * k : (j + 1) * k].max())
        f.append(float(calibration.predicted_correct(np.array([conf]), np.frombuffer(verdict, np.int8)[j : j + 1])[0]))
        if (seq, idx) in drawn:
            labeled.append(i)
            pi.append(drawn[(seq, idx)])
            correct.append(traffic["labels"][i] == y[i])
    assert len(labeled) == len(ids) and 0 < min(pi) < max(pi) <= 1
    # uncertain predictions are drawn more often: the least confident tenth at a higher share than the
    # most confident half, whatever the rate
    order = np.argsort(f)
    is_drawn = np.isin(np.arange(len(f)), labeled)
    assert is_drawn[order[: len(f) // 10]].mean() > is_drawn[order[len(f) // 2 :]].mean()
    want = active_accuracy(np.array(f), np.array(labeled), np.array(correct), np.array(pi))
    assert want is not None
    assert e["value"] == pytest.approx(want.value, abs=1e-6)
    assert e["lower"] == pytest.approx(want.lower, abs=1e-6) and e["upper"] == pytest.approx(want.upper, abs=1e-6)
    accuracy = float(np.mean(traffic["labels"] == y))
    assert e["lower"] - 0.01 <= accuracy <= e["upper"] + 0.01


def test_a_window_outside_the_calibrated_range_boosts_the_label_budget_with_no_scrape(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path
) -> None:
    """Active sampling spends its budget sooner while a window lies outside the calibrated range, and the
    agent decides it on its own timer: nothing here ever scrapes ``/metrics``."""
    labels = {"sampling": "active", "budget_window": "20s"}  # a boost of 2 s, looked at every second
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path, labels=labels), CollectorRegistry()))
    agent = srv.app.state.agent
    assert agent.boost.interval == 1.0 and not agent.sample.boosted()
    # darker, noisy digits: far outside what shift_aware was calibrated on
    rng = np.random.default_rng(0)
    x = mnist_splits.test.x[:300].astype(np.float32)
    drifted = np.clip(x * 0.6 + rng.normal(0, 0.15, x.shape), 0, 1).astype(np.float32)
    send_traffic(srv.url, drifted)
    assert wait_until(agent.sample.boosted, timeout=30)
    flag = httpx.get(f"{srv.url}/v1/estimates").json()["windows"]["5m"]["flag"]
    assert not flag["in_calibrated_range"]
