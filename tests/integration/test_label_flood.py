"""A flood of labels from one sender, against a served agent: an honest labeler labels some predictions right,
another client (its own loopback address, so its own source) labels every other stored prediction ``__none__``
or a wrong class. With ``labels.max_source_share`` the window's and every segment's realized accuracy move by
no more than the cap allows (from the formula: the flood's labels, all wrong, weigh at most ``c'`` of the
figure, so it drops by at most ``c'`` times the honest figure); without the cap the same flood drags them
down much further. The labels keep their sources in the store, read back with them (a label stored before
sources were kept reads as the unknown source ``""``). Stores: SQLite and a real PostgreSQL alike."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from agent.core.label_values import NONE_LABEL
from agent.data.datasets import Splits
from agent.labels.store import STORE_FILE, PredictionStore
from agent.server.app import create_app
from tests.support.batches import batch
from tests.support.inprocess import RunningServer
from tests.support.metrics import scrape
from tests.support.settings import stateful_settings
from tests.support.v2 import post_labels, send_traffic
from tests.support.waiting import wait_until

HONEST, TOTAL = 60, 300
ATTACKER = "127.0.0.2"  # a second loopback address: labels without a token take the client's address as source


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    return str(request.getfixturevalue("postgres").url) if request.param == "postgresql" else None


def _sources(store: PredictionStore) -> dict[int, str]:
    """Each labeled prediction's true class → its label's source, as the realized windows read them."""
    rows = store.labeled_rows("m:b")
    assert rows.label is not None and rows.source is not None
    return dict(zip(rows.label.tolist(), rows.source.tolist(), strict=True))


def test_labels_read_back_with_their_sources_and_none_from_before_sources_were_kept(
    store_url: str | None, tmp_path: Path
) -> None:
    store = PredictionStore(tmp_path, max_predictions=1000, max_age_seconds=1e12, store_url=store_url)
    store.open()
    try:
        store.enqueue(batch("a", 4, 100.0, [0, 1]))
        store.flush(now=110.0)
        store.apply_labels([("a:0", 0), ("a:1", 1)], now=200.0, source="labels")
        store.apply_labels([("a:2", 2)], now=201.0, source="client:10.0.0.9")
        assert _sources(store) == {0: "labels", 1: "labels", 2: "client:10.0.0.9"}
        # a label stored before sources were kept (NULL): one source of its own, the unknown one
        sql = "UPDATE {} SET source = NULL WHERE idx = 1"
        if store_url is None:
            with sqlite3.connect(tmp_path / STORE_FILE) as db:
                db.execute(sql.format("labels"))
        else:
            import psycopg

            with psycopg.connect(store_url) as conn:
                conn.execute(sql.format("icos_labels"))
        assert _sources(store) == {0: "labels", 1: "", 2: "client:10.0.0.9"}
    finally:
        store.stop()


def _window(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/v1/estimates", timeout=30).json()["windows"]["5m"])


def _segments(window: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Each segment's realized accuracy (segments with labels only)."""
    return {(s["dimension"], s["name"]): s["realized"]["value"] for s in window["segments"] if "realized" in s}


@pytest.mark.parametrize("share", [0.5, 1.0])
def test_a_flood_from_one_labeler_moves_the_realized_figures_at_most_by_its_share(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    tmp_path: Path,
    store_url: str | None,
    share: float,
) -> None:
    labels: dict[str, Any] = {"sample_rate": 1.0, "max_source_share": share}
    if store_url is not None:
        labels["store_url"] = store_url
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path, labels=labels), CollectorRegistry()))
    x, y = mnist_splits.test.x[:TOTAL], mnist_splits.test.y[:TOTAL]
    traffic = send_traffic(srv.url, x)
    ids = [str(i) for i in traffic["ids"]]
    predicted = [int(p) for p in traffic["labels"]]

    # the honest labeler (127.0.0.1) labels the first predictions with their true classes
    post_labels(srv.url, [{"id": i, "label": int(t)} for i, t in zip(ids[:HONEST], y[:HONEST], strict=True)])
    assert wait_until(lambda: _window(srv.url)["realized"]["n"] == HONEST)
    before = _window(srv.url)
    honest = float(before["realized"]["accuracy"]["value"])
    honest_segments = _segments(before)
    assert honest > 0.8 and honest_segments and before["realized"]["capped_labels"] == 0

    # the flood: every other stored prediction labeled none of the classes, or a class the model did not predict
    flood = [
        {"id": i, "label": NONE_LABEL if k % 2 else (p + 1) % 10}
        for k, (i, p) in enumerate(zip(ids[HONEST:], predicted[HONEST:], strict=True))
    ]
    with httpx.Client(base_url=srv.url, transport=httpx.HTTPTransport(local_address=ATTACKER), timeout=30) as c:
        answer = c.post("/v1/labels", json={"labels": flood}).json()
    assert answer["accepted"] == len(flood)
    assert wait_until(lambda: _window(srv.url)["realized"]["n"] == TOTAL)
    after = _window(srv.url)
    flooded = float(after["realized"]["accuracy"]["value"])
    sources = srv.app.state.agent.store.labeled_rows(srv.app.state.agent.runtimes.current.identity).source
    assert sorted(set(sources.tolist())) == ["client:127.0.0.1", f"client:{ATTACKER}"]

    # two sources: the cap is c' = max(c, 1/2); the flood's labels are all wrong, so a figure a drops by at most c'·a
    cap = max(share, 1 / 2)
    moved = {k: v - _segments(after)[k] for k, v in honest_segments.items() if k in _segments(after)}
    capped_metric = scrape(srv.url).find("icos_realized_capped_labels", window="5m")
    if share < 1.0:
        assert honest - flooded <= cap * honest + 1e-5  # the JSON rounds to six decimals
        assert flooded == pytest.approx((1 - cap) * honest, abs=1e-5)  # the flood weighs exactly c'
        assert all(m <= cap * honest_segments[k] + 1e-5 for k, m in moved.items()), moved
        assert after["realized"]["capped_labels"] == len(flood) and capped_metric == len(flood)
    else:  # no cap: the same flood drags the window and some segment far below the capped bound
        assert honest - flooded > 0.5 * honest + 0.2
        assert flooded == pytest.approx(honest * HONEST / TOTAL, abs=1e-5)
        assert max(m - 0.5 * honest_segments[k] for k, m in moved.items()) > 0.2, moved
        assert after["realized"]["capped_labels"] == 0 and capped_metric == 0
