"""The sidecar in serve mode with a real V2 client (tritonclient) over a real socket."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as th
from prometheus_client import CollectorRegistry
from tritonclient.utils import InferenceServerException

from agent.config.settings import AgentSettings
from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from agent.server.app import create_app
from agent.server.metrics_port import MAX_CONNECTIONS
from tests.support.agents import Agents
from tests.support.inprocess import RunningServer, settle, start_server
from tests.support.metrics import Scrape, metric, scrape
from tests.support.ports import free_port
from tests.support.requirements import require
from tests.support.settings import mnist_settings
from tests.support.waiting import wait_until


def serve_settings(bundle: Path) -> AgentSettings:
    return mnist_settings(
        bundle, model={"name": "mnist", "version": "3", "path": str(default_model_path())}, server={"host": "127.0.0.1"}
    )


@pytest.fixture(scope="module")
def agent(module_agents: Agents, mnist_bundle_dir: Path) -> RunningServer:
    return module_agents.serve(create_app(serve_settings(mnist_bundle_dir), CollectorRegistry()))


@pytest.fixture(scope="module")
def client(agent: RunningServer) -> Iterator[th.InferenceServerClient]:
    c = th.InferenceServerClient(agent.hostport)
    yield c
    c.close()


def infer(
    client: th.InferenceServerClient, x: np.ndarray, binary: bool, outputs: tuple[str, ...] | None = None, **kw: Any
) -> th.InferResult:
    inp = th.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x.astype(np.float32), binary_data=binary)
    outs = [th.InferRequestedOutput(n, binary_data=binary) for n in outputs] if outputs else None
    return client.infer("mnist", [inp], outputs=outs, **kw)


def test_health_and_metadata(client: th.InferenceServerClient, agent: RunningServer) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("mnist")
    assert client.is_model_ready("mnist", "3")
    assert not client.is_model_ready("nope")
    meta = client.get_model_metadata("mnist")
    assert meta["name"] == "mnist" and meta["versions"] == ["3"]
    assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 1, 28, 28]}
    outs = {o["name"]: o for o in meta["outputs"]}
    assert outs["probabilities"]["shape"] == [-1, 10] and outs["label"]["datatype"] == "INT64"
    assert outs["icos_verdict"]["datatype"] == "BYTES"
    server = client.get_server_metadata()
    assert "binary_tensor_data" in server["extensions"]
    assert httpx.get(f"{agent.url}/openapi.json").status_code == 200


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_outputs(client: th.InferenceServerClient, mnist_splits: Splits, mnist_model: Any, binary: bool) -> None:
    x = mnist_splits.test.x[:16]
    res = infer(client, x, binary, ("probabilities", "label", "icos_verdict"))
    probs = res.as_numpy("probabilities")
    labels = res.as_numpy("label")
    verdicts = res.as_numpy("icos_verdict")
    assert probs.dtype == np.float32 and probs.shape == (16, 10)
    assert labels.dtype == np.int64 and labels.shape == (16,)
    assert verdicts.shape == (16,)
    names = {v.decode() if isinstance(v, bytes) else str(v) for v in verdicts}
    assert names <= {"pass", "fail:idi", "fail:tdi", "fail:adi"}
    expected = mnist_model.predict(x)
    np.testing.assert_allclose(probs, expected.probabilities, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(labels, expected.predicted)
    response = res.get_response()
    assert response["parameters"]["icos_prediction_count"] == 16 and len(response["id"]) == 32


def test_default_outputs_and_subset(client: th.InferenceServerClient, mnist_splits: Splits) -> None:
    x = mnist_splits.test.x[:4]
    every = infer(client, x, True)  # no outputs requested: all three, binary (tritonclient's default)
    assert {o["name"] for o in every.get_response()["outputs"]} == {"probabilities", "label", "icos_verdict"}
    only = infer(client, x, False, ("icos_verdict",), request_id="req-7")
    assert [o["name"] for o in only.get_response()["outputs"]] == ["icos_verdict"]
    assert only.get_response()["id"] == "req-7"
    assert only.as_numpy("label") is None


def test_idi_metadata_per_batch_and_per_sample(agent: RunningServer, mnist_splits: Splits) -> None:
    """The bundle's IDI: form == lines allows labels 1, 4, 7 only."""
    y = mnist_splits.test.y
    x = mnist_splits.test.x[np.isin(y, [0, 3, 6])][:6]  # labels outside {1, 4, 7}
    body = {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}],
        "parameters": {"form": "lines"},
        "outputs": [{"name": "icos_verdict"}],
    }
    r = httpx.post(f"{agent.url}/v2/models/mnist/infer", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == ["fail:idi"] * 6
    per_sample = ["lines", "curves", "lines", "", "curves", "lines"]
    body = {
        "inputs": [
            {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()},
            {"name": "form", "shape": [6], "datatype": "BYTES", "data": per_sample},
        ],
        "outputs": [{"name": "icos_verdict"}],
    }
    r = httpx.post(f"{agent.url}/v2/models/mnist/infer", json=body)
    assert r.status_code == 200, r.text
    got = r.json()["outputs"][0]["data"]
    assert [g == "fail:idi" for g in got] == [f == "lines" for f in per_sample]


def test_binary_bytes_metadata_input(client: th.InferenceServerClient, mnist_splits: Splits) -> None:
    y = mnist_splits.test.y
    x = mnist_splits.test.x[np.isin(y, [0, 3])][:3]
    inp = th.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    form = th.InferInput("form", [3], "BYTES")
    form.set_data_from_numpy(np.array([b"lines", b"curves", b"lines"], dtype=object), binary_data=True)
    res = client.infer("mnist", [inp, form], outputs=[th.InferRequestedOutput("icos_verdict")])
    got = res.as_numpy("icos_verdict").tolist()
    assert got[0] == got[2] == b"fail:idi"
    assert got[1] != b"fail:idi"


def settled_metrics(srv: RunningServer) -> Scrape:
    """The metrics once the predictions answered so far are all recorded."""
    settle(srv)
    return scrape(srv.url)


def test_metrics_and_estimates_move(
    client: th.InferenceServerClient, agent: RunningServer, mnist_splits: Splits
) -> None:
    before = settled_metrics(agent)  # earlier tests' predictions recorded
    est0 = httpx.get(f"{agent.url}/v1/estimates").json()
    x = mnist_splits.test.x[:64]
    res = infer(client, x, True, ("icos_verdict",))
    verdicts = [v.decode() for v in res.as_numpy("icos_verdict")]
    labels = {"model": "mnist", "version": "3"}
    # the answer carries the verdicts; windows and metrics are recorded right after, many requests at once
    after = settled_metrics(agent)
    assert after.value("icos_predictions_total", **labels) - before.value("icos_predictions_total", **labels) == 64
    passes = after.value("icos_verdicts_total", verdict="pass") - before.value("icos_verdicts_total", verdict="pass")
    assert passes == verdicts.count("pass")
    fails = after.value("icos_verdicts_total", verdict="fail") - before.value("icos_verdicts_total", verdict="fail")
    assert fails == 64 - verdicts.count("pass")
    est1 = httpx.get(f"{agent.url}/v1/estimates").json()
    for window in ("5m", "1h", "last1000"):
        assert est1["windows"][window]["n"] == est0["windows"].get(window, {"n": 0})["n"] + 64
        icos = est1["windows"][window]["estimates"]["icos"]
        assert icos["lower"] <= icos["value"] <= icos["upper"]
    assert est1["headline"] in est1["windows"]["5m"]["estimates"]
    n5 = after.value("icos_estimated_accuracy_samples", window="5m")
    assert n5 == est1["windows"]["5m"]["n"]
    flag = est1["windows"]["5m"]["flag"]  # is the headline right: the flag and the evidence it rests on
    assert {"raised", "reasons", "basis", "probability", "distance", "in_calibrated_range"} <= set(flag)
    assert flag["basis"] == "flag" and flag["distance"] >= 0.0
    assert after.value("icos_estimate_trust_distance", window="5m") == pytest.approx(flag["distance"])
    reason = flag["reasons"][0] if flag["reasons"] else "none"
    flagged = after.value("icos_estimate_flagged", window="5m", reason=reason)
    assert flagged == (1.0 if flag["raised"] else 0.0)
    assert est1["windows"]["5m"]["headline"]["flag_raised"] is flag["raised"]
    # the deprecated aliases (until 0.2.0) agree with the flag
    trust = est1["windows"]["5m"]["trust"]
    assert trust["calibrated"] is (not flag["raised"]) and trust["reasons"] == flag["reasons"]
    assert est1["windows"]["5m"]["headline"]["calibrated"] is (not flag["raised"])
    value = after.value("icos_estimated_accuracy_ratio", estimator="icos", window="last1000")
    assert 0.0 < value <= 1.0
    duration_count = "icos_inference_duration_seconds_count"
    assert after.value(duration_count, **labels) > before.value(duration_count, **labels)
    assert after.value("icos_oracle_tpr_ratio", **labels) > 0


def test_promtool_check_metrics(client: th.InferenceServerClient, agent: RunningServer, mnist_splits: Splits) -> None:
    promtool = require("promtool")
    infer(client, mnist_splits.test.x[:8], True)
    httpx.post(f"{agent.url}/v2/models/mnist/infer", content=b"{nope")
    text = httpx.get(f"{agent.url}/metrics").text
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_separate_metrics_port(mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    port = free_port()
    settings = serve_settings(mnist_bundle_dir)
    settings.server.metrics_port = port
    srv = start_server(create_app(settings, CollectorRegistry()))
    try:
        infer(th.InferenceServerClient(srv.hostport), mnist_splits.test.x[:2], True)
        settled_metrics(srv)
        on_main = httpx.get(f"{srv.url}/metrics").text
        on_side = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'icos_predictions_total{model="mnist",version="3"} 2.0' in on_main
        assert 'icos_predictions_total{model="mnist",version="3"} 2.0' in on_side
    finally:
        srv.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_verdict_not_requested_is_judged_off_the_request_path(
    client: th.InferenceServerClient, agent: RunningServer, mnist_splits: Splits
) -> None:
    before = httpx.get(f"{agent.url}/v1/estimates").json()["total_judged"]
    for i in range(5):
        res = infer(client, mnist_splits.test.x[i * 10 : (i + 1) * 10], True, ("probabilities", "label"))
        assert res.as_numpy("icos_verdict") is None
    assert wait_until(lambda: httpx.get(f"{agent.url}/v1/estimates").json()["total_judged"] == before + 50)


def test_concurrent_requests_get_their_own_verdicts(
    agent: RunningServer, mnist_splits: Splits, mnist_model: Any, mnist_bundle_dir: Path
) -> None:
    """Requests judged together in one oracle call still get exactly their own verdicts."""
    from concurrent.futures import ThreadPoolExecutor

    from invariants.bundle import Bundle
    from invariants.oracle import VERDICTS

    oracle = Bundle.load(mnist_bundle_dir).oracle()
    x_all = mnist_splits.test.x[:400]
    pred = mnist_model.predict(x_all)
    expected = oracle.judge(x_all.reshape(len(x_all), -1), pred.probabilities, pred.predicted).verdict
    sizes = [1, 7, 32, 3, 16, 1, 25, 9] * 4
    starts = np.cumsum([0, *sizes[:-1]])

    def one(k: int) -> list[str]:
        c = th.InferenceServerClient(agent.hostport)
        try:
            res = infer(c, x_all[starts[k] : starts[k] + sizes[k]], True, ("icos_verdict",))
            return [v.decode() for v in res.as_numpy("icos_verdict")]
        finally:
            c.close()

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(len(sizes))))
    for k, verdicts in enumerate(got):
        want = [VERDICTS[v] for v in expected[starts[k] : starts[k] + sizes[k]]]
        assert verdicts == want


def test_unused_bytes_inputs_are_ignored(agent: RunningServer, mnist_splits: Splits) -> None:
    x = mnist_splits.test.x[:2]
    body = {
        "inputs": [
            {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()},
            {"name": "customer", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]},
        ],
        "outputs": [{"name": "label"}],
    }
    r = httpx.post(f"{agent.url}/v2/models/mnist/infer", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == mnist_splits.test.y[:2].tolist()


def test_triton_extensions_are_answered_without_counting_as_invalid(
    client: th.InferenceServerClient, agent: RunningServer
) -> None:
    """Triton clients probe the repository index, the model configuration and statistics: the index is
    served, the rest is a 404 that says why, and none of it feeds the invalid-requests alert."""
    before = metric(agent.url, "icos_invalid_requests_total")
    index = client.get_model_repository_index()
    assert index == [{"name": "mnist", "version": "3", "state": "READY", "reason": ""}]
    for call in (lambda: client.get_model_config("mnist"), lambda: client.get_inference_statistics("mnist")):
        with pytest.raises(InferenceServerException) as info:
            call()
        assert "not served by icos-agent" in str(info.value)
    for path in ("/v2/models/stats", "/v2/models/mnist/versions/1/config", "/v2/models/mnist/versions/1/stats"):
        resp = httpx.get(f"{agent.url}{path}")
        assert resp.status_code == 404 and "Triton" in resp.json()["error"]
    after = metric(agent.url, "icos_invalid_requests_total")
    assert after == before
    assert httpx.get(f"{agent.url}/v2/models/nosuch").status_code == 404  # a wrong model still counts
    assert metric(agent.url, "icos_invalid_requests_total") == before + 1


def test_metrics_port_holds_no_thread_per_connection(mnist_bundle_dir: Path) -> None:
    """150 idle connections to the metrics port cost no thread each (the old server started one per
    connection, without bound); once they go, a scrape is answered at once; other paths are refused."""
    import socket
    import threading

    port = free_port()
    settings = serve_settings(mnist_bundle_dir)
    settings.server.metrics_port = port
    srv = start_server(create_app(settings, CollectorRegistry()))
    idle: list[socket.socket] = []
    try:
        threads_before = threading.active_count()
        for _ in range(150):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        # once the server has accepted all of them (those past its limit are refused), count the threads
        metrics_server = srv.app.state.agent._metrics_server
        assert wait_until(lambda: metrics_server.refused == 150 - MAX_CONNECTIONS)
        assert threading.active_count() < threads_before + 10
        for s in idle:
            s.close()
        idle.clear()
        resp = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert resp.status_code == 200 and "icos_predictions_total" in resp.text
        assert httpx.get(f"http://127.0.0.1:{port}/other", timeout=10).status_code == 404
        assert httpx.post(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 405
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Filler: " + b"a" * 20000 + b"\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.1 431")
    finally:
        for s in idle:
            s.close()
        srv.stop()
