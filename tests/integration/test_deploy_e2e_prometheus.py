"""End to end: a real Prometheus server on 127.0.0.1 scrapes a running ``icos-agent serve`` with the
shipped rules loaded; traffic the oracle fails (IDI: ``form=lines`` allows only 1, 4 and 7) must show
up as the fleet recording rules' values and a firing IcosEstimatedAccuracyLow alert, read through
Prometheus's HTTP API.

The recording group is the shipped one verbatim; the alert group is generated from the same source
with ``for: 0s`` (waiting 15 minutes is no test), so the expressions are the shipped ones."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.ports import free_port
from tests.support.prometheus import PrometheusServer, scrape_every_second
from tests.support.settings import mnist_config
from tests.support.v2 import infer_body
from tests.support.waiting import poll

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.needs("prometheus")


def _generator() -> Any:
    sys.path.insert(0, str(ROOT / "deploy" / "alerts"))
    try:
        import generate  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    return generate


@pytest.fixture
def agent(mnist_bundle_dir: Path, tmp_path: Path) -> Iterator[AgentProcess]:
    """The agent as a process, its metrics on a port of their own."""
    config = mnist_config(
        mnist_bundle_dir,
        model={"name": "mnist", "version": "1", "path": str(default_model_path())},
        state=tmp_path / "state",
        server={"metrics_port": free_port(), "threads": 2},
        windows={"time": ["5m"], "count": 1000},
    )
    with AgentProcess(tmp_path, config) as agent:
        yield agent


@pytest.fixture
def prometheus(agent: AgentProcess, tmp_path: Path) -> Iterator[PrometheusServer]:
    gen = _generator()
    src = gen.load_source()
    shipped = yaml.safe_load((ROOT / "deploy" / "prometheus" / "icos-agent.rules.yml").read_text(encoding="utf-8"))
    quick = gen.prometheus_groups(src, overrides={r["key"]: {"for": "0s"} for r in src["alerts"]["rules"]})
    assert quick["groups"][0] == shipped["groups"][0]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(quick, sort_keys=False), encoding="utf-8")
    metrics_port = yaml.safe_load(agent.config_path.read_text())["server"]["metrics_port"]
    config = scrape_every_second(
        [f"127.0.0.1:{metrics_port}"], labels={"namespace": "e2e"}, rule_files=[str(tmp_path / "rules.yml")]
    )
    prom = PrometheusServer(tmp_path, config).start()
    try:
        yield prom
    finally:
        log = prom.stop()
        if "level=error" in log:
            print(log)


def test_recording_rules_and_alert_through_prometheus(
    agent: AgentProcess, prometheus: PrometheusServer, mnist_splits: Splits
) -> None:
    url = agent.url
    # Counters must be scraped at zero before the traffic, or rate() has no increase to see.
    poll(
        lambda: [s for s in prometheus.query('up{job="icos-agent"}') if s["value"][1] == "1"],
        45,
        what="Prometheus to scrape the agent",
    )
    x, y = mnist_splits.test.x, mnist_splits.test.y
    forbidden = x[~np.isin(y, [1, 4, 7])][:480].astype(np.float32)
    sent = 0
    with httpx.Client(timeout=30) as client:
        for batch in np.array_split(forbidden, 12):
            r = client.post(f"{url}/v2/models/mnist/infer", json=infer_body(batch, form="lines"))
            assert r.status_code == 200, r.text
            sent += len(batch)

    def judged() -> list[dict[str, Any]]:
        return [s for s in prometheus.query("sum(icos_predictions_total)") if float(s["value"][1]) >= sent]

    poll(judged, 45, what="the agent's counters in Prometheus")

    # Recording rules: every judged prediction failed (IDI), so the fleet fail share is 1 and icos is 0.
    def fail_ratio() -> list[dict[str, Any]]:
        res = prometheus.query('icos:oracle_fail:ratio_rate5m{model="mnist"}')
        return [s for s in res if float(s["value"][1]) > 0.99]

    res = poll(
        fail_ratio, 45, what="a fail ratio of 1", explain=lambda: prometheus.query("icos:oracle_fail:ratio_rate5m")
    )
    assert res[0]["metric"] == {
        "__name__": "icos:oracle_fail:ratio_rate5m",
        "namespace": "e2e",
        "model": "mnist",
        "version": "1",
    }
    icos_rule = 'icos:estimated_accuracy:ratio_rate5m{estimator="icos",model="mnist"}'
    icos = poll(lambda: prometheus.query(icos_rule), 45, what=icos_rule)
    assert float(icos[0]["value"][1]) < 0.01
    idi_rule = 'icos:verdicts:rate5m{verdict="fail",invariant="idi"} > 0'
    poll(lambda: prometheus.query(idi_rule), 45, what="IDI failures in icos:verdicts:rate5m")

    # The corrected estimate (from the exported calibration TPR/FPR) is clamped to 0 and the alert fires.
    def firing() -> list[dict[str, Any]]:
        return [
            a
            for a in prometheus.get("alerts")["alerts"]
            if a["labels"]["alertname"] == "IcosEstimatedAccuracyLow" and a["state"] == "firing"
        ]

    alerts = poll(
        firing, 45, what="IcosEstimatedAccuracyLow firing", explain=lambda: str(prometheus.get("rules"))[:3000]
    )
    labels = alerts[0]["labels"]
    assert labels["model"] == "mnist" and labels["severity"] == "warning" and labels["estimator"] == "icos_corrected"
    assert "0%" in alerts[0]["annotations"]["description"]
