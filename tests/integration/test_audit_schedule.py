"""Audits inside a running agent: a scheduled D-Score fires on its interval and its gauges reach
``/metrics``; ``POST /v1/audits/{kind}`` needs the admin token; label-free audits read the reservoir
of live inputs fed by real V2 inference requests."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from agent.config.settings import load_settings
from agent.data.datasets import Splits
from agent.errors import UserError
from agent.model.classifier import default_model_path
from agent.server.app import create_app
from tests.support.inprocess import RunningServer
from tests.support.metrics import metric, scrape
from tests.support.waiting import wait_until

TOKEN = "s3cret-audit-token"


def _write_config(tmp_path: Path, bundle: Path, audits: dict[str, Any]) -> Path:
    cfg = {
        "mode": "serve",
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(bundle)},
        "audits": audits,
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def reference(tmp_path: Path, mnist_splits: Splits) -> Path:
    path = tmp_path / "reference.npz"
    np.savez(path, x=mnist_splits.test.x[:120], y=mnist_splits.test.y[:120])
    return path


def test_scheduled_dscore_fires_and_exports_gauges(
    tmp_path: Path,
    mnist_bundle_dir: Path,
    reference: Path,
    run_server: Callable[..., RunningServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ICOS_AGENT_ADMIN_TOKEN", TOKEN)
    config = _write_config(
        tmp_path,
        mnist_bundle_dir,
        {
            "first_run_delay": "0s",
            "reference": {"path": reference.name},  # relative to the config file
            "dscore": {"interval": "1s", "time_budget": "2m", "n": 2, "t": 5},
        },
    )
    settings = load_settings(config)
    srv = run_server(create_app(settings))
    before = scrape(srv.url)
    for name in ("icos_dscore", "icos_dscore_baseline"):  # absent before the first run, never NaN
        assert before.find(name) is None, name

    def runs() -> float:
        return metric(srv.url, "icos_audit_runs_total", audit="dscore", status="success")

    assert wait_until(lambda: runs() >= 2, timeout=60, interval=0.2), "the interval job did not fire twice"
    m = scrape(srv.url)
    for name in ("icos_dscore", "icos_dscore_robustness", "icos_dscore_fitness"):
        value = m.find(name)
        assert value is not None and np.isfinite(value), name
    # the baseline is the first run's D-Score (same model, same reference data: the later runs give it again)
    baseline = m.find("icos_dscore_baseline")
    assert baseline is not None and baseline == pytest.approx(m.find("icos_dscore"), abs=1e-9)
    assert m.find("icos_audit_last_success_timestamp_seconds", audit="dscore")
    assert m.find("icos_audit_duration_seconds", audit="dscore") is not None
    assert m.find("icos_audit_runs_total", audit="dscore", status="failure") == 0.0

    listing = httpx.get(f"{srv.url}/v1/audits").json()
    dscore = listing["audits"]["dscore"]
    assert dscore["scheduled"] and dscore["schedule"]["interval"] == "1s"
    last = dscore["last"]
    assert last["status"] == "success" and last["trigger"] == "schedule"
    assert last["n_samples"] == 120 and last["data_source"].endswith("reference.npz")
    assert len(last["result"]["details"]["variant_accuracies"]) == 4
    assert listing["audits"]["mutation"]["scheduled"] is False

    # POST needs the admin token: missing header 401, wrong token 403.
    assert httpx.post(f"{srv.url}/v1/audits/dscore").status_code == 401
    bad = httpx.post(f"{srv.url}/v1/audits/dscore", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 403 and "error" in bad.json()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(f"{srv.url}/v1/audits/nosuch", headers=auth).status_code == 404

    def manual() -> httpx.Response:
        return httpx.post(f"{srv.url}/v1/audits/dscore?wait=true", headers=auth, timeout=60)

    for _ in range(100):  # 409 while the interval job runs (one instance at a time): ask again
        resp = manual()
        if resp.status_code != 409:
            break
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] == "success" and body["trigger"] == "manual"
    assert "icos_audit_runs_total" in httpx.get(f"{srv.url}/metrics").text


def test_admin_disabled_without_token_and_time_budget(
    tmp_path: Path,
    mnist_bundle_dir: Path,
    reference: Path,
    run_server: Callable[..., RunningServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ICOS_AGENT_ADMIN_TOKEN", raising=False)
    audits = {
        "reference": {"path": str(reference)},
        "mutation": {"cron": "0 0 1 1 *", "time_budget": "1ms", "k": 50, "repetitions": 50},
        "baselines": {"dscore": 0.42},
    }
    settings = load_settings(_write_config(tmp_path, mnist_bundle_dir, audits))
    app = create_app(settings)
    srv = run_server(app)
    resp = httpx.post(f"{srv.url}/v1/audits/dscore", headers={"Authorization": "Bearer x"})
    assert resp.status_code == 404
    assert httpx.get(f"{srv.url}/v1/audits").json()["audits"]["dscore"]["last"] is None

    # The time budget is checked between steps: past it the run ends with status "timeout".
    outcome = app.state.audits.run_once("mutation", "manual")
    assert outcome.status == "timeout" and "time budget" in outcome.error
    m = scrape(srv.url)
    assert m.find("icos_audit_runs_total", audit="mutation", status="timeout") == 1.0
    assert m.find("icos_audit_last_success_timestamp_seconds", audit="mutation") is None
    # a configured D-Score baseline is exported from the start; the D-Score itself only after an audit
    assert m.find("icos_dscore_baseline") == 0.42 and m.find("icos_dscore") is None


def test_label_free_audits_on_live_inputs(
    tmp_path: Path,
    mnist_bundle_dir: Path,
    mnist_splits: Splits,
    run_server: Callable[..., RunningServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ICOS_AGENT_ADMIN_TOKEN", TOKEN)
    settings = load_settings(
        _write_config(
            tmp_path,
            mnist_bundle_dir,
            {
                "reservoir": {"size": 64},
                "reference": {"source": "live", "min_samples": 40},
                "mutation": {"cron": "0 0 1 1 *", "k": 300, "repetitions": 2, "operators": ["SGN", "DIG"]},
                "metamorphic": {"cron": "0 0 1 1 *", "transformations": ["shift", {"name": "blur", "sigma": 0.7}]},
            },
        )
    )
    srv = run_server(create_app(settings))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    early = httpx.post(f"{srv.url}/v1/audits/metamorphic?wait=true", headers=auth, timeout=60).json()
    assert early["status"] == "skipped" and "0 live inputs" in early["error"]

    x = mnist_splits.test.x[:100]
    for start in range(0, 100, 20):
        batch = x[start : start + 20]
        body = {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": list(batch.shape), "data": batch.ravel().tolist()}
            ]
        }
        r = httpx.post(f"{srv.url}/v2/models/mnist/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text

    meta = httpx.post(f"{srv.url}/v1/audits/metamorphic?wait=true", headers=auth, timeout=120).json()
    assert meta["status"] == "success", meta
    assert meta["data_source"] == "live (64 inputs)" and meta["n_samples"] == 64
    relations = [r["relation"] for r in meta["result"]["details"]["relations"]]
    assert relations == ["shift", "blur"]

    accepted = httpx.post(f"{srv.url}/v1/audits/mutation", headers=auth)
    assert accepted.status_code == 202
    run_id = accepted.json()["id"]

    def finished() -> bool:
        last = httpx.get(f"{srv.url}/v1/audits").json()["audits"]["mutation"]["last"]
        return last is not None and last["id"] == run_id

    assert wait_until(finished, timeout=60, interval=0.1)
    listing = httpx.get(f"{srv.url}/v1/audits").json()
    assert listing["audits"]["mutation"]["last"]["status"] == "success"
    assert listing["reservoir"]["capacity"] == 64 and listing["reservoir"]["seen"] == 100

    m = scrape(srv.url)
    assert m.find("icos_metamorphic_violation_ratio", relation="shift") is not None
    assert m.find("icos_metamorphic_violation_ratio", relation="all") is not None
    sgn = m.find("icos_mutation_relative_change_ratio", audit="mutation", metric="mae", operator="sgn")
    assert sgn is not None and np.isfinite(sgn)
    assert m.find("icos_audit_runs_total", audit="metamorphic", status="skipped") == 1.0


@pytest.mark.parametrize(
    ("audits", "message"),
    [
        ({"dscore": {"interval": "1h", "cron": "0 * * * *"}}, "exactly one of cron and interval"),
        ({"dscore": {"n": 3}}, "exactly one of cron and interval"),
        ({"mutation": {"cron": "61 * * * *"}}, "audits.mutation.cron"),
        ({"metamorphic": {"interval": "soon"}}, "not a duration"),
        ({"mutation": {"interval": "1h", "operators": ["XYZ"]}}, "unknown operator"),
        ({"dscore": {"interval": "1h", "data": {"source": "reference"}}}, "path is required"),
    ],
)
def test_audit_config_is_validated_at_load(
    tmp_path: Path, mnist_bundle_dir: Path, audits: dict[str, Any], message: str
) -> None:
    with pytest.raises(UserError, match=re.escape(message)):
        load_settings(_write_config(tmp_path, mnist_bundle_dir, audits))


def test_credentials_in_the_tracking_uri_never_leave_the_agent(
    tmp_path: Path,
    mnist_bundle_dir: Path,
    reference: Path,
    run_server: Callable[..., RunningServer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``GET /v1/audits`` is unauthenticated: it shows where runs go, never the password in the URI."""
    monkeypatch.setenv("ICOS_AGENT_ADMIN_TOKEN", TOKEN)
    secret = "pa55w0rd-in-uri"
    config = _write_config(
        tmp_path,
        mnist_bundle_dir,
        {
            "reference": {"path": reference.name},
            # a closed loopback port: MLflow is "down", the run is spooled, the URI is still shown
            "mlflow": {"tracking_uri": f"http://icos:{secret}@127.0.0.1:9/"},
            "dscore": {"interval": "24h", "n": 2, "t": 5},
        },
    )
    settings = load_settings(config)
    settings.state_dir = tmp_path / "state"
    srv = run_server(create_app(settings))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    resp = httpx.post(f"{srv.url}/v1/audits/dscore?wait=true", headers=auth, timeout=120)
    assert resp.status_code == 200, resp.text
    assert secret not in resp.text

    def done() -> bool:
        last = httpx.get(f"{srv.url}/v1/audits").json()["audits"]["dscore"]["last"]
        return last is not None

    assert wait_until(done, timeout=90, interval=0.3)
    body = httpx.get(f"{srv.url}/v1/audits").text
    assert secret not in body
    assert "http://***@127.0.0.1:9/" in body
    assert secret not in caplog.text
