"""Observe mode's memory bounds under a memory limit: unpaired CloudEvents are bounded in bytes
(``observe.max_pending_bytes``), per-sample metadata strings per value and per batch, both checked
before the memory is taken.

The agent runs as a real process whose address space is limited with ``prlimit`` (the chart's pod has
1 GiB), so a regression fails the test instead of taking the test runner down with it.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from agent.data.datasets import Splits
from agent.dataplane.observe import REQUEST, RESPONSE, EventPairer, PendingFull
from agent.model.classifier import OnnxClassifier
from tests.support.agent_process import AgentProcess
from tests.support.inprocess import RunningServer
from tests.support.metrics import metric
from tests.support.settings import observe_app
from tests.support.v2 import REQUEST_TYPE, RESPONSE_TYPE, ce_headers, v2_request
from tests.support.waiting import wait_until

#: Address space the agent may take beyond what it holds once started (the 1 GiB pod, less the
#: interpreter, numpy, onnxruntime and the fitted bundle that the measured baseline already counts).
HEADROOM = 700 * 1024 * 1024


def _vm_size(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/<pid>/status")


@pytest.fixture
def limited_agent(tmp_path: Path, mnist_bundle_dir: Path) -> Iterator[AgentProcess]:
    """An observe-mode agent with the default bounds, its address space limited once it is up."""
    cfg: dict[str, Any] = {
        "mode": "observe",
        "observe": {"event_ttl_seconds": 600},  # nothing expires while the test fills the buffer
        "state_dir": str(tmp_path / "state"),
        "model": {"name": "mnist"},
        "bundle": {"path": str(mnist_bundle_dir)},
        "windows": {"time": ["5m"], "count": 100000},
        "labels": {"enabled": False},
    }
    env = {"MALLOC_ARENA_MAX": "2", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    agent = AgentProcess(tmp_path, cfg, env).start()
    try:
        limit = _vm_size(agent.pid) + HEADROOM
        resource.prlimit(agent.pid, resource.RLIMIT_AS, (limit, limit))
        yield agent
    finally:
        agent.kill()


def _zeros_request(n: int = 1024) -> bytes:
    """A 1.6 MB V2 request of the largest batch (``server.max_batch``): 3.2 MB once decoded."""
    body = {"id": "r", "inputs": [{"name": "input", "shape": [n, 784], "datatype": "FP32", "data": [0] * (n * 784)}]}
    return json.dumps(body, separators=(",", ":")).encode()


@pytest.mark.timeout(900)  # 300 requests of 1.6 MB: about 100 s on two loaded cores
def test_unpaired_request_events_bounded_in_bytes(limited_agent: AgentProcess) -> None:
    """300 unpaired 1.6 MB request events (about 1 GB decoded, which the count bound of 10,000 let in):
    once 64 MiB wait, the rest are refused with 429 and Retry-After; the agent stays up and pairs again."""
    agent = limited_agent
    body = _zeros_request()
    assert 1_500_000 < len(body) < 1_700_000
    codes: list[int] = []
    with httpx.Client(timeout=60) as c:
        for i in range(300):
            r = c.post(f"{agent.url}/v1/observe", content=body, headers=ce_headers(f"big-{i}", REQUEST_TYPE))
            codes.append(r.status_code)
            if r.status_code == 429:
                assert int(r.headers["Retry-After"]) >= 1
                assert "observe.max_pending_bytes" in r.json()["error"]
            else:
                assert r.status_code == 202, r.text
        assert agent.proc is not None and agent.proc.poll() is None, agent.log()[-3000:]
        assert c.get(f"{agent.url}/v2/health/live").status_code == 200
        accepted = codes.count(202)
        # 64 MiB hold 20 decoded events of 3.2 MB; the count bound is far away
        assert 15 <= accepted <= 25 and codes.count(429) == 300 - accepted, codes
        assert set(codes[accepted:]) == {429}
        m = agent.metrics()
        assert m["icos_observe_events_unmatched_total{reason=overflow}"] == 300 - accepted
        assert m["icos_invalid_requests_total{reason=observe_pending_full}"] == 300 - accepted
        # a response for a waiting request still pairs (it frees memory), and then there is room again
        logits = json.dumps(
            {"outputs": [{"name": "logits", "shape": [1024, 10], "datatype": "FP32", "data": [0.0] * 10240}]}
        ).encode()
        r = c.post(f"{agent.url}/v1/observe", content=logits, headers=ce_headers("big-0", RESPONSE_TYPE))
        assert r.status_code == 202 and r.json()["paired"] is True, r.text
        r = c.post(f"{agent.url}/v1/observe", content=body, headers=ce_headers("big-new", REQUEST_TYPE))
        assert r.status_code == 202, r.text
        assert wait_until(lambda: c.get(f"{agent.url}/v1/estimates").json()["total_judged"] == 1024, 60)


def test_long_metadata_in_a_large_batch_refused_before_allocating(
    limited_agent: AgentProcess, mnist_splits: Splits
) -> None:
    """One 2 MB metadata value among 1024 samples: a fixed-width array of them would take 2 GB."""
    agent = limited_agent
    x = np.zeros((1024, 784), dtype=np.float32)
    form = ["lines"] * 1023 + ["c" * 2_000_000]
    probs = np.full((1024, 10), 0.1).tolist()
    with httpx.Client(timeout=60) as c:
        direct = {"inputs": x.tolist(), "probabilities": probs, "metadata": {"form": form}}
        r = c.post(f"{agent.url}/v1/observe", json=direct)
        assert r.status_code == 413, r.text
        assert "server.max_metadata_value_bytes" in r.json()["error"]
        tensors = json.loads(v2_request(x))
        tensors["inputs"].append({"name": "form", "shape": [1024], "datatype": "BYTES", "data": form})
        r = c.post(f"{agent.url}/v1/observe", json=tensors, headers=ce_headers("meta-1", REQUEST_TYPE))
        assert r.status_code == 413, r.text
        assert "server.max_metadata_value_bytes" in r.json()["error"]
        assert agent.proc is not None and agent.proc.poll() is None, agent.log()[-3000:]
        assert c.get(f"{agent.url}/v2/health/live").status_code == 200
        assert agent.metrics()["icos_invalid_requests_total{reason=metadata_too_large}"] == 2
        # short values still pass
        ok = {"inputs": x[:5].tolist(), "probabilities": probs[:5], "metadata": {"form": ["lines"] * 5}}
        assert c.post(f"{agent.url}/v1/observe", json=ok).status_code == 202


def test_metadata_bounds_per_value_and_per_batch(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, mnist_model: OnnxClassifier
) -> None:
    """Values over ``max_metadata_value_bytes``, or a batch whose values take more than
    ``max_metadata_bytes`` as a fixed-width array, are refused with 413 naming the setting."""
    app = observe_app(mnist_bundle_dir, server={"max_metadata_value_bytes": 64}, max_metadata_bytes=2048)
    srv = run_server(app)
    x = mnist_splits.test.x[:40]
    probs = mnist_model.predict(x).probabilities.tolist()
    url = f"{srv.url}/v1/observe"

    def send(form: list[str]) -> httpx.Response:
        return httpx.post(
            url,
            json={"inputs": x[: len(form)].tolist(), "probabilities": probs[: len(form)], "metadata": {"form": form}},
        )

    r = send(["lines", "c" * 65])
    assert r.status_code == 413 and "server.max_metadata_value_bytes" in r.json()["error"], r.text
    assert send(["lines", "c" * 64]).status_code == 202
    # 40 values of up to 60 bytes: 2400 bytes as a fixed-width array, over 2048
    r = send(["lines"] * 39 + ["c" * 60])
    assert r.status_code == 413 and "observe.max_metadata_bytes" in r.json()["error"], r.text
    assert send(["lines"] * 40).status_code == 202
    assert metric(srv.url, "icos_invalid_requests_total", reason="metadata_too_large") == 2


def test_pairer_accounts_bytes_through_pairs_duplicates_evictions_and_expiry() -> None:
    """The byte total follows every way an event leaves the buffer, so the bound never drifts."""
    p = EventPairer(ttl_seconds=10, capacity=2, max_bytes=100)
    assert p.add("a", REQUEST, "ra", 0.0, 40) is None and p.bytes == 40
    assert p.add("a", REQUEST, "ra2", 1.0, 30) is None and p.bytes == 30 and p.duplicates == 1
    assert p.add("b", REQUEST, "rb", 1.0, 60) is None and p.bytes == 90
    with pytest.raises(PendingFull) as full:
        p.add("c", RESPONSE, "pc", 2.0, 20)
    assert full.value.status == 429 and full.value.headers == {"Retry-After": "8"} and p.overflow == 1
    assert p.bytes == 90 and len(p) == 2  # nothing stored, nothing evicted
    assert p.add("b", RESPONSE, "pb", 2.0, 50) == ("rb", "pb") and p.bytes == 30  # a pair always fits
    with pytest.raises(PendingFull) as alone:
        p.add("d", REQUEST, "rd", 2.0, 101)
    assert alone.value.status == 413
    assert p.add("c", RESPONSE, "pc", 2.0, 20) is None and p.bytes == 50
    assert p.add("e", RESPONSE, "pe", 3.0, 10) is None and p.evicted == 1 and p.bytes == 30  # "a" evicted
    assert p.expire(20.0) == 2 and p.bytes == 0 and len(p) == 0
