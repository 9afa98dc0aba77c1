"""Audit and fit runs in a real ``mlflow server`` (sqlite backend, proxied artifacts, free port).

* The agent runs an audit while MLflow is down: the run is spooled in the state directory, serving
  goes on, and once the server is up the spooled run arrives (params, metrics, artifacts, tags).
* ``icos-agent audit dscore --mlflow URI`` logs a run with the JSON report and the PNG heatmaps.
* ``icos-agent fit --mlflow URI`` logs a run; the model is registered with its bundle and an agent
  loads both from ``models:/name@alias``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from agent.cli import main
from agent.config.settings import load_settings
from agent.data.datasets import Splits
from agent.model.classifier import OnnxClassifier, default_model_path
from agent.server.app import create_app
from tests.support.inprocess import RunningServer
from tests.support.mlflow import MlflowServer
from tests.support.ports import free_port
from tests.support.requirements import require

MODEL = default_model_path()
TOKEN = "audit-mlflow-token"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def mlflow_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory, mlflow_port: int) -> Iterator[MlflowServer]:
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow-server"), mlflow_port)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, mnist_splits: Splits) -> Path:
    path = tmp_path_factory.mktemp("audit-mlflow-data") / "reference.npz"
    np.savez(path, x=mnist_splits.test.x[:100], y=mnist_splits.test.y[:100])
    return path


def _client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _runs(uri: str, experiment: str) -> list[Any]:
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else list(client.search_runs([exp.experiment_id]))


def _artifacts(uri: str, run_id: str, dest: Path) -> dict[str, bytes]:
    from mlflow.artifacts import download_artifacts

    local = Path(download_artifacts(run_id=run_id, artifact_path="", dst_path=str(dest), tracking_uri=uri))
    return {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()}


def _check_dscore_run(uri: str, run: Any, tmp: Path, *, name: str, version: str, sha: str) -> dict[str, Any]:
    data = run.data
    assert run.info.status == "FINISHED"
    assert data.tags["icos.kind"] == "dscore" and data.tags["icos.audit.status"] == "success"
    assert data.tags["icos.model.name"] == name
    assert data.tags["icos.model.version"] == version
    assert data.tags["icos.model.sha256"] == sha
    assert data.params["n"] == "3" and data.params["t"] == "5.0" and data.params["n_samples"] == "100"
    for key in ("dscore", "robustness", "fitness", "base_accuracy", "augmentation_probability", "seconds"):
        assert key in data.metrics, key
    assert data.metrics["dscore"] == pytest.approx(data.metrics["fitness"] - data.metrics["robustness"])
    files = _artifacts(uri, run.info.run_id, tmp)
    assert set(files) == {
        "report.json",
        "plots/dscore_feature_distribution.png",
        "plots/dscore_attention_distribution.png",
    }
    assert all(files[p].startswith(PNG_MAGIC) for p in files if p.endswith(".png"))
    report = json.loads(files["report.json"])
    assert report["kind"] == "dscore" and len(report["result"]["details"]["variant_accuracies"]) == 9
    assert report["result"]["metrics"]["dscore"] == pytest.approx(data.metrics["dscore"])
    return report


def test_agent_spools_while_mlflow_is_down_then_delivers(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    mlflow_port: int,
    mnist_bundle_dir: Path,
    reference: Path,
    run_server: Callable[..., RunningServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require("mlflow")
    monkeypatch.setenv("ICOS_AGENT_ADMIN_TOKEN", TOKEN)
    uri = f"http://127.0.0.1:{mlflow_port}"  # nothing listens there yet
    cfg = {
        "model": {"name": "mnist", "version": "4", "path": str(MODEL)},
        "bundle": {"path": str(mnist_bundle_dir)},
        "state_dir": str(tmp_path / "state"),
        "audits": {
            "reference": {"path": str(reference)},
            "mlflow": {"tracking_uri": uri, "experiment": "agent-audits"},
        },
    }
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(cfg))
    app = create_app(load_settings(tmp_path / "agent.yaml"))
    srv = run_server(app)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    out = httpx.post(f"{srv.url}/v1/audits/dscore?wait=true", headers=auth, timeout=120).json()
    assert out["status"] == "success"
    assert out["mlflow"] == {"run_id": None, "spooled": True}
    spool = tmp_path / "state" / "mlflow-spool"
    assert len(list(spool.glob("*.json"))) == 1
    assert httpx.get(f"{srv.url}/v2/health/ready").status_code == 200  # serving unaffected
    assert httpx.get(f"{srv.url}/v1/audits").json()["mlflow"]["pending"] == 1

    server: MlflowServer = request.getfixturevalue("mlflow_server")
    assert server.uri == uri
    assert app.state.audits.flush_mlflow() == 1
    assert not list(spool.glob("*.json"))
    runs = _runs(uri, "agent-audits")
    assert len(runs) == 1
    sha = OnnxClassifier.load(MODEL).sha256
    report = _check_dscore_run(uri, runs[0], tmp_path / "dl", name="mnist", version="4", sha=sha)
    assert report["id"] == out["id"] and report["trigger"] == "manual"
    assert runs[0].data.tags["icos.bundle.digest"]
    assert app.state.audits.flush_mlflow() == 0  # nothing left, nothing logged twice
    assert len(_runs(uri, "agent-audits")) == 1


def test_cli_dscore_run_arrives(
    mlflow_server: MlflowServer, reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["audit", "dscore", "--model", str(MODEL), "--data", str(reference), "--mlflow", mlflow_server.uri]
    argv += ["--experiment", "cli-audits", "--state-dir", str(tmp_path), "--model-version", "7", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    run_id = out["mlflow"]["run_id"]
    assert run_id and out["mlflow"]["spooled"] is False
    run = _client(mlflow_server.uri).get_run(run_id)
    _check_dscore_run(
        mlflow_server.uri, run, tmp_path / "dl", name="mnist_cnn", version="7", sha=out["model"]["sha256"]
    )


def test_fit_run_and_agent_loading_from_model_uri(
    mlflow_server: MlflowServer,
    mnist_splits: Splits,
    tmp_path: Path,
    run_server: Callable[..., RunningServer],
    capsys: pytest.CaptureFixture[str],
) -> None:
    from exporters.mlflow_logger import log_model

    s = mnist_splits
    np.savez(tmp_path / "train.npz", x=s.train.x[:800], y=s.train.y[:800])
    np.savez(tmp_path / "val.npz", x=s.val.x[:500], y=s.val.y[:500])
    bundle = tmp_path / "bundle"
    argv = ["fit", "--model", str(MODEL), "--train", str(tmp_path / "train.npz"), "--val", str(tmp_path / "val.npz")]
    argv += ["--trees", "10", "--out", str(bundle), "--mlflow", mlflow_server.uri, "--experiment", "fits"]
    assert main([*argv, "--state-dir", str(tmp_path / "state"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    run = _client(mlflow_server.uri).get_run(summary["mlflow"]["run_id"])
    assert run.data.tags["icos.kind"] == "fit"
    assert run.data.tags["icos.model.sha256"] == summary["model_sha256"]
    assert run.data.params["trees"] == "10" and run.data.params["confidence"] == "0.99"
    assert run.data.metrics["val_accuracy"] == pytest.approx(summary["val_accuracy"])
    assert "calibration_tpr" in run.data.metrics
    files = _artifacts(mlflow_server.uri, run.info.run_id, tmp_path / "dl")
    assert "fit_summary.json" in files and "bundle/manifest.json" in files and "bundle/tdi.json" in files

    version = log_model(
        MODEL, registered_name="mnist-cnn", tracking_uri=mlflow_server.uri, experiment="models", bundle_dir=bundle
    )
    _client(mlflow_server.uri).set_registered_model_alias("mnist-cnn", "prod", version.version)
    cfg = {
        "model": {"name": "mnist", "uri": "models:/mnist-cnn@prod", "tracking_uri": mlflow_server.uri},
        "state_dir": str(tmp_path / "agent-state"),
    }
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(cfg))
    settings = load_settings(tmp_path / "agent.yaml")
    srv = run_server(create_app(settings))
    meta = httpx.get(f"{srv.url}/v2/models/mnist").json()
    assert meta["parameters"]["icos_model_sha256"] == summary["model_sha256"]
    assert settings.model.path is not None and (tmp_path / "agent-state" / "models") in settings.model.path.parents
    x = s.test.x[:4]
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    assert httpx.post(f"{srv.url}/v2/models/mnist/infer", json=body, timeout=30).status_code == 200
