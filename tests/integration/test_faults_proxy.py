"""Proxy mode with a slow or dead upstream, under concurrency: every request ends within the bounded
timeout as a JSON 504/502, and the agent's threads and file descriptors do not grow with the load."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.data.datasets import Splits
from tests.support.agent_process import AgentProcess
from tests.support.inprocess import RunningServer, start_server
from tests.support.ports import free_port
from tests.support.v2 import verdict_body
from tests.support.waiting import wait_until

SLOW_SECONDS = 5.0
TIMEOUT_SECONDS = 0.5
#: The agent's worker-thread pool (``server.threads``). It grows lazily up to this size, so how many
#: of its threads exist after a wave depends on timing; what must not happen is growth with the load.
POOL_THREADS = 4


async def slow_upstream(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A V2 server that never answers in time (plain ASGI)."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await asyncio.sleep(SLOW_SECONDS)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


@pytest.fixture
def slow_server() -> Iterator[RunningServer]:
    srv = start_server(slow_upstream)
    yield srv
    srv.stop()


def _proxy(tmp_path: Path, bundle: Path, upstream: str) -> AgentProcess:
    cfg = {
        "mode": "proxy",
        "model": {"name": "mnist"},
        "bundle": {"path": str(bundle)},
        "upstream": {"url": upstream, "timeout_seconds": TIMEOUT_SECONDS},
        "server": {"threads": POOL_THREADS},
        "audits": {"reservoir": {"size": 0}, "mlflow": {"enabled": False}},
    }
    return AgentProcess(tmp_path, cfg).start(wait_for="/v2/health/live")  # its upstream is never ready


def _wave(url: str, body: dict[str, Any], n: int) -> list[tuple[int, str, float]]:
    async def one(c: httpx.AsyncClient) -> tuple[int, str, float]:
        t0 = time.monotonic()
        r = await c.post(f"{url}/v2/models/mnist/infer", json=body)
        return r.status_code, r.json()["error"], time.monotonic() - t0

    async def run() -> list[tuple[int, str, float]]:
        limits = httpx.Limits(max_connections=n)
        async with httpx.AsyncClient(timeout=60, limits=limits) as c:
            return list(await asyncio.gather(*(one(c) for _ in range(n))))

    return asyncio.run(run())


@pytest.mark.parametrize("kind", ["slow", "down"])
def test_upstream_faults_are_bounded(
    kind: str, tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits, request: pytest.FixtureRequest
) -> None:
    upstream = request.getfixturevalue("slow_server").url if kind == "slow" else f"http://127.0.0.1:{free_port()}"
    status, reason = (504, "timeout") if kind == "slow" else (502, "unreachable")
    agent = _proxy(tmp_path, mnist_bundle_dir, upstream)
    body = verdict_body(mnist_splits.test.x[:2])
    try:
        for r in _wave(agent.url, body, 16):  # warm-up: connection handling and clients exist
            assert r[0] == status, r
        threads, fds = agent.threads(), agent.open_fds()
        for _ in range(3):
            results = _wave(agent.url, body, 64)
            assert {r[0] for r in results} == {status}, results[:3]
            assert all(r[1] for r in results)
            if kind == "slow":
                assert all("did not answer within" in r[1] for r in results)
        # 3 x 64 requests: a thread per request (or per connection) would add hundreds; the pool may
        # still be filling up to its bound after the warm-up. The connections of the last wave close.
        assert wait_until(lambda: agent.threads() <= threads + POOL_THREADS + 2, 10), (threads, agent.threads())
        assert wait_until(lambda: agent.open_fds() <= fds + 8, 10), (fds, agent.open_fds())
        assert agent.metrics()[f"icos_upstream_errors_total{{reason={reason}}}"] == 16 + 3 * 64
        assert httpx.get(f"{agent.url}/v2/health/live").status_code == 200
    finally:
        agent.kill()
