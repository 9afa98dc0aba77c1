"""A challenger that misbehaves (a real ONNX model, :mod:`tests.support.bad_challenger`: it answers NaN, raises
inside onnxruntime, computes for seconds, or answers 11 classes) never changes or holds up the champion's
answers: two real agent processes, one with the bad challenger beside the champion and one without, get the
same requests over HTTP (uvicorn) and gRPC and answer them byte for byte the same; the challenger's queue stays
within ``challenger.queue_limit`` and each failure is counted in ``icos_challenger_dropped_total``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.agents import Agents
from tests.support.bad_challenger import TRIGGERS, write_bad_challenger
from tests.support.challenger import fit_challenger_bundle
from tests.support.metrics import scrape
from tests.support.ports import free_port
from tests.support.settings import mnist_config
from tests.support.v2 import infer_body
from tests.support.waiting import poll

QUEUE_LIMIT = 2
OUTPUTS = ("probabilities", "label", "icos_verdict")
#: Requests sent at most while the slow call holds the challenger's thread, waiting for a drop (a bound).
MAX_BURST = 200


@pytest.fixture(scope="module")
def bad_challenger(tmp_path_factory: pytest.TempPathFactory, mnist_splits: Splits) -> tuple[Path, Path]:
    """The bad challenger's model and its bundle, fitted as the shipped CNN's challenger (no trigger in the data)."""
    root = tmp_path_factory.mktemp("bad-challenger")
    model = write_bad_challenger(root / "bad.onnx")
    return model, fit_challenger_bundle(root, mnist_splits, default_model_path(), model=model)


class Served:
    """One agent process: its HTTP URL and a gRPC stub of its V2 service."""

    def __init__(self, proc: AgentProcess, grpc_port: int) -> None:
        self.proc = proc
        self.url = proc.url
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def http(self, x: np.ndarray, rid: str) -> bytes:
        r = httpx.post(f"{self.url}/v2/models/mnist/infer", json=infer_body(x, OUTPUTS, rid), timeout=60)
        assert r.status_code == 200, r.text
        return r.content

    def grpc(self, x: np.ndarray, rid: str) -> bytes:
        req = service_pb2.ModelInferRequest(model_name="mnist", id=rid)
        req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        req.raw_input_contents.append(np.ascontiguousarray(x, dtype=np.float32).tobytes())
        for name in OUTPUTS:
            req.outputs.add(name=name)
        answer: Any = self.stub.ModelInfer(req, timeout=60)
        return bytes(answer.SerializeToString(deterministic=True))


@pytest.fixture(scope="module")
def agents(
    module_agents: Agents,
    mnist_bundle_dir: Path,
    bad_challenger: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Served, Served]]:
    """The champion alone, and the champion with the bad challenger (every request paired)."""
    model, bundle = bad_challenger
    challenger = {
        "model_path": str(model),
        "bundle_path": str(bundle),
        "version": "bad",
        "share": 1.0,
        "queue_limit": QUEUE_LIMIT,
    }
    out = []
    for name, extra in (("alone", {}), ("beside", {"challenger": challenger})):
        port = free_port()
        state = tmp_path_factory.mktemp(f"state-{name}")
        server = {"grpc_port": port}
        cfg = mnist_config(mnist_bundle_dir, state=state, server=server, labels={"enabled": False}, **extra)
        out.append(Served(module_agents.process(cfg, name=name), port))
    yield out[0], out[1]
    for s in out:
        s.channel.close()


def _digits(splits: Splits, start: int, n: int = 4, trigger: str | None = None) -> np.ndarray:
    x = np.asarray(splits.test.x[start : start + n], dtype=np.float32).copy()
    if trigger is not None:
        x[0, 0, 0, 0] = TRIGGERS[trigger]
    return x


def _same(alone: Served, beside: Served, x: np.ndarray, rid: str) -> None:
    """The same request to both agents, over both protocols: the answers are byte for byte the same."""
    assert beside.http(x, rid) == alone.http(x, rid)
    assert beside.grpc(x, rid + "-g") == alone.grpc(x, rid + "-g")


def _dropped(served: Served) -> dict[str, float]:
    s = scrape(served.url)
    reasons = ("queue_full", "error", "bad_output")
    return {r: s.value("icos_challenger_dropped_total", challenger="bad", reason=r) for r in reasons}


FAILURES = [("nan", "bad_output"), ("other_classes", "bad_output"), ("raise", "error")]


@pytest.mark.parametrize(("trigger", "reason"), FAILURES)
def test_a_failing_challenger_is_counted_and_the_champion_answers_the_same(
    agents: tuple[Served, Served], mnist_splits: Splits, trigger: str, reason: str
) -> None:
    alone, beside = agents
    before = _dropped(beside)
    _same(alone, beside, _digits(mnist_splits, 0), f"{trigger}-before")
    _same(alone, beside, _digits(mnist_splits, 4, trigger=trigger), f"{trigger}-bad")
    _same(alone, beside, _digits(mnist_splits, 8), f"{trigger}-after")
    poll(lambda: _dropped(beside)[reason] > before[reason], timeout=60, what=f"a drop counted as {reason}")
    # the estimates stay a JSON document of finite numbers
    body = httpx.get(f"{beside.url}/v1/estimates", timeout=30)
    assert body.status_code == 200
    doc = json.loads(body.content, parse_constant=lambda c: pytest.fail(f"{c} in /v1/estimates"))
    assert doc["challenger"]["dropped"][reason] >= 1


def test_a_slow_challenger_fills_its_bounded_queue_and_the_champion_never_waits(
    agents: tuple[Served, Served], mnist_splits: Splits
) -> None:
    """While one call of the challenger computes for seconds, requests keep being answered, the same, and once
    ``queue_limit`` wait the next ones are dropped and counted at once (a bounded loop until the first drop)."""
    alone, beside = agents
    before = _dropped(beside)
    _same(alone, beside, _digits(mnist_splits, 12, trigger="slow"), "slow-0")
    for k in range(1, MAX_BURST + 1):
        _same(alone, beside, _digits(mnist_splits, 4 * (k % 200)), f"slow-{k}")
        if _dropped(beside)["queue_full"] > before["queue_full"]:
            break
    else:
        pytest.fail(f"no request dropped for a full queue in {MAX_BURST} requests")
    assert scrape(beside.url).value("icos_challenger_queue_length", challenger="bad") <= QUEUE_LIMIT
