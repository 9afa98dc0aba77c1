"""KServe's own gRPC client (``kserve.InferenceGRPCClient``, from ``build/kserve-venv``: KServe pins its
own FastAPI, protobuf and grpcio) against the agent's gRPC port: health, model readiness and an
inference with raw contents answer as the agent's HTTP path does, verdicts included."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as th

from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.agents import Agents
from tests.support.ports import free_port
from tests.support.requirements import require

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "tests" / "kserve" / "grpc_client.py"
OUTPUTS = ("probabilities", "label", "icos_verdict")


@pytest.fixture(scope="module")
def agent(module_agents: Agents, mnist_bundle_dir: Path) -> tuple[AgentProcess, int]:
    """Stopped with SIGTERM after the module: it must exit with 0."""
    require("kserve")
    port = free_port()
    config = {
        "mode": "serve",
        "model": {"name": "mnist", "version": "2", "path": str(default_model_path())},
        "bundle": {"path": str(mnist_bundle_dir)},
        "server": {"grpc_port": port},
    }
    return module_agents.process(config, name="kserve", graceful=True), port


def test_kserve_grpc_client_gets_what_http_answers(
    agent: tuple[AgentProcess, int], mnist_splits: Splits, tmp_path: Path
) -> None:
    proc, port = agent
    x = np.ascontiguousarray(mnist_splits.test.x[:5], dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    run = subprocess.run(
        [str(require("kserve")), str(CLIENT), f"127.0.0.1:{port}", "mnist", str(tmp_path / "x.npy")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    assert (got["live"], got["ready"], got["model_ready"]) == (True, True, True)
    assert got["id"] == "kserve-1" and got["outputs"] == sorted(OUTPUTS)

    http = th.InferenceServerClient(f"127.0.0.1:{proc.port}")
    inp = th.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    ref = http.infer("mnist", [inp], outputs=[th.InferRequestedOutput(n) for n in OUTPUTS])
    np.testing.assert_allclose(np.asarray(got["probabilities"]), ref.as_numpy("probabilities"), rtol=1e-6)
    assert got["label"] == ref.as_numpy("label").tolist()
    assert got["icos_verdict"] == [v.decode() for v in ref.as_numpy("icos_verdict")]
