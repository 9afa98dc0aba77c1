"""A challenger beside the champion in a running agent (real uvicorn server, real HTTP client): the shipped
MNIST CNN serves rotated digits, the same recipe retrained on drifted data runs beside it off the request path,
and the paired difference, its labels, its share, its bounded queue and its metrics are checked against the
truth computed offline with both models."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.data.datasets import Splits
from agent.dataplane.challenger import Challenger, load_challenger
from agent.model.classifier import OnnxClassifier, default_model_path
from agent.server.app import create_app
from exporters.challenger_metrics import ChallengerMetrics
from tests.support.challenger import CHALLENGER_MODEL, drifted
from tests.support.inprocess import RunningServer, settle
from tests.support.metrics import scrape
from tests.support.settings import WINDOWS_5M_1H, mnist_app, mnist_settings, upstream_app
from tests.support.v2 import estimates, post_labels, send_traffic
from tests.support.waiting import poll


def _challenger(bundle: Path, **more: Any) -> dict[str, Any]:
    return {"model_path": str(CHALLENGER_MODEL), "bundle_path": str(bundle), "version": "drift", **more}


def _paired(url: str, n: int, window: str = "5m") -> dict[str, Any]:
    """The challenger's window once it holds ``n`` paired predictions."""
    return dict(
        poll(
            lambda: (w := estimates(url)["challenger"]["windows"][window])["n"] == n and w,
            timeout=60,
            what=f"{n} paired predictions",
            explain=lambda: estimates(url)["challenger"],
        )
    )


@pytest.fixture(scope="module")
def traffic(mnist_splits: Splits, mnist_model: OnnxClassifier) -> dict[str, np.ndarray]:
    """1,000 rotated test digits, each version's predictions of them and the true classes."""
    x = drifted(mnist_splits.test.x)
    challenger = OnnxClassifier.load(CHALLENGER_MODEL)
    return {
        "x": x,
        "y": mnist_splits.test.y,
        "champion": mnist_model.predict(x).predicted,
        "challenger": challenger.predict(x).predicted,
    }


def test_the_challenger_is_compared_on_the_same_requests_and_labels_settle_it(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    challenger_bundle_dir: Path,
    traffic: dict[str, np.ndarray],
    tmp_path: Path,
) -> None:
    labels = {"sampling": "uniform", "sample_rate": 0.02, "budget_window": "5s"}
    settings = mnist_settings(
        mnist_bundle_dir,
        state=tmp_path,
        windows=WINDOWS_5M_1H,
        labels=labels,
        challenger=_challenger(challenger_bundle_dir, labels_per_window=100_000),
    )
    srv = run_server(create_app(settings, CollectorRegistry()))
    x, y, a, b = traffic["x"], traffic["y"], traffic["champion"], traffic["challenger"]
    sent = send_traffic(srv.url, x)
    np.testing.assert_array_equal(sent["labels"], a)  # the answers are the champion's
    window = _paired(srv.url, len(x))
    dis = a != b
    assert window["disagreements"] == int(dis.sum())
    assert window["agreement"] == pytest.approx(1 - dis.mean(), abs=1e-6)
    free = window["differences"]["label_free"]
    assert window["difference"]["estimator"] == "label_free"
    assert -dis.mean() - 1e-9 <= free["lower"] <= free["value"] <= free["upper"] <= dis.mean() + 1e-9
    assert {window["champion"]["estimator"], window["challenger"]["estimator"]} == {"shift_aware"}
    assert window["champion"]["n"] == window["challenger"]["n"] == len(x)

    # every disagreement was drawn with probability 1 (a budget far above the traffic): their labels give the
    # window's difference exactly, with no width left
    requested = httpx.get(f"{srv.url}/v1/labels/requests", params={"limit": 1000}).json()
    drawn = {r["id"] for r in requested["requests"]}
    disagreeing = {str(sent["ids"][i]) for i in np.flatnonzero(dis)}
    assert disagreeing <= drawn
    res = post_labels(srv.url, [{"id": str(pid), "label": int(c)} for pid, c in zip(sent["ids"], y, strict=True)])
    assert res["accepted"] == len(x)
    truth = float(np.mean(b == y) - np.mean(a == y))
    assert truth > 0  # the version retrained on drifted data is better on rotated digits
    labeled = estimates(srv.url)["challenger"]["windows"]["5m"]
    best = labeled["difference"]
    assert best["estimator"] == "with_labels" and best["n_labels"] == int(dis.sum())
    assert (best["value"], best["lower"], best["upper"]) == pytest.approx((truth,) * 3, abs=1e-6)
    assert free["lower"] <= truth <= free["upper"]

    m = scrape(srv.url)
    mvc = {"model": "mnist", "version": "1", "challenger": "drift"}
    assert m.value("icos_challenger_predictions_total", **mvc) == len(x)
    assert m.value("icos_challenger_paired_samples", window="5m", **mvc) == len(x)
    assert m.value("icos_challenger_agreement_ratio", window="1h", **mvc) == pytest.approx(1 - dis.mean())
    with_labels = {"window": "5m", "estimator": "with_labels", **mvc}
    assert m.value("icos_challenger_difference_ratio_lower", **with_labels) == pytest.approx(truth, abs=1e-6)
    assert m.find("icos_challenger_accuracy_ratio", window="5m", role="challenger", **mvc) is not None
    assert m.value("icos_challenger_dropped_total", challenger="drift") == 0
    assert m.value("icos_challenger_cpu_seconds_total", challenger="drift") > 0
    assert m.value("icos_challenger_stat_total", stat="n_dis") == int(dis.sum())


def test_a_share_pairs_whole_requests_and_the_rest_go_unpaired(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    challenger_bundle_dir: Path,
    traffic: dict[str, np.ndarray],
) -> None:
    settings = mnist_settings(
        mnist_bundle_dir, labels={"enabled": False}, challenger=_challenger(challenger_bundle_dir, share=0.5)
    )
    srv = run_server(create_app(settings, CollectorRegistry()))
    send_traffic(srv.url, traffic["x"], batch=25)
    settle(srv)
    agent = srv.app.state.agent
    assert poll(
        lambda: not any(c.held_ids() for c in agent.companions), timeout=30, what="the challenger's queue drained"
    )
    n = estimates(srv.url)["challenger"]["windows"]["5m"]["n"]
    assert n % 25 == 0 and 0 < n < len(traffic["x"])
    assert scrape(srv.url).value("icos_challenger_predictions_total", challenger="drift") == n
    assert estimates(srv.url)["windows"]["5m"]["n"] == len(traffic["x"])  # the champion judged every request


def test_in_observe_mode_the_challenger_runs_on_the_observed_inputs(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    challenger_bundle_dir: Path,
    traffic: dict[str, np.ndarray],
    mnist_model: OnnxClassifier,
) -> None:
    app = mnist_app(
        mnist_bundle_dir,
        "observe",
        model={"name": "mnist"},
        observe={"event_ttl_seconds": 30},
        challenger=_challenger(challenger_bundle_dir),
    )
    srv = run_server(app)
    x = traffic["x"][:200]
    probs = mnist_model.predict(x).probabilities
    for k in range(4):
        rows = slice(50 * k, 50 * (k + 1))
        body = {"id": f"obs-{k}", "inputs": x[rows].tolist(), "probabilities": probs[rows].tolist()}
        r = httpx.post(f"{srv.url}/v1/observe", json=body, timeout=30)
        assert r.status_code in (200, 202), r.text
    window = _paired(srv.url, 200)
    assert window["disagreements"] == int((traffic["champion"][:200] != traffic["challenger"][:200]).sum())


def test_in_proxy_mode_the_challenger_runs_on_the_forwarded_inputs(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    challenger_bundle_dir: Path,
    traffic: dict[str, np.ndarray],
) -> None:
    """The champion answers from the upstream; the challenger runs here on the inputs the agent forwarded."""
    up = run_server(upstream_app(mnist_bundle_dir))
    proxy = mnist_app(
        mnist_bundle_dir,
        "proxy",
        model={"name": "mnist", "path": str(default_model_path())},
        upstream={"url": up.url, "model_name": "mnist-upstream"},
        labels={"enabled": False},
        challenger=_challenger(challenger_bundle_dir),
    )
    srv = run_server(proxy)
    sent = send_traffic(srv.url, traffic["x"][:300])
    np.testing.assert_array_equal(sent["labels"], traffic["champion"][:300])
    window = _paired(srv.url, 300)
    assert window["disagreements"] == int((traffic["champion"][:300] != traffic["challenger"][:300]).sum())


def test_a_full_queue_drops_and_counts_and_the_champion_never_waits(
    mnist_bundle_dir: Path, challenger_bundle_dir: Path, mnist_model: OnnxClassifier, traffic: dict[str, np.ndarray]
) -> None:
    """The challenger's queue holds ``queue_limit`` requests; while its thread is held up (a labeling sample
    that does not return), more requests are dropped and counted at once, and every request reaches the sample
    (dropped ones unpaired); a request of another champion is not paired."""
    from agent.judging.recorder import JudgedBatch
    from agent.judging.runtime import load_runtime

    settings = mnist_settings(
        mnist_bundle_dir, challenger=_challenger(challenger_bundle_dir, queue_limit=2), labels={"enabled": False}
    )
    champion = load_runtime(settings)
    runtime, pair = load_challenger(settings, champion)
    metrics = ChallengerMetrics(CollectorRegistry(), "drift")
    release, handed = threading.Event(), []

    def slow_sample(batch: JudgedBatch, prefer: np.ndarray | None) -> tuple[np.ndarray, None]:
        handed.append((batch.request_id, prefer is not None))
        if batch.request_id == "r0":
            assert release.wait(30)
        return np.zeros(0, dtype=np.int64), None

    ch = Challenger(settings, runtime, pair, metrics, forward=slow_sample)
    ch.start()
    x = champion.prepare(traffic["x"][:8])
    pred = mnist_model.predict(traffic["x"][:8])

    def batch(rid: str, rt: Any = champion) -> JudgedBatch:
        verdicts = np.zeros(8, dtype=np.int8)
        return JudgedBatch(rt, rid, 0.0, pred.probabilities, pred.predicted, verdicts, None, x)

    try:
        ch.on_judged(batch("r0"))
        assert poll(lambda: handed, timeout=30, what="the thread took r0")  # now held up in the sample
        for k in range(1, 6):
            ch.on_judged(batch(f"r{k}"))  # r1, r2 wait; r3..r5 are dropped at once, handed on unpaired
        assert metrics.dropped_counts()["queue_full"] == 3
        assert [rid for rid, _ in handed] == ["r0", "r3", "r4", "r5"]
        other = load_runtime(settings, model_path=CHALLENGER_MODEL, bundle_path=challenger_bundle_dir)
        ch.on_judged(batch("r6", other))
        assert metrics.dropped_counts()["other_champion"] == 1
        assert ch.holds("r1") and ch.holds("r2") and not ch.holds("r3")
    finally:
        release.set()
        ch.stop()
    assert ch.windows.total == 3 * 8 and not ch.held_ids()
    assert {rid for rid, _ in handed} == {f"r{k}" for k in range(7)}
