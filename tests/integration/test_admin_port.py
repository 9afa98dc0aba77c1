"""``server.admin_port``: the admin API answers only on its own port, and that port answers only the
admin API and the health checks (a real agent process, two listening sockets)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from agent.config.settings import AgentSettings
from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.ports import free_port
from tests.support.v2 import verdict_body

TOKEN = "admin-port-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_admin_api_on_its_own_port(tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    admin_port = free_port()
    cfg = {
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(mnist_bundle_dir)},
        "server": {"admin_port": admin_port},
        "audits": {"reservoir": {"size": 0}, "mlflow": {"enabled": False}},
    }
    agent = AgentProcess(tmp_path, cfg, {"ICOS_AGENT_ADMIN_TOKEN": TOKEN}).start()
    admin = f"http://127.0.0.1:{admin_port}"
    x = mnist_splits.test.x[:2]
    try:
        with httpx.Client(timeout=60) as c:
            # The main port: inference as usual, the admin API refused (even with a valid token).
            assert c.post(f"{agent.url}/v2/models/mnist/infer", json=verdict_body(x)).status_code == 200
            r = c.post(f"{agent.url}/v1/reload", headers=AUTH)
            assert r.status_code == 404 and "admin_port" in r.json()["error"]
            r = c.post(f"{agent.url}/v1/audits/metamorphic", headers=AUTH)
            assert r.status_code == 404 and "admin_port" in r.json()["error"]
            # The admin port: the admin API (token still checked) and the probes, nothing else.
            assert c.post(f"{admin}/v1/reload").status_code == 401
            r = c.post(f"{admin}/v1/reload", headers=AUTH)
            assert r.status_code == 200 and r.json()["reloaded"] is True
            assert c.get(f"{admin}/v2/health/live").status_code == 200
            assert c.get(f"{admin}/v2/health/ready").status_code == 200
            for method, path in (("POST", "/v2/models/mnist/infer"), ("GET", "/metrics"), ("GET", "/v1/estimates")):
                r = c.request(method, f"{admin}{path}", json=verdict_body(x) if method == "POST" else None)
                assert r.status_code == 404, (path, r.status_code)
                assert "server.port" in r.json()["error"]
            m = agent.metrics()
            assert m["icos_invalid_requests_total{reason=admin_port}"] == 5.0
        assert agent.terminate() == 0  # both sockets close on SIGTERM, state flushed
    finally:
        agent.kill()


def test_admin_port_must_differ(tmp_path: Path, mnist_bundle_dir: Path) -> None:

    with pytest.raises(ValidationError, match="admin_port must differ"):
        AgentSettings(
            model={"name": "m", "path": str(default_model_path())},
            bundle={"path": str(mnist_bundle_dir)},
            server={"port": 8080, "admin_port": 8080},
        )
