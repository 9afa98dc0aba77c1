"""Proxy mode: a second agent in serve mode is the upstream V2 server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as th
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from tests.support.inprocess import RunningServer
from tests.support.metrics import metric
from tests.support.settings import mnist_app, upstream_app
from tests.support.waiting import wait_until


def proxy_app(bundle: Path, url: str, timeout: float = 10.0, model_name: str = "mnist-upstream") -> Any:
    return mnist_app(
        bundle,
        "proxy",
        model={"name": "mnist", "version": "2", "path": str(default_model_path())},
        upstream={"url": url, "model_name": model_name, "timeout_seconds": timeout},
    )


def test_proxy_forwards_and_judges(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits
) -> None:
    up = run_server(upstream_app(mnist_bundle_dir))
    px = run_server(proxy_app(mnist_bundle_dir, up.url))
    client = th.InferenceServerClient(px.hostport)
    assert client.is_server_ready() and client.is_model_ready("mnist")
    assert client.get_model_metadata("mnist")["platform"] == "icos_proxy"
    x = mnist_splits.test.x[:12]
    direct = th.InferenceServerClient(up.hostport)
    for binary in (True, False):
        inp = th.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        res = client.infer(
            "mnist",
            [inp],
            outputs=[
                th.InferRequestedOutput(n, binary_data=binary) for n in ("probabilities", "label", "icos_verdict")
            ],
        )
        ref = direct.infer("mnist-upstream", [inp])
        np.testing.assert_allclose(res.as_numpy("probabilities"), ref.as_numpy("probabilities"), rtol=1e-6)
        np.testing.assert_array_equal(res.as_numpy("label"), ref.as_numpy("label"))
        got = [v.decode() if isinstance(v, bytes) else v for v in res.as_numpy("icos_verdict").tolist()]
        want = [v.decode() for v in ref.as_numpy("icos_verdict").tolist()]  # same model and bundle: same verdicts
        assert got == want
    # no outputs requested: the upstream's answer plus icos_verdict
    inp = th.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    res = client.infer("mnist", [inp], request_id="abc")
    names = [o["name"] for o in res.get_response()["outputs"]]
    assert sorted(names) == ["icos_verdict", "label", "probabilities"] and names[-1] == "icos_verdict"
    assert res.get_response()["model_name"] == "mnist" and res.get_response()["id"] == "abc"
    # recorded off the request path, by the background judge
    assert wait_until(lambda: metric(px.url, "icos_predictions_total", model="mnist") == 36)
    # a client mistake is answered by the proxy itself and never reaches the upstream
    before = metric(up.url, "icos_invalid_requests_total")
    bad = httpx.post(
        f"{px.url}/v2/models/mnist/infer",
        json={"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]},
    )
    assert bad.status_code == 400 and "shape" in bad.json()["error"]
    assert metric(up.url, "icos_invalid_requests_total") == before


def test_proxy_runs_the_oracle_before_answering_only_for_verdicts(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxied request that does not ask for ``icos_verdict`` is answered without an oracle call on its
    path; its predictions are still judged and recorded, by the background judge."""
    import agent.judging.loop as loop_module

    calls: list[int] = []
    judge = loop_module.judge

    def spy(works: Any) -> None:
        if works[0].rt.name == "mnist":  # the proxy's, not its upstream's (an agent in serve mode)
            calls.append(len(works))
        judge(works)

    monkeypatch.setattr(loop_module, "judge", spy)
    up = run_server(upstream_app(mnist_bundle_dir))
    px = run_server(proxy_app(mnist_bundle_dir, up.url))
    client = th.InferenceServerClient(px.hostport)
    x = mnist_splits.test.x[:5]
    inp = th.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    res = client.infer("mnist", [inp], outputs=[th.InferRequestedOutput("label", binary_data=True)])
    assert [o["name"] for o in res.get_response()["outputs"]] == ["label"]
    assert calls == []
    assert wait_until(lambda: metric(px.url, "icos_predictions_total", model="mnist") == 5)
    res = client.infer("mnist", [inp], outputs=[th.InferRequestedOutput("icos_verdict", binary_data=True)])
    assert len(res.as_numpy("icos_verdict")) == 5 and calls == [1]
    assert wait_until(lambda: metric(px.url, "icos_predictions_total", model="mnist") == 10)


def test_upstream_down_is_502(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits
) -> None:
    up = run_server(upstream_app(mnist_bundle_dir))
    px = run_server(proxy_app(mnist_bundle_dir, up.url))
    x = mnist_splits.test.x[:2]
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    assert httpx.post(f"{px.url}/v2/models/mnist/infer", json=body).status_code == 200
    up.stop()
    r = httpx.post(f"{px.url}/v2/models/mnist/infer", json=body)
    assert r.status_code == 502
    assert "unreachable" in r.json()["error"]
    assert metric(px.url, "icos_upstream_errors_total", reason="unreachable") == 1
    assert httpx.get(f"{px.url}/v2/health/live").status_code == 200


def test_slow_upstream_is_504(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits
) -> None:
    async def slow(request: Request) -> JSONResponse:
        await asyncio.sleep(1.0)  # longer than the proxy's 0.3 s timeout
        return JSONResponse({"error": "too late"}, status_code=500)

    slow_app = Starlette(routes=[Route("/v2/models/{name}/infer", slow, methods=["POST"])])
    up = run_server(slow_app)
    px = run_server(proxy_app(mnist_bundle_dir, up.url, timeout=0.3))
    x = mnist_splits.test.x[:1]
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    r = httpx.post(f"{px.url}/v2/models/mnist/infer", json=body, timeout=10)
    assert r.status_code == 504
    assert "did not answer within 0.3 s" in r.json()["error"]
    assert metric(px.url, "icos_upstream_errors_total", reason="timeout") == 1


def test_proxy_inference_skips_fastapis_stack_in_both_agents(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits
) -> None:
    """A forwarded request is answered by the plain ASGI inference path in the proxy as in its upstream:
    FastAPI's routing, dependency and exception layers cost about a sixth of the proxy's CPU per request at
    batch 1. A middleware added to each app counts what reaches FastAPI: none of the inference requests (in
    either agent), while the estimates request does (the count works)."""
    reached: dict[str, list[str]] = {"proxy": [], "upstream": []}

    def counted(app: Any, name: str) -> Any:
        class Count:
            def __init__(self, inner: Any) -> None:
                self.inner = inner

            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                if scope["type"] == "http":
                    reached[name].append(scope["path"])
                await self.inner(scope, receive, send)

        app.add_middleware(Count)
        return app

    up = run_server(counted(upstream_app(mnist_bundle_dir), "upstream"))
    px = run_server(counted(proxy_app(mnist_bundle_dir, up.url), "proxy"))
    x = mnist_splits.test.x[:4]
    body = {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
        "outputs": [{"name": "label"}, {"name": "icos_verdict"}],
    }
    for _ in range(3):
        r = httpx.post(f"{px.url}/v2/models/mnist/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
    bad = httpx.post(f"{px.url}/v2/models/mnist/infer", content=b"{not json", timeout=30)
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]  # errors come from the same table
    assert httpx.get(f"{px.url}/v1/estimates", timeout=30).status_code == 200
    assert [p for p in reached["proxy"] if p.endswith("/infer")] == [], reached
    assert [p for p in reached["upstream"] if p.endswith("/infer")] == [], reached
    assert "/v1/estimates" in reached["proxy"]
