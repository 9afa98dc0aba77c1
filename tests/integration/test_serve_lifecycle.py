"""State across restarts, SIGTERM under load, atomic reload under load, admin authentication."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from agent.data.datasets import Splits
from agent.model.classifier import OnnxClassifier, default_model_path
from agent.server.app import create_app
from agent.server.composition import Agent
from tests.support.agent_process import AgentProcess, clean_env
from tests.support.inprocess import RunningServer
from tests.support.settings import mnist_config, stateful_settings
from tests.support.v2 import estimates, infer_body
from tests.support.waiting import on_loop, wait_until


def test_restart_restores_windows(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path
) -> None:
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path), CollectorRegistry()))
    for i in range(5):
        x = mnist_splits.test.x[i * 20 : (i + 1) * 20]
        assert httpx.post(f"{srv.url}/v2/models/mnist/infer", json=infer_body(x)).status_code == 200
    # predictions are recorded right after their answer (a short linger): wait for the last ones
    assert wait_until(lambda: estimates(srv.url)["total_judged"] == 100)
    before = estimates(srv.url)
    srv.stop()
    srv2 = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path), CollectorRegistry()))
    after = estimates(srv2.url)
    assert after["total_judged"] == 100
    for w in ("5m", "1h", "last100000"):
        assert after["windows"][w]["n"] == before["windows"][w]["n"] == 100
        assert after["windows"][w]["estimates"] == before["windows"][w]["estimates"]
    # counters restart from zero; estimates keep their windows
    assert 'icos_predictions_total{model="mnist",version="1"} 0.0' in httpx.get(f"{srv2.url}/metrics").text


def test_pending_observations_survive_restart(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    mnist_model: OnnxClassifier,
    tmp_path: Path,
) -> None:
    def app() -> Any:
        s = stateful_settings(mnist_bundle_dir, tmp_path, mode="observe", server={"graceful_timeout_seconds": 0.2})
        return create_app(s, CollectorRegistry())

    srv = run_server(app())
    svc: Agent = srv.app.state.agent
    assert svc.loop is not None and svc.observe is not None
    on_loop(svc.loop, svc.observe.judging.clear)
    x = mnist_splits.test.x[:8]
    body = {
        "inputs": x.tolist(),
        "probabilities": mnist_model.predict(x).probabilities.tolist(),
        "metadata": {"form": "lines"},
    }
    for _ in range(4):
        assert httpx.post(f"{srv.url}/v1/observe", json=body).status_code == 202
    srv.stop()  # judging is held: the accepted batches are saved as pending work
    srv2 = run_server(app())
    assert wait_until(lambda: estimates(srv2.url)["total_judged"] == 32)
    assert estimates(srv2.url)["windows"]["5m"]["fails_by_family"]["idi"] > 0  # metadata kept too


def test_sigterm_under_load_loses_no_accepted_request(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path
) -> None:
    config = mnist_config(
        mnist_bundle_dir, state=tmp_path / "state", server={"threads": 4}, windows={"time": ["5m"], "count": 1000000}
    )
    with AgentProcess(tmp_path, config) as agent:
        url = agent.url
        ok = [0] * 4
        failures: list[str] = []
        stop = threading.Event()
        body = infer_body(mnist_splits.test.x[:4])

        def client(k: int) -> None:
            with httpx.Client(timeout=30) as c:
                while not stop.is_set():
                    try:
                        r = c.post(f"{url}/v2/models/mnist/infer", json=body)
                    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
                        # refused or closed before the request was accepted: the server is gone
                        return
                    if r.status_code == 200:
                        ok[k] += 1
                    else:
                        failures.append(f"{r.status_code} {r.text}")

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        assert wait_until(lambda: sum(ok) >= 40, 30)
        code = agent.terminate()
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert code == 0, agent.log()[-3000:]
        assert not failures
        assert "state flushed" in agent.log()
    accepted = sum(ok) * 4
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, tmp_path / "state"), CollectorRegistry()))
    assert estimates(srv.url)["total_judged"] == accepted


def test_reload_under_load_has_no_failed_request(
    run_server: Callable[..., RunningServer],
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ICOS_AGENT_ADMIN_TOKEN", "s3cret-token")
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, None), CollectorRegistry()))
    url = srv.url
    body = infer_body(mnist_splits.test.x[:8])
    versions: set[str] = set()
    failures: list[str] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                r = c.post(f"{url}/v2/models/mnist/infer", json=body)
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text}")
                else:
                    versions.add(r.json()["model_version"])

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        auth = {"Authorization": "Bearer s3cret-token"}
        for i in range(2, 6):
            r = httpx.post(f"{url}/v1/reload", json={"version": str(i)}, headers=auth, timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["model"]["version"] == str(i)
            # the clients are answered by the new version before the next reload
            assert wait_until(lambda i=i: str(i) in versions, 10)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not failures
    assert {"1", "5"} <= versions
    meta = httpx.get(f"{url}/v2/models/mnist").json()
    assert meta["versions"] == ["5"]
    # same model and bundle: the windows keep their predictions
    assert estimates(url)["total_judged"] > 0
    # a failing reload keeps the old model
    r = httpx.post(f"{url}/v1/reload", json={"bundle_path": "/nonexistent"}, headers=auth)
    assert r.status_code == 400 and "still serving" in r.json()["error"]
    assert httpx.post(f"{url}/v2/models/mnist/infer", json=body).status_code == 200


def test_admin_authentication(
    run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ICOS_AGENT_ADMIN_TOKEN", raising=False)
    srv = run_server(create_app(stateful_settings(mnist_bundle_dir, None), CollectorRegistry()))
    r = httpx.post(f"{srv.url}/v1/reload")
    assert r.status_code == 404 and "ICOS_AGENT_ADMIN_TOKEN" in r.json()["error"]
    monkeypatch.setenv("ICOS_AGENT_ADMIN_TOKEN", "tok")
    srv2 = run_server(create_app(stateful_settings(mnist_bundle_dir, None), CollectorRegistry()))
    assert httpx.post(f"{srv2.url}/v1/reload").status_code == 401
    assert httpx.post(f"{srv2.url}/v1/reload", headers={"Authorization": "Bearer nope"}).status_code == 403
    assert httpx.post(f"{srv2.url}/v1/reload", headers={"Authorization": "Basic dG9r"}).status_code == 401
    r = httpx.post(f"{srv2.url}/v1/reload", headers={"Authorization": "Bearer tok"}, timeout=60)
    assert r.status_code == 200 and r.json()["reloaded"] is True


def test_serve_path_does_not_import_mlflow(mnist_bundle_dir: Path) -> None:
    code = (
        "import sys\n"
        "from agent.cli import build_parser\n"
        "from agent.server.app import create_app\n"
        "from agent.config.settings import load_settings\n"
        f"s = load_settings(None, model={{'path': {str(default_model_path())!r}}},"
        f" bundle={{'path': {str(mnist_bundle_dir)!r}}})\n"
        "create_app(s)\n"
        "print(sorted(m for m in ('mlflow', 'torch', 'matplotlib') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=clean_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
