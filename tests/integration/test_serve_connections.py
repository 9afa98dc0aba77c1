"""Connection hygiene of ``icos-agent serve`` (uvicorn + httptools + uvloop), against the real process.

With 256 file descriptors, 300 clients that open a connection and dribble header bytes used to take
every descriptor: a fresh ``/v2/health/live`` was reset until they left. Now connections past
``server.limit_concurrency`` are answered 503 (``Retry-After``) at once, a head not complete within
``server.header_timeout_seconds`` is closed, and a head over ``server.max_head_bytes`` is answered 431.
"""

from __future__ import annotations

import resource
import socket
import time
from pathlib import Path

import pytest

from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.agents import Agents

FLOOD = 300
LIMIT = 64
HEADER_TIMEOUT = 2
BODY_TIMEOUT = 3


def _nofile_256() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.fixture(scope="module")
def agent(module_agents: Agents, mnist_bundle_dir: Path) -> AgentProcess:
    cfg = {
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(mnist_bundle_dir)},
        "server": {
            "limit_concurrency": LIMIT,
            "header_timeout_seconds": HEADER_TIMEOUT,
            "body_timeout_seconds": BODY_TIMEOUT,
            "timeout_keep_alive_seconds": 1,
            "max_head_bytes": 16 * 1024,
        },
        "audits": {"reservoir": {"size": 0}, "mlflow": {"enabled": False}},
    }
    return module_agents.process(cfg, name="connections", preexec_fn=_nofile_256)


def _connect(agent: AgentProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", agent.port), timeout=5)


def _exchange(agent: AgentProcess, request: bytes, wait: float = 5.0) -> tuple[bytes, bool]:
    """Send ``request`` on a fresh connection; what came back and whether the server closed it
    (a reset counts as closed) within ``wait`` seconds."""
    out = b""
    with _connect(agent) as s:
        try:
            s.sendall(request)
        except OSError:  # the server closed while we were still sending
            return out, True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                return out, False
            except OSError:
                return out, True
            if not chunk:
                return out, True
            out += chunk
    return out, False


LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"


def test_dribbling_clients_cannot_take_every_descriptor(agent: AgentProcess) -> None:
    log_before = len(agent.log())
    dribblers: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            s = _connect(agent)
            dribblers.append(s)
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: agent\r\nX-Slow: ")
        # the server answers a fresh connection at once, not a timeout or a reset
        answer, closed = _exchange(agent, LIVE)
        status = answer.split(b"\r\n", 1)[0]
        assert status in (b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable"), answer[:300]
        if b"503" in status:
            assert b"retry-after: 1" in answer.lower() and b"server.limit_concurrency" in answer
        assert closed
        assert agent.open_fds() < 256
        # dribbling does not keep a connection: every one is closed once its head is overdue
        deadline = time.monotonic() + HEADER_TIMEOUT + 20
        open_ = list(dribblers)
        while open_ and time.monotonic() < deadline:
            still = []
            for s in open_:
                try:
                    s.send(b"a")
                    s.settimeout(0.001)
                    if s.recv(65536) == b"":
                        continue
                    still.append(s)
                except TimeoutError:
                    still.append(s)
                except OSError:
                    continue
            open_ = still
            time.sleep(0.5)
        assert not open_, f"{len(open_)} dribbling connections still open"
    finally:
        for s in dribblers:
            s.close()
    answer, _ = _exchange(agent, LIVE)
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:300]
    metrics = agent.metrics()
    assert metrics["icos_connections_refused_total{reason=limit_concurrency}"] >= 1
    assert metrics["icos_connections_refused_total{reason=header_timeout}"] >= 1
    assert len(agent.log()) - log_before < 20_000  # refusals are logged with a count, not once each


def test_oversized_request_head_is_refused(agent: AgentProcess) -> None:
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: agent\r\n" + b"X-Big: " + b"a" * (64 * 1024) + b"\r\n\r\n"
    answer, closed = _exchange(agent, head)
    assert closed
    assert not answer or answer.startswith(b"HTTP/1.1 431"), answer[:300]
    assert b"server.max_head_bytes" in answer or not answer
    assert agent.metrics()["icos_connections_refused_total{reason=max_head_bytes}"] >= 1


def test_idle_keep_alive_connection_is_closed(agent: AgentProcess) -> None:
    answer, closed = _exchange(agent, b"GET /v2/health/live HTTP/1.1\r\nHost: agent\r\n\r\n", wait=10)
    assert answer.startswith(b"HTTP/1.1 200 OK") and closed  # timeout_keep_alive_seconds: 1


def test_content_length_with_chunked_encoding_is_refused_and_closed(agent: AgentProcess) -> None:
    """Both framings in one request (request smuggling): httptools' parser refuses it and uvicorn closes."""
    body = b'{"inputs": []}'
    request = (
        b"POST /v2/models/mnist/infer HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
        b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
        + hex(len(body))[2:].encode()
        + b"\r\n"
        + body
        + b"\r\n0\r\n\r\n"
    )
    answer, closed = _exchange(agent, request)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert closed


def test_malformed_requests_are_counted_not_logged_each(agent: AgentProcess) -> None:
    """uvicorn logs "Invalid HTTP request received." once per such request: a flood of garbage would
    grow the log by a line each. Now each is answered 400, counted, and logged with a count."""
    before = agent.metrics().get("icos_connections_refused_total{reason=malformed_request}", 0.0)
    log_before = agent.log().count("Invalid HTTP request received")
    n = 40
    for i in range(n):
        answer, closed = _exchange(agent, b"\x16\x03\x01 not http at all " + str(i).encode() + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    after = agent.metrics()["icos_connections_refused_total{reason=malformed_request}"]
    assert after - before == n
    # none logged one by one (the throttled line with the counts comes at most every 10 s)
    assert agent.log().count("Invalid HTTP request received") == log_before


@pytest.mark.parametrize("path", ["/v2/models/mnist/infer", "/v1/labels"])
def test_a_body_sent_too_slowly_is_cut_off(agent: AgentProcess, path: str) -> None:
    """A complete head, then a body that never completes: closed ``server.body_timeout_seconds`` after
    the head (uvicorn has no such timeout), on the fast inference path and on a FastAPI route."""
    before = agent.metrics().get("icos_connections_refused_total{reason=body_timeout}", 0.0)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    with _connect(agent) as s:
        s.sendall(head + b'{"inputs": [')
        _closed_without_answer(s)
    assert agent.metrics()["icos_connections_refused_total{reason=body_timeout}"] == before + 1
    answer, _ = _exchange(agent, b"GET /v2/health/live HTTP/1.1\r\nHost: agent\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK")
    assert "internal error" not in agent.log()


def test_the_deadlines_of_a_kept_alive_connections_next_request_hold(agent: AgentProcess) -> None:
    """A connection's deadlines outlive the requests that ended theirs: after answered requests (each arming
    and ending a head and a body deadline), a next request on the same connection whose body never
    completes is still closed ``server.body_timeout_seconds`` after its head."""
    metrics = agent.metrics()
    before = metrics.get("icos_connections_refused_total{reason=body_timeout}", 0.0)
    heads = metrics.get("icos_connections_refused_total{reason=header_timeout}", 0.0)
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: agent\r\n\r\n"
    slow = b"POST /v1/labels HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
    with _connect(agent) as s:
        for _ in range(3):  # answered, well within every deadline and the keep-alive timeout
            s.sendall(live)
            answer = b""
            for _ in range(100):  # the answer's pieces
                chunk = s.recv(4096)
                assert chunk, "closed after an answered request"
                answer += chunk
                if b"\r\n\r\n" in answer and answer.rstrip().endswith(b"}"):
                    break
            assert answer.startswith(b"HTTP/1.1 200 OK")
        s.sendall(slow)
        _closed_without_answer(s)
    after = agent.metrics()
    assert after["icos_connections_refused_total{reason=body_timeout}"] == before + 1
    assert after.get("icos_connections_refused_total{reason=header_timeout}", 0.0) == heads  # its head came whole


def _closed_without_answer(s: socket.socket) -> None:
    """``s`` is closed by the agent, without an answer, within the body deadline (and a margin)."""
    s.settimeout(BODY_TIMEOUT + 10)
    try:
        data = s.recv(4096)
    except TimeoutError:
        pytest.fail(f"the connection was still open {BODY_TIMEOUT + 10} s after the head")
    except OSError:  # reset
        data = b""
    assert data == b"", data[:300]  # closed without an answer
