"""The running agent's threads carry OS-level names (``top -H``, ``ps -L``, ``/proc/<pid>/task/*/comm``):
the background judge, the prediction-store writer and the worker threads that run the model."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from agent.protocol import v2
from tests.support.agent_process import AgentProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.needs("linux")


def test_agent_threads_are_named(tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    cfg = {
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(mnist_bundle_dir)},
        "state_dir": str(tmp_path / "state"),
        "audits": {"reservoir": {"size": 0}, "mlflow": {"enabled": False}},
    }
    agent = AgentProcess(tmp_path, cfg).start()
    try:
        x = np.ascontiguousarray(mnist_splits.test.x[:32], dtype=np.float32)  # 100 KB: model in a worker
        body, headers = v2.encode_request([v2.tensor("input", x, "FP32")], binary=True, request_id="big")
        r = httpx.post(f"{agent.url}/v2/models/mnist/infer", content=body, headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        assert wait_until(lambda: httpx.get(f"{agent.url}/v1/estimates", timeout=10).json()["total_judged"] == 32)
        names = agent.thread_names()
        assert {"icos-judge", "icos-store", "icos-worker"} <= set(names), names
        assert names["icos-judge"] == 1 and names["icos-store"] == 1, names
    finally:
        agent.kill()
