"""Request ids are bounded and never multiplied: a long id cannot make an answer, a stored row or a
listing of the labeling sample grow with the batch (the agent runs on loopback, real clients)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from agent.labels.backend import MAX_LISTING_BYTES, unlabeled_sample
from agent.protocol import v2
from tests.support.agents import Agents
from tests.support.inprocess import RunningServer, settle, start_server
from tests.support.settings import mnist_app

INFER = "/v2/models/mnist/infer"


@pytest.fixture(scope="module")
def agent(module_agents: Agents, mnist_bundle_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    return module_agents.serve(
        mnist_app(mnist_bundle_dir, state=tmp_path_factory.mktemp("ids"), labels={"sample_rate": 1.0})
    )


def _binary_request(rid: str, n: int) -> tuple[bytes, dict[str, str]]:
    x = np.zeros((n, 1, 28, 28), np.float32)
    return v2.encode_request(
        [v2.tensor("input", x, "FP32")],
        binary=True,
        request_id=rid,
        outputs=[v2.RequestedOutput("label", True)],
    )


def test_the_answer_names_the_id_once_whatever_the_batch(agent: RunningServer) -> None:
    sizes = {}
    for rid in ("a", "b" * 256):
        body, headers = _binary_request(rid, 64)
        r = httpx.post(agent.url + INFER, content=body, headers=headers)
        assert r.status_code == 200, r.text
        resp = v2.decode_response(r.content, r.headers.get(v2.HEADER_LENGTH))
        assert resp.id == rid and resp.parameters["icos_prediction_count"] == 64
        sizes[rid] = len(r.content)
    # 255 more bytes of id cost 255 more bytes of answer, not 64 × 255
    assert sizes["b" * 256] - sizes["a"] == 255


def test_a_long_id_is_refused_before_anything_is_stored(agent: RunningServer) -> None:
    settle(agent)  # what earlier requests sent is recorded
    judged = httpx.get(f"{agent.url}/v1/estimates").json()["total_judged"]
    body, headers = _binary_request("x" * 100_000, 256)
    r = httpx.post(agent.url + INFER, content=body, headers=headers)
    assert r.status_code == 400 and len(r.content) < 300
    assert "100000 bytes" in r.json()["error"] and "256" in r.json()["error"]
    assert httpx.get(f"{agent.url}/v1/estimates").json()["total_judged"] == judged


def test_labeled_ids_and_listings_stay_small(agent: RunningServer) -> None:
    body, headers = _binary_request("c" * 256, 32)
    assert httpx.post(agent.url + INFER, content=body, headers=headers).status_code == 200
    listing = httpx.get(f"{agent.url}/v1/labels/requests", params={"limit": 1000}).json()
    assert listing["n"] >= 32 and all(len(r["id"]) <= 256 + 21 for r in listing["requests"])
    # a label naming an id longer than any prediction id is invalid, and not echoed back
    long_id = "d" * 10_000
    r = httpx.post(f"{agent.url}/v1/labels", json={"labels": [{"id": long_id, "label": 1}]})
    assert r.status_code == 200 and r.json()["invalid"] == 1
    assert long_id not in r.text and len(r.content) < 500


def test_observe_ids_are_bounded(mnist_bundle_dir: Path) -> None:
    srv = start_server(mnist_app(mnist_bundle_dir, "observe", model={"name": "mnist"}))
    try:
        x = np.zeros((3, 784), np.float32).tolist()
        p = np.full((3, 10), 0.1).tolist()
        r = httpx.post(f"{srv.url}/v1/observe", json={"id": "o" * 300, "inputs": x, "probabilities": p})
        assert r.status_code == 400 and "300 bytes" in r.json()["error"]
        r = httpx.post(f"{srv.url}/v1/observe", json={"id": "ok", "inputs": x, "probabilities": p})
        assert r.status_code == 202 and r.json() == {"id": "ok", "accepted": 3}
        headers = {"ce-id": "e" * 300, "ce-type": "org.kubeflow.serving.inference.response", "ce-specversion": "1.0"}
        data = json.dumps({"outputs": [{"name": "probabilities", "shape": [3, 10], "datatype": "FP32", "data": p}]})
        r = httpx.post(f"{srv.url}/v1/observe", content=data, headers=headers)
        assert r.status_code == 400 and "ce-id" in r.json()["error"]
    finally:
        srv.stop()


def test_a_listing_is_bounded_in_bytes_and_skips_ids_stored_before_the_bound() -> None:
    """Rows as a store written before ids were bounded may hold them: the listing skips such ids, and
    stops at :data:`MAX_LISTING_BYTES` of ids whatever its row limit."""
    sampled = np.arange(100, dtype=np.int32).tobytes()
    rows = [(1, "z" * 1_000_000, 0, 100, 10.0, sampled)]
    rows += [(seq, "y" * 256, 0, 100, 9.0 - seq * 1e-3, sampled) for seq in range(2, 100)]
    out = unlabeled_sample(lambda ts, seq: [r for r in rows if (r[4], r[0]) < (ts, seq)], lambda seqs: set(), 10**6)
    assert out and all(not pid.startswith("z") for pid, _ in out)
    assert sum(len(pid) for pid, _ in out) <= MAX_LISTING_BYTES + 300
    assert len(out) < 98 * 100
