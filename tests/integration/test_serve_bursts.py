"""Bursts of large requests against a real agent process, over HTTP and gRPC: the bytes of request
bodies held at once are bounded (``server.max_inflight_bytes``: beyond it 503 with ``Retry-After``;
a gRPC call waits for room before its message is read, then ``UNAVAILABLE``; counted), other clients'
small requests keep being answered, liveness answers, and once the burst is over the process hands its
memory back (RSS returns near where it was before the burst)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.agents import Agents
from tests.support.ports import free_port
from tests.support.v2 import infer_body
from tests.support.waiting import wait_until

MiB = 1 << 20
BODY = 6 * MiB  # each request of the burst; 16 of them at once: 96 MiB
BATCH = BODY // (28 * 28 * 4)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS line")


@pytest.fixture(scope="module")
def agent(module_agents: Agents, mnist_bundle_dir: Path) -> tuple[AgentProcess, int]:
    grpc_port = free_port()
    config = {
        "mode": "serve",
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(mnist_bundle_dir)},
        "server": {
            "grpc_port": grpc_port,
            "max_body_bytes": 8 * MiB,
            "max_inflight_bytes": 16 * MiB,  # two of the burst's requests at once, at most
            "max_batch": 4096,
        },
        "labels": {"enabled": False},
        "audits": {"mlflow": {"enabled": False}},
    }
    return module_agents.process(config, name="bursts"), grpc_port


def _burst(send_one: Callable[[], Any], n: int = 16) -> list[Any]:
    out: list[Any] = []
    lock = threading.Lock()

    def run() -> None:
        r = send_one()
        with lock:
            out.append(r)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return out


def _small_requests_and_probes(url: str, stop: threading.Event, results: list[int]) -> None:
    """Another client: batch-1 inferences and liveness probes while the burst runs."""
    x = np.zeros((1, 1, 28, 28), np.float32)
    with httpx.Client(timeout=30) as c:
        for _ in range(2000):  # bounded, stopped by the event long before
            if stop.is_set():
                return
            results.append(c.post(f"{url}/v2/models/mnist/infer", json=infer_body(x)).status_code)
            results.append(c.get(f"{url}/v2/health/live").status_code)


def test_an_http_burst_is_bounded_and_its_memory_comes_back(agent: tuple[AgentProcess, int]) -> None:
    proc, _ = agent
    x = np.random.default_rng(0).uniform(0, 255, (BATCH, 1, 28, 28)).astype(np.float32)
    head = (
        b'{"inputs": [{"name": "input", "shape": [%d, 1, 28, 28], "datatype": "FP32", '
        b'"parameters": {"binary_data_size": %d}}], '
        b'"outputs": [{"name": "label", "parameters": {"binary_data": true}}]}' % (BATCH, x.nbytes)
    )
    body = head + x.tobytes()
    headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
    before_refusals = proc.metrics().get("icos_connections_refused_total{reason=bytes_in_flight}", 0.0)
    baseline = rss_mib(proc.pid)
    stop, other = threading.Event(), []
    side = threading.Thread(target=_small_requests_and_probes, args=(proc.url, stop, other))
    side.start()
    try:
        answers = _burst(
            lambda: httpx.post(f"{proc.url}/v2/models/mnist/infer", content=body, headers=headers, timeout=120)
        )
    finally:
        stop.set()
        side.join(timeout=60)
    codes = sorted(r.status_code for r in answers)
    assert set(codes) <= {200, 503} and codes.count(200) >= 1, codes
    busy = [r for r in answers if r.status_code == 503]
    assert busy and all(int(r.headers["Retry-After"]) >= 1 for r in busy)
    assert "server.max_inflight_bytes" in busy[0].json()["error"]
    assert other and set(other) == {200}, set(other)  # the other client was answered throughout
    refused = proc.metrics()["icos_connections_refused_total{reason=bytes_in_flight}"] - before_refusals
    assert refused == len(busy)
    # the burst is over: the memory comes back (a bounded wait for the hand-back thread)
    assert wait_until(lambda: rss_mib(proc.pid) < baseline + 150, 30), (baseline, rss_mib(proc.pid))


def _hold_the_budget(url: str, size: int) -> socket.socket:
    """A client that declares a body of ``size`` bytes and sends only its first byte: the agent holds that
    many bytes of its budget (server.max_inflight_bytes) until the connection closes."""
    host, port = url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=30)
    head = (
        f"POST /v2/models/mnist/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n\r\n{{"
    )
    conn.sendall(head.encode())
    return conn


def test_a_grpc_burst_waits_for_room_unread_and_its_memory_comes_back(agent: tuple[AgentProcess, int]) -> None:
    """A gRPC call takes room in the budget before its message is read: while the budget is full, 16 calls
    of 6 MiB wait unread (the process does not grow by their 96 MiB), then are refused UNAVAILABLE naming
    the budget, counted; once there is room a call is answered, and the memory comes back."""
    proc, grpc_port = agent
    x = np.random.default_rng(1).uniform(0, 255, (BATCH, 1, 28, 28)).astype(np.float32)
    req = service_pb2.ModelInferRequest(model_name="mnist")
    req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    baseline = rss_mib(proc.pid)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.max_send_message_length", -1)])
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    def one() -> str:
        try:
            stub.ModelInfer(req, timeout=120)
            return "OK"
        except grpc.RpcError as exc:
            return f"{exc.code().name}:{exc.details()}"

    holders = [_hold_the_budget(proc.url, 8 * MiB) for _ in range(2)]  # the whole budget, in two bodies
    small = infer_body(np.zeros((1, 1, 28, 28), np.float32))
    try:
        # the budget is held once a small request is refused for it
        assert wait_until(
            lambda: httpx.post(f"{proc.url}/v2/models/mnist/infer", json=small, timeout=30).status_code == 503, 30
        )
        before = proc.metrics()["icos_connections_refused_total{reason=bytes_in_flight}"]
        peak = [rss_mib(proc.pid)]
        done = threading.Event()

        def watch() -> None:
            for _ in range(100_000):  # bounded; stopped by the event once the burst is answered
                if done.wait(0.01):
                    return
                peak[0] = max(peak[0], rss_mib(proc.pid))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            outcomes = _burst(one)
        finally:
            done.set()
            watcher.join(timeout=30)
        assert len(outcomes) == 16 and all(
            o.startswith("UNAVAILABLE:") and "server.max_inflight_bytes" in o for o in outcomes
        ), outcomes
        assert peak[0] < baseline + 48, (baseline, peak[0])  # 16 messages of 6 MiB were never read
        refused = proc.metrics()["icos_connections_refused_total{reason=bytes_in_flight}"] - before
        assert refused == 16
    finally:
        for h in holders:
            h.close()
    try:
        assert wait_until(lambda: one() == "OK", 60)  # room again: a call is read and answered
    finally:
        channel.close()
    assert wait_until(lambda: rss_mib(proc.pid) < baseline + 150, 30), (baseline, rss_mib(proc.pid))
