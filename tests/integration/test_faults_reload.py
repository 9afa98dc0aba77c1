"""Reload with a corrupt or mismatched model or bundle, or a path outside ``security.allowed_roots``:
the reload answers 4xx naming the problem and the previous model keeps serving."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.v2 import verdict_body

TOKEN = "reload-fault-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_bad_reloads_keep_the_old_model(tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    root = tmp_path / "models"
    root.mkdir()
    model = root / "model.onnx"
    shutil.copy(default_model_path(), model)
    bundle = root / "bundle"
    shutil.copytree(mnist_bundle_dir, bundle)
    other = root / "other.onnx"  # a valid ONNX classifier the bundle was not fitted for
    shutil.copy(Path(default_model_path()).with_name("digits_cnn.onnx"), other)
    corrupt_bundle = root / "corrupt-bundle"
    shutil.copytree(mnist_bundle_dir, corrupt_bundle)
    (corrupt_bundle / "adi.onnx").write_bytes(b"\0" * 100)
    outside = tmp_path / "outside"
    shutil.copytree(mnist_bundle_dir, outside)
    cfg = {
        "model": {"name": "mnist", "path": str(model)},
        "bundle": {"path": str(bundle)},
        "security": {"allowed_roots": [str(root)]},
        "audits": {"reservoir": {"size": 0}, "mlflow": {"enabled": False}},
    }
    agent = AgentProcess(tmp_path, cfg, {"ICOS_AGENT_ADMIN_TOKEN": TOKEN}).start()
    x = mnist_splits.test.x[:4]
    try:
        with httpx.Client(timeout=60) as c:
            first = c.post(f"{agent.url}/v2/models/mnist/infer", json=verdict_body(x)).json()
            sha = c.get(f"{agent.url}/v2/models/mnist").json()["parameters"]["icos_model_sha256"]

            def still_serving() -> None:
                r = c.post(f"{agent.url}/v2/models/mnist/infer", json=verdict_body(x))
                assert r.status_code == 200 and r.json()["outputs"] == first["outputs"]
                assert c.get(f"{agent.url}/v2/models/mnist").json()["parameters"]["icos_model_sha256"] == sha

            cases = [
                ({"model_path": str(other)}, 400, "sha256"),  # mismatched model
                ({"bundle_path": str(corrupt_bundle)}, 400, "adi.onnx"),  # corrupt bundle
                ({"bundle_path": str(outside)}, 403, "allowed_roots"),  # outside the roots
                ({"bundle_path": str(root / ".." / "outside")}, 403, "allowed_roots"),
                ({"model_path": 5}, 400, "string"),
                ({"bundle_path": "a\u0000b"}, 400, "NUL"),  # the OS refuses such a path: the client's mistake
                ({"model_path": "x" * 5000}, 400, "4096"),
                ({"version": "v" * (1 << 20)}, 400, "version"),  # it would become a metric label
                ({"version": "1\nicos_fake 1"}, 400, "version"),
                ({"version": ""}, 400, "version"),
            ]
            for body, status, mention in cases:
                r = c.post(f"{agent.url}/v1/reload", json=body, headers=AUTH)
                assert r.status_code == status, r.text
                err = r.json()["error"]
                assert mention in err, err
                assert "still serving" in err or status == 400 and "reload:" in err, err
                still_serving()

            r = c.post(f"{agent.url}/v1/reload", json={"version": "2.0-rc.1"}, headers=AUTH)  # a valid version
            assert r.status_code == 200 and r.json()["model"]["version"] == "2.0-rc.1", r.text
            still_serving()

            # the configured file itself replaced by garbage, then reloaded
            model.write_bytes(b"not an onnx model")
            r = c.post(f"{agent.url}/v1/reload", headers=AUTH)
            assert r.status_code == 400 and "model.onnx" in r.json()["error"], r.text
            still_serving()
            (root / "link").symlink_to(outside)  # a link cannot lead out of a root
            r = c.post(f"{agent.url}/v1/reload", json={"bundle_path": str(root / "link")}, headers=AUTH)
            assert r.status_code == 403, r.text
            still_serving()
            metrics = agent.metrics()
            assert metrics["icos_invalid_requests_total{reason=reload}"] >= 3
            assert metrics["icos_invalid_requests_total{reason=forbidden_path}"] == 3
            assert metrics["icos_invalid_requests_total{reason=reload_request}"] == 5
    finally:
        agent.kill()
