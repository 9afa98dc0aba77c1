"""Labels only from those allowed: with ``ICOS_AGENT_LABELS_TOKEN`` set, the labeling sample and posting
labels need it (401 without, 403 wrong, 429 after repeated failures, all counted); nothing without it
reads the sample or moves ``with_labels``. An authorized labeler corrects a label (the newer replaces
the older, the estimates follow); an admin drops the labels of one source; every label keeps its source
and time. Stores: SQLite and a real PostgreSQL alike."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.cli import main as cli_main
from agent.config.settings import ADMIN_TOKEN_ENV, LABELS_TOKEN_ENV
from agent.data.datasets import Splits
from agent.estimation.estimators.prediction_powered import WITH_LABELS
from agent.labels.store import STORE_FILE, PredictionStore
from agent.server.access import MAX_FAILURES
from agent.server.app import create_app
from tests.support.batches import batch
from tests.support.inprocess import RunningServer
from tests.support.metrics import scrape
from tests.support.settings import stateful_settings
from tests.support.v2 import send_traffic
from tests.support.waiting import wait_until

LABELER = "labeler-secret"
ADMIN = "admin-secret"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = request.getfixturevalue("postgres").url if request.param == "postgresql" else None
    s = PredictionStore(tmp_path, max_predictions=1000, max_age_seconds=1e12, store_url=url)
    s.open()
    yield s
    s.stop()


def test_corrections_sources_and_drops_in_the_store(store: PredictionStore) -> None:
    store.enqueue(batch("a", 4, 100.0, [0, 1]))
    store.flush(now=110.0)
    first = store.apply_labels([("a:0", 0), ("a:1", 1)], now=200.0, source="client:10.0.0.9")
    assert first.n_accepted == 2 and store.labeled == 2
    # without the right to correct, the first label stays
    dup = store.apply_labels([("a:0", 2)], now=210.0, source="client:10.0.0.9")
    assert dup.duplicate == ["a:0"] and dup.n_accepted == 0
    assert store.labeled_rows("m:b").label.tolist() == [0, 1]  # type: ignore[union-attr]
    # an authorized labeler's label replaces it; the count of labeled predictions stays
    fixed = store.apply_labels([("a:0", 2), ("a:2", 1)], now=220.0, source="labels", replace=True)
    assert fixed.corrected == ["a:0"] and fixed.n_accepted == 2 and store.labeled == 3
    rows = store.labeled_rows("m:b")
    assert sorted(rows.label.tolist()) == [1, 1, 2]  # type: ignore[union-attr]
    # drop what one source gave, then a time range
    assert store.drop_labels("client:10.0.0.9", None, None) == 1  # a:1 (a:0 is now the labeler's)
    assert store.labeled == 2 and store.labeled_rows("m:b").n == 2
    assert store.drop_labels(None, 219.0, 221.0) == 2
    assert store.labeled == 0 and store.labeled_rows("m:b").n == 0


def _server(
    run_server: Callable[..., RunningServer], bundle: Path, state: Path, monkeypatch: pytest.MonkeyPatch
) -> RunningServer:
    monkeypatch.setenv(LABELS_TOKEN_ENV, LABELER)
    monkeypatch.setenv(ADMIN_TOKEN_ENV, ADMIN)
    settings = stateful_settings(bundle, state, labels={"sample_rate": 0.5})
    return run_server(create_app(settings, CollectorRegistry()))


def test_only_an_authorized_labeler_reads_the_sample_and_moves_with_labels(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    srv = _server(run_server, mnist_bundle_dir, tmp_path, monkeypatch)
    x, y = mnist_splits.test.x[:300], mnist_splits.test.y[:300]
    traffic = send_traffic(srv.url, x)
    truth = {str(pid): int(t) for pid, t in zip(traffic["ids"], y, strict=True)}

    def windows() -> dict[str, Any]:
        return dict(httpx.get(f"{srv.url}/v1/estimates").json()["windows"])

    assert wait_until(lambda: windows()["5m"]["n"] == 300)
    # without the token (four failures from this client: one fewer than the throttle allows)
    with httpx.Client(base_url=srv.url) as c:
        assert c.get("/v1/labels/requests").status_code == 401
        assert c.get("/v1/labels/requests", headers=_bearer("wrong")).status_code == 403
        wrong = [{"id": pid, "label": (t + 1) % 10} for pid, t in truth.items()]
        r = c.post("/v1/labels", json={"labels": wrong})
        assert r.status_code == 401 and "bearer token" in r.json()["error"]
    assert WITH_LABELS not in windows()["5m"]["estimates"] and windows()["5m"]["realized"]["n"] == 0

    # the labeler lists the sample and labels it; the command line sends the token from the environment
    listed = httpx.get(f"{srv.url}/v1/labels/requests", params={"limit": 1000}, headers=_bearer(LABELER)).json()
    ids = [r["id"] for r in listed["requests"]]
    assert 100 < len(ids) < 200
    assert cli_main(["labels", "--url", srv.url, "--requests", "1000"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [f"{r['id']},{r['timestamp']}" for r in listed["requests"]]
    ok = httpx.post(
        f"{srv.url}/v1/labels", json={"labels": [{"id": i, "label": truth[i]} for i in ids]}, headers=_bearer(LABELER)
    ).json()
    assert ok["accepted"] == len(ids) and ok["corrected"] == 0
    est = windows()["5m"]
    assert est["estimates"][WITH_LABELS]["n_labels"] == len(ids)
    right = est["realized"]["accuracy"]["value"]

    # the labeler corrects ten labels (made wrong on purpose): the realized accuracy follows
    bad = [{"id": i, "label": (truth[i] + 1) % 10} for i in ids[:10]]
    res = httpx.post(f"{srv.url}/v1/labels", json={"labels": bad}, headers=_bearer(LABELER)).json()
    assert res["corrected"] == 10 and res["accepted"] == 0 and res["duplicate"] == 0
    after = windows()["5m"]
    assert after["realized"]["n"] == len(ids) and after["realized"]["accuracy"]["value"] < right
    # every label keeps its source and time
    db = sqlite3.connect(tmp_path / STORE_FILE)
    sources = dict(db.execute("SELECT source, COUNT(*) FROM labels GROUP BY source").fetchall())
    times = [t for (t,) in db.execute("SELECT labeled_at FROM labels")]
    db.close()
    assert sources == {"labels": len(ids)} and all(abs(t - time.time()) < 600 for t in times)

    # an admin drops the labeler's labels: with_labels and the realized windows have none left
    assert httpx.delete(f"{srv.url}/v1/labels", params={"source": "labels"}).status_code == 401
    assert httpx.delete(f"{srv.url}/v1/labels", headers=_bearer(ADMIN)).status_code == 400  # nothing named
    dropped = httpx.delete(f"{srv.url}/v1/labels", params={"source": "labels"}, headers=_bearer(ADMIN)).json()
    assert dropped["dropped"] == len(ids)
    final = windows()["5m"]
    assert final["realized"]["n"] == 0 and WITH_LABELS not in final["estimates"]

    invalid = scrape(srv.url)
    assert invalid.value("icos_invalid_requests_total", reason="unauthorized") == 3
    assert invalid.value("icos_invalid_requests_total", reason="forbidden") == 1


def test_guessing_tokens_is_throttled_per_client_and_never_logged(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    srv = _server(run_server, mnist_bundle_dir, tmp_path, monkeypatch)
    with httpx.Client(base_url=srv.url) as c:
        codes = [c.get("/v1/labels/requests", headers=_bearer(f"guess-{i}")).status_code for i in range(MAX_FAILURES)]
        assert codes == [403] * MAX_FAILURES
        # the next try is refused before its token is looked at, the right token too, for the admin API as well
        for headers, path in ((_bearer(LABELER), "/v1/labels/requests"), (_bearer(ADMIN), "/v1/reload")):
            r = c.get(path, headers=headers) if path.endswith("requests") else c.post(path, headers=headers, json={})
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
    assert scrape(srv.url).value("icos_invalid_requests_total", reason="auth_throttled") == 2
    assert not any("guess-" in rec.getMessage() or LABELER in rec.getMessage() for rec in caplog.records)
    assert all("guess-" not in str(rec.__dict__) for rec in caplog.records)
    np.testing.assert_equal(httpx.get(f"{srv.url}/v2/health/live").status_code, 200)
