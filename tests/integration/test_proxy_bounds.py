"""Proxy mode against a hostile upstream: one that dribbles its answer a byte at a time, declares or
streams a huge answer, or answers 500 with a traceback. Each proxied call ends within one total
deadline (``upstream.timeout_seconds``), a huge answer is refused without being buffered (the agent's
peak RSS stays bounded), and nothing of an upstream's error body but a sanitised 4xx message reaches
the client.

The upstream is a raw asyncio HTTP/1.1 server on a loopback port (full control over how the answer
is framed and paced); the agent runs as a real process so its memory can be read from ``/proc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.data.datasets import Splits
from tests.support.agent_process import AgentProcess
from tests.support.agents import Agents
from tests.support.v2 import verdict_body

TIMEOUT_SECONDS = 2.0
#: Generous bound on a call that must end at its deadline: "seconds, not minutes".
MARGIN_SECONDS = 8.0
MAX_RESPONSE_BYTES = 1024 * 1024
#: What a "huge" upstream streams before it stops: far past the cap, small enough that the code
#: before the bound (which buffered it all) grows the agent by hundreds of MiB, not gigabytes.
HUGE_STREAMED = 256 * 1024 * 1024
#: Peak-RSS growth allowed while refusing huge answers (the cap is 1 MiB).
RSS_GROWTH_BOUND = 96 * 1024 * 1024
POOL = 64  # the agent's upstream connection pool
DRIBBLE_INTERVAL = 0.5
DRIBBLE_LENGTH = 2000  # 1000 s at one byte per 0.5 s: only a total deadline ends it in time

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/secret-model/server.py", line 42, in predict\n'
    "    weights = load('/srv/secret-model/weights.bin')\n"
    "RuntimeError: SECRET-INTERNAL-DETAIL"
)
FAST_ANSWER = json.dumps(
    {
        "model_name": "m",
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [1, 10], "data": [0.1] * 10}],
    }
).encode()


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _answer(kind: str, writer: asyncio.StreamWriter) -> None:
    """Write the answer ``kind`` (the request's id up to its first ``-``) asks for."""
    if kind == "fast":
        writer.write(_head(200, {"Content-Type": "application/json", "Content-Length": str(len(FAST_ANSWER))}))
        writer.write(FAST_ANSWER)
    elif kind == "dribble":
        writer.write(_head(200, {"Content-Type": "application/json", "Content-Length": str(DRIBBLE_LENGTH)}))
        for _ in range(DRIBBLE_LENGTH):
            if writer.is_closing():
                return
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(DRIBBLE_INTERVAL)
    elif kind in ("declared", "chunked"):
        chunk = b"0" * (1024 * 1024)
        if kind == "declared":  # declares 1.5 GB, streams HUGE_STREAMED of it
            writer.write(_head(200, {"Content-Type": "application/json", "Content-Length": str(1_500_000_000)}))
        else:  # no declared length: only the streamed count can bound it
            writer.write(_head(200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}))
            chunk = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        for _ in range(HUGE_STREAMED // (1024 * 1024)):
            writer.write(chunk)
            await writer.drain()
        if kind == "chunked":
            writer.write(b"0\r\n\r\n")
    elif kind == "traceback":
        body = TRACEBACK.encode()
        writer.write(_head(500, {"Content-Type": "text/plain", "Content-Length": str(len(body))}) + body)
    elif kind in ("jsontraceback", "rejected"):
        status, error = (500, TRACEBACK) if kind == "jsontraceback" else (422, "bad pixel range\n" + TRACEBACK)
        body = json.dumps({"error": error}).encode()
        writer.write(_head(status, {"Content-Type": "application/json", "Content-Length": str(len(body))}) + body)
    await writer.drain()


class RawUpstream:
    """A V2 "server" on a loopback port, run by an asyncio loop in a thread; how it answers depends
    on the forwarded request's id."""

    def __init__(self) -> None:
        self.writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="raw-upstream", daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop
        ).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            while True:  # keep-alive: one request after another on this connection
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length:\s*(\d+)", head)
                body = await reader.readexactly(int(length.group(1))) if length else b""
                rid = re.search(rb'"id"\s*:\s*"([a-z]+)', body)
                await _answer(rid.group(1).decode() if rid else "fast", writer)
        self.writers.discard(writer)
        writer.close()

    def stop(self) -> None:
        async def close() -> None:
            """Abort every connection: the handlers see a closed writer and end."""
            self.server.close()
            for writer in list(self.writers):
                writer.transport.abort()
            await asyncio.sleep(DRIBBLE_INTERVAL * 2)

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def upstream() -> Iterator[RawUpstream]:
    srv = RawUpstream()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def agent(mnist_bundle_dir: Path, upstream: RawUpstream, module_agents: Agents) -> AgentProcess:
    cfg = {
        "mode": "proxy",
        "model": {"name": "mnist"},
        "bundle": {"path": str(mnist_bundle_dir)},
        "upstream": {"url": upstream.url, "timeout_seconds": TIMEOUT_SECONDS, "max_response_bytes": MAX_RESPONSE_BYTES},
        "server": {"threads": 4},
        "audits": {"reservoir": {"size": 0}, "mlflow": {"enabled": False}},
    }
    return module_agents.process(cfg, name="proxy-bounds")


def _body(splits: Splits, kind: str) -> dict[str, Any]:
    return {**verdict_body(splits.test.x[:1]), "id": f"{kind}-1"}


def _post(agent: AgentProcess, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = httpx.post(f"{agent.url}/v2/models/mnist/infer", json=body, timeout=120)
    return r, time.monotonic() - t0


def _errors(agent: AgentProcess, reason: str) -> float:
    return agent.metrics().get(f"icos_upstream_errors_total{{reason={reason}}}", 0.0)


def _peak_rss(agent: AgentProcess) -> int:
    for line in Path(f"/proc/{agent.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM line")


def test_dribbling_upstream_ends_at_the_total_deadline(agent: AgentProcess, mnist_splits: Splits) -> None:
    before = _errors(agent, "timeout")
    r, seconds = _post(agent, _body(mnist_splits, "dribble"))
    assert r.status_code == 504, r.text
    assert "did not answer within 2 s" in r.json()["error"]
    assert seconds < TIMEOUT_SECONDS + MARGIN_SECONDS, seconds
    assert _errors(agent, "timeout") == before + 1


def test_slow_upstream_calls_do_not_starve_others(agent: AgentProcess, mnist_splits: Splits) -> None:
    """A full pool of dribbling calls: a call made meanwhile ends by its own deadline, and once the
    dribbling calls hit theirs the pool serves again."""
    url = f"{agent.url}/v2/models/mnist/infer"

    async def one(c: httpx.AsyncClient, kind: str, delay: float) -> tuple[int, float]:
        await asyncio.sleep(delay)
        t0 = time.monotonic()
        r = await c.post(url, json=_body(mnist_splits, kind))
        return r.status_code, time.monotonic() - t0

    async def run() -> list[tuple[int, float]]:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=POOL + 8)) as c:
            slow = [one(c, "dribble", 0.0) for _ in range(POOL)]
            during = one(c, "fast", 0.5)  # while the pool is held by the dribbling calls
            after = one(c, "fast", TIMEOUT_SECONDS + 2.0)  # once they have been cut off
            return list(await asyncio.gather(*slow, during, after))

    results = asyncio.run(run())
    slow, (during_status, during_s), (after_status, _) = results[:POOL], results[POOL], results[POOL + 1]
    assert {s for s, _ in slow} == {504}
    assert max(t for _, t in slow) < TIMEOUT_SECONDS + MARGIN_SECONDS
    assert during_status in (200, 504) and during_s < TIMEOUT_SECONDS + MARGIN_SECONDS, (during_status, during_s)
    assert after_status == 200
    assert httpx.get(f"{agent.url}/v2/health/ready", timeout=10).status_code == 200


@pytest.mark.parametrize("kind", ["declared", "chunked"])
def test_huge_upstream_answer_is_refused_unbuffered(agent: AgentProcess, mnist_splits: Splits, kind: str) -> None:
    r, _ = _post(agent, _body(mnist_splits, "fast"))  # warm-up: the path of one proxied call is allocated
    assert r.status_code == 200, r.text
    peak, before = _peak_rss(agent), _errors(agent, "too_large")
    r, seconds = _post(agent, _body(mnist_splits, kind))
    assert r.status_code == 502, r.text
    assert _peak_rss(agent) - peak < RSS_GROWTH_BOUND, f"peak RSS grew {(_peak_rss(agent) - peak) >> 20} MiB"
    assert "upstream.max_response_bytes (1048576 bytes)" in r.json()["error"]
    assert _errors(agent, "too_large") == before + 1
    assert _post(agent, _body(mnist_splits, "fast"))[0].status_code == 200  # the agent serves on


@pytest.mark.parametrize("kind", ["traceback", "jsontraceback"])
def test_upstream_traceback_never_reaches_the_client(agent: AgentProcess, mnist_splits: Splits, kind: str) -> None:
    before = _errors(agent, "bad_status")
    r, _ = _post(agent, _body(mnist_splits, kind))
    assert r.status_code == 502
    assert r.json() == {
        "error": "upstream answered 500 Internal Server Error; its body is not passed on (see the agent's log)"
    }
    assert _errors(agent, "bad_status") == before + 1
    assert "SECRET-INTERNAL-DETAIL" in agent.log()  # logged server-side, bounded


def test_upstream_rejection_passes_only_a_sanitised_first_line(agent: AgentProcess, mnist_splits: Splits) -> None:
    r, _ = _post(agent, _body(mnist_splits, "rejected"))
    assert r.status_code == 422
    error = r.json()["error"]
    assert "bad pixel range" in error
    assert "Traceback" not in error and "SECRET" not in error and "/srv" not in error
