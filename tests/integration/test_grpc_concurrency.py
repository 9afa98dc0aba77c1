"""Concurrent batch-1 gRPC calls against a real agent process, at the default limits: sixteen clients at once
cost the agent about the CPU per call one client does. Each call reserves the most a message may be before
reading it (``2 × server.max_body_bytes``); two such reservations at once once counted as a burst of large
requests, so the agent collected and trimmed its heap every time the calls in flight fell to zero, and waiting
calls were all woken at every byte given back: seven to nine times the CPU per call at 16 clients. Asserted on
work done (CPU seconds of the agent process per call, concurrency 16 against 1 in the same test), never on
wall-clock time."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.agents import Agents
from tests.support.ports import free_port

CALLS_PER_CLIENT = 60
#: CPU per call at 16 clients ÷ at 1 client: about 1 on a healthy server; 7 and more when calls spin on
#: each other (see the module docstring). Wide, since other tests share the machine.
MAX_RATIO = 2.5


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of every thread the process ran so far (ended threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def agent(module_agents: Agents, mnist_bundle_dir: Path) -> tuple[AgentProcess, int]:
    grpc_port = free_port()
    config = {
        "mode": "serve",
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(mnist_bundle_dir)},
        "server": {"grpc_port": grpc_port},  # the default body and in-flight limits
        "labels": {"enabled": False},
        "audits": {"mlflow": {"enabled": False}},
    }
    return module_agents.process(config, name="grpc-concurrency"), grpc_port


def _request() -> service_pb2.ModelInferRequest:
    x = np.random.default_rng(0).uniform(0, 255, (1, 1, 28, 28)).astype(np.float32)
    req = service_pb2.ModelInferRequest(model_name="mnist")
    inp = req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    inp.contents.fp32_contents.extend(x.ravel().tolist())
    for name in ("probabilities", "label", "icos_verdict"):  # verdicts: judged on the request path
        req.outputs.add(name=name)
    return req


def _cpu_per_call(pid: int, port: int, clients: int) -> float:
    """The agent's CPU seconds per call while ``clients`` threads each make :data:`CALLS_PER_CLIENT` calls."""
    req = _request()
    failures: list[BaseException] = []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        stub.ModelInfer(req, timeout=30)  # warm

        def client() -> None:
            try:
                for _ in range(CALLS_PER_CLIENT):
                    stub.ModelInfer(req, timeout=30)
            except BaseException as exc:  # reported below, with the assertion
                failures.append(exc)

        threads = [threading.Thread(target=client) for _ in range(clients)]
        before = cpu_seconds(pid)
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        used = cpu_seconds(pid) - before
    assert not failures, failures[0]
    return used / (clients * CALLS_PER_CLIENT)


def test_sixteen_concurrent_grpc_clients_cost_about_what_one_does(agent: tuple[AgentProcess, int]) -> None:
    proc, port = agent
    one = _cpu_per_call(proc.pid, port, 1)
    sixteen = _cpu_per_call(proc.pid, port, 16)
    assert sixteen <= MAX_RATIO * one, (
        f"CPU per call: {1000 * sixteen:.2f} ms at 16 clients against {1000 * one:.2f} ms at 1 "
        f"({sixteen / one:.1f}×; bound {MAX_RATIO}×)"
    )
