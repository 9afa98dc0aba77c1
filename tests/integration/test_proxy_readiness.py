"""Proxy mode's readiness follows its upstream's: an agent in serve mode is the upstream, stopped and
started again on the same port while the proxy (a real process, with its gRPC service) keeps running."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import tritonclient.grpc as tg

from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.inprocess import RunningServer
from tests.support.ports import free_port
from tests.support.settings import upstream_app
from tests.support.v2 import verdict_body
from tests.support.waiting import poll

#: How often the proxy asks its upstream (short, so that the test waits little; the default is 2 s).
INTERVAL = 0.2


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return -1


def test_readiness_follows_the_upstream(
    tmp_path: Path, run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits
) -> None:
    up = run_server(upstream_app(mnist_bundle_dir))
    grpc_port = free_port()
    cfg = {
        "mode": "proxy",
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(mnist_bundle_dir)},
        "upstream": {
            "url": up.url,
            "model_name": "mnist-upstream",
            "ready_interval_seconds": INTERVAL,
            "ready_timeout_seconds": 1.0,
        },
        "server": {"grpc_port": grpc_port},
        "audits": {"reservoir": {"size": 0}, "mlflow": {"enabled": False}},
    }
    body = verdict_body(mnist_splits.test.x[:2])
    with AgentProcess(tmp_path, cfg) as proxy, tg.InferenceServerClient(f"127.0.0.1:{grpc_port}") as grpc:
        ready, model_ready, infer = (
            f"{proxy.url}/v2/health/ready",
            f"{proxy.url}/v2/models/mnist/ready",
            f"{proxy.url}/v2/models/mnist/infer",
        )
        assert _status(ready) == 200 and _status(model_ready) == 200
        assert grpc.is_server_ready() and grpc.is_model_ready("mnist")
        assert proxy.scrape().value("icos_upstream_ready") == 1
        assert httpx.post(infer, json=body, timeout=30).status_code == 200

        up.stop()
        poll(lambda: _status(ready) == 503, timeout=10, interval=0.05, what="503 once the upstream is down")
        answer = httpx.get(ready, timeout=5).json()
        assert answer["ready"] is False and answer["reason"].startswith("upstream not ready: unreachable"), answer
        assert _status(model_ready) == 503
        assert not grpc.is_server_ready() and not grpc.is_model_ready("mnist")
        assert proxy.scrape().value("icos_upstream_ready") == 0
        assert httpx.post(infer, json=body, timeout=30).status_code == 502  # still answers, and says why
        assert _status(f"{proxy.url}/v2/health/live") == 200  # not ready is not dead: no restart
        # the unready time grows while the upstream stays down
        down = poll(lambda: proxy.scrape().value("icos_upstream_unready_seconds_total"), 10, 0.05, "unready time")
        poll(lambda: proxy.scrape().value("icos_upstream_unready_seconds_total") > down, 10, 0.05, "it to grow")

        run_server(upstream_app(mnist_bundle_dir), up.port)  # the upstream is back, on the same address
        poll(lambda: _status(ready) == 200, timeout=10, interval=0.05, what="200 once the upstream is back")
        assert _status(model_ready) == 200
        assert grpc.is_server_ready() and grpc.is_model_ready("mnist")
        scraped = proxy.scrape()
        assert scraped.value("icos_upstream_ready") == 1
        assert scraped.value("icos_upstream_unready_seconds_total") >= INTERVAL
        assert httpx.post(infer, json=body, timeout=30).status_code == 200
        log = proxy.log()
        assert log.count("upstream not ready") == 1 and log.count("upstream ready again") == 1, log[-3000:]
