"""End to end: a real Prometheus server on 127.0.0.1 scrapes a running ``icos-agent serve`` with the
shipped rules loaded, as a new user with one agent and no fleet evaluator runs it. Drifted traffic (noisy
digits) must show up, read through Prometheus's HTTP API, as the counters' recording rules, as a recorded
headline equal to the agent's own (``GET /v1/estimates``) and as a firing alert: IcosEstimatedAccuracyLow
where the model's accuracy on its calibration split lies above the headline's interval, or
IcosEstimateMayBeWrong where the agent flags the headline (its interval widened). No series on ``/metrics``
holds NaN or an infinity, before or after the traffic.

The recording group is the shipped one verbatim; the alert group is generated from the same source
with ``for: 0s`` (waiting 15 minutes is no test), so the expressions are the shipped ones."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from agent.data.datasets import Splits
from agent.model.classifier import OnnxClassifier, default_model_path
from tests.support.agents import Agents
from tests.support.ports import free_port
from tests.support.waiting import wait_http_ready

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.needs("prometheus")


def _generator() -> Any:
    sys.path.insert(0, str(ROOT / "deploy" / "alerts"))
    try:
        import generate  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    return generate


def _stop(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.stderr.read().decode(errors="replace")[-3000:] if proc.stderr else ""


@pytest.fixture
def agent(agents: Agents, mnist_bundle_dir: Path, tmp_path: Path) -> tuple[str, int]:
    metrics_port = free_port()
    cfg = {
        "mode": "serve",
        "model": {"name": "mnist", "version": "1", "path": str(default_model_path())},
        "bundle": {"path": str(mnist_bundle_dir)},
        "server": {"metrics_port": metrics_port, "threads": 2},
        "windows": {"time": ["5m", "1h"], "count": 1000},
        "state_dir": str(tmp_path / "state"),
    }
    return agents.process(cfg).url, metrics_port


@pytest.fixture
def prometheus(agent: tuple[str, int], tmp_path: Path) -> Iterator[str]:
    gen = _generator()
    src = gen.load_source()
    shipped = yaml.safe_load((ROOT / "deploy" / "prometheus" / "icos-agent.rules.yml").read_text(encoding="utf-8"))
    quick = gen.prometheus_groups(src, overrides={r["key"]: {"for": "0s"} for r in src["alerts"]["rules"]})
    assert quick["groups"][0] == shipped["groups"][0]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(quick, sort_keys=False), encoding="utf-8")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [
            {
                "job_name": "icos-agent",
                "static_configs": [{"targets": [f"127.0.0.1:{agent[1]}"], "labels": {"namespace": "e2e"}}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    assert PROMETHEUS is not None
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(f"{url}/-/ready", timeout=30)
        yield url
    finally:
        log = _stop(proc)
        if "level=error" in log:
            print(log)


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=5)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def _poll(fn: Any, timeout: float = 45.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.5)
    return last


def _no_non_finite(metrics_text: str) -> None:
    for line in metrics_text.splitlines():
        if line and not line.startswith("#"):
            value = line.rsplit(" ", 1)[1].lower()
            assert value not in ("nan", "+inf", "-inf", "inf"), line


def _firing(prom: str, name: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{prom}/api/v1/alerts", timeout=5)
    r.raise_for_status()
    return [a for a in r.json()["data"]["alerts"] if a["labels"]["alertname"] == name and a["state"] == "firing"]


def test_one_agent_headline_counters_and_alert_through_prometheus(
    agent: tuple[str, int], prometheus: str, mnist_splits: Splits, mnist_model: OnnxClassifier
) -> None:
    url, metrics_port = agent
    # Nothing audited, nothing judged yet: no NaN (an audit's gauges are absent, not NaN).
    _no_non_finite(httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text)
    # Counters must be scraped at zero before the traffic, or rate() has no increase to see.
    up = _poll(lambda: [s for s in _query(prometheus, 'up{job="icos-agent"}') if s["value"][1] == "1"])
    assert up, "Prometheus never scraped the agent"
    rng = np.random.default_rng(0)
    x, y = mnist_splits.test.x[:600].astype(np.float32), mnist_splits.test.y[:600]
    # Gaussian pixel noise of 35 % of the pixel range: the CNN's accuracy falls to about 0.8
    drifted = np.clip(x + rng.normal(0, 0.35 * 255, x.shape), 0, 255).astype(np.float32)
    truth = float(np.mean(mnist_model.predict_proba(drifted).argmax(1) == y))
    sent = 0
    with httpx.Client(timeout=30) as client:
        for batch in np.array_split(drifted, 12):
            body = {
                "inputs": [
                    {"name": "input", "shape": list(batch.shape), "datatype": "FP32", "data": batch.ravel().tolist()}
                ]
            }
            r = client.post(f"{url}/v2/models/mnist/infer", json=body)
            assert r.status_code == 200, r.text
            sent += len(batch)

    def judged() -> list[dict[str, Any]]:
        return [s for s in _query(prometheus, "sum(icos_predictions_total)") if float(s["value"][1]) >= sent]

    assert _poll(judged), "the agent's counters never reached Prometheus"
    own = httpx.get(f"{url}/v1/estimates", timeout=10).json()
    assert own["windows"]["5m"]["n"] == own["windows"]["1h"]["n"] == sent
    _no_non_finite(httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text)

    # Counters: the fleet fail share of the recording rules is the agent's own share of failed predictions.
    share = own["windows"]["5m"]["fails"] / sent

    def fail_ratio() -> list[dict[str, Any]]:
        res = _query(prometheus, 'icos:oracle_fail:ratio_rate5m{model="mnist"}')
        return [s for s in res if abs(float(s["value"][1]) - share) <= 0.02]

    res = _poll(fail_ratio)
    assert res, (share, _query(prometheus, "icos:oracle_fail:ratio_rate5m"))
    assert res[0]["metric"] == {
        "__name__": "icos:oracle_fail:ratio_rate5m",
        "namespace": "e2e",
        "model": "mnist",
        "version": "1",
    }
    by_family = {fam: n for fam, n in own["windows"]["5m"]["fails_by_family"].items() if n}
    rates = _poll(lambda: _query(prometheus, 'icos:verdicts:rate5m{verdict="fail"} > 0'))
    assert {s["metric"]["invariant"] for s in rates} == set(by_family), (rates, by_family)

    # The recorded headline is the agent's own, named by its estimator, not the counters' corrected estimate.
    for window in ("5m", "1h"):
        mine = own["windows"][window]["headline"]

        def recorded(window: str = window, mine: dict[str, Any] = mine) -> list[dict[str, Any]]:
            res = _query(prometheus, f'icos:headline_accuracy:ratio{window}{{model="mnist"}}')
            return [s for s in res if abs(float(s["value"][1]) - mine["value"]) <= 0.02]

        rec = _poll(recorded)
        assert rec, (window, mine, _query(prometheus, f"icos:headline_accuracy:ratio{window}"))
        assert rec[0]["metric"] == {
            "__name__": f"icos:headline_accuracy:ratio{window}",
            "namespace": "e2e",
            "model": "mnist",
            "version": "1",
            "estimator": mine["estimator"],
            "source": "agents",
        }
        for bound in ("lower", "upper"):
            # a bound's rule may be evaluated a scrape before the headline's: wait for the agent's value
            def bound_recorded(b: str = bound, w: str = window, want: float = mine[bound]) -> list[dict[str, Any]]:
                res = _query(prometheus, f"icos:headline_accuracy:ratio{w}_{b}")
                return [s for s in res if abs(float(s["value"][1]) - want) <= 0.02]

            got = _poll(bound_recorded)
            assert got, (window, bound, mine, _query(prometheus, f"icos:headline_accuracy:ratio{window}_{bound}"))
    assert own["windows"]["1h"]["headline"]["estimator"] == own["headline"] == "shift_aware"
    corrected = own["windows"]["1h"]["estimates"]["icos_corrected"]["value"]
    print(f"headline {own['windows']['1h']['headline']} icos_corrected {corrected:.3f} truth {truth:.3f}")

    # The model scored far higher on its calibration split. Where the agent's flag is down, the reference lies
    # above the headline's interval by more than the margin and IcosEstimatedAccuracyLow fires; where the flag
    # says the number may be wrong, its interval is widened (the relative alert stays silent where the widened
    # interval reaches the reference) and IcosEstimateMayBeWrong fires, naming the flag's main reason. Either
    # way the drop alerts.
    reference = _poll(lambda: _query(prometheus, 'icos:reference_accuracy:ratio{model="mnist"}'))
    head = own["windows"]["1h"]["headline"]
    flag = own["windows"]["1h"]["flag"]
    assert reference and float(reference[0]["value"][1]) > head["value"] + 0.05, (reference, head)
    if not flag["raised"]:
        assert float(reference[0]["value"][1]) > head["upper"], (reference, head)
        alerts = _poll(lambda: _firing(prometheus, "IcosEstimatedAccuracyLow"))
        assert alerts, httpx.get(f"{prometheus}/api/v1/rules", timeout=5).text[:3000]
        labels = alerts[0]["labels"]
        assert labels["estimator"] == "shift_aware" and labels["source"] == "agents"
    else:
        assert "own_interval" in head and head["may_be_wrong"], head
        alerts = _poll(
            lambda: [a for a in _firing(prometheus, "IcosEstimateMayBeWrong") if a["labels"]["window"] == "1h"]
        )
        assert alerts, httpx.get(f"{prometheus}/api/v1/rules", timeout=5).text[:3000]
        labels = alerts[0]["labels"]
        assert labels["reason"] == flag["reasons"][0], (labels, flag)
        if float(reference[0]["value"][1]) <= head["upper"]:  # the widened interval reaches the reference
            assert not _firing(prometheus, "IcosEstimatedAccuracyLow")
    assert labels["model"] == "mnist" and labels["severity"] == "warning"
