"""The fleet evaluator against real parts: three ``icos-agent serve`` replicas scraped every second by a
real Prometheus, ``icos-agent serve`` in ``mode: fleet`` reading Prometheus's HTTP API, and a reference
agent (not scraped) that receives every request the replicas receive.

The fleet's headline must equal the reference's (|Δ| ≤ 0.01) across a replica restart in the middle
of the window (its counters reset), and the last estimates must stay, marked stale, while Prometheus
is down."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.prometheus import PrometheusServer, scrape_every_second
from tests.support.v2 import infer_body
from tests.support.waiting import poll

pytestmark = pytest.mark.needs("prometheus")
WINDOWS = ["5m", "15m"]
HEADLINE = "shift_aware"


@pytest.fixture
def fleet_parts(mnist_bundle_dir: Path, tmp_path: Path) -> Iterator[dict[str, Any]]:
    def agent_config(name: str) -> dict[str, Any]:
        return {
            "mode": "serve",
            "model": {"name": "mnist", "version": "1", "path": str(default_model_path())},
            "bundle": {"path": str(mnist_bundle_dir)},
            "server": {"threads": 2},
            "windows": {"time": WINDOWS, "count": 10_000},
            "state_dir": str(tmp_path / f"state-{name}"),
            "labels": {"enabled": False},
        }

    started: list[AgentProcess] = []
    prom: PrometheusServer | None = None
    try:
        replicas = [AgentProcess(tmp_path, agent_config(f"r{i}")).start() for i in range(3)]
        started.extend(replicas)
        reference = AgentProcess(tmp_path, agent_config("reference")).start()
        started.append(reference)
        prom = PrometheusServer(tmp_path, scrape_every_second([f"127.0.0.1:{r.port}" for r in replicas])).start()
        fleet_cfg = {
            "mode": "fleet",
            "model": {"name": "mnist", "version": "1"},
            "bundle": {"path": str(mnist_bundle_dir)},
            "windows": {"time": WINDOWS},
            "fleet": {
                "prometheus_url": prom.url,
                "refresh_seconds": 1,
                "query_timeout_seconds": 2,
                "lookback_seconds": 60,
                "stale_after_seconds": 4,
                "selector": 'job="icos-agent"',
            },
        }
        fleet = AgentProcess(tmp_path, fleet_cfg)
        started.append(fleet)
        fleet.start()
        yield {"replicas": replicas, "reference": reference, "fleet": fleet, "prometheus": prom}
    finally:
        for p in started:
            p.kill()
        if prom is not None:
            prom.stop()


def _send(client: httpx.Client, url: str, x: np.ndarray) -> None:
    r = client.post(f"{url}/v2/models/mnist/infer", json=infer_body(x))
    assert r.status_code == 200, r.text


def _judged(prom: PrometheusServer, instance: str | None = None) -> float:
    sel = f'stat="n",instance="{instance}"' if instance else 'stat="n"'
    res = prom.query(f"sum(icos_window_stat_total{{{sel}}})")
    return float(res[0]["value"][1]) if res else 0.0


def test_fleet_headline_equals_one_agent_across_a_restart_and_survives_prometheus_down(
    fleet_parts: dict[str, Any], mnist_splits: Splits
) -> None:
    replicas: list[AgentProcess] = fleet_parts["replicas"]
    reference: AgentProcess = fleet_parts["reference"]
    fleet: AgentProcess = fleet_parts["fleet"]
    prom: PrometheusServer = fleet_parts["prometheus"]
    poll(lambda: len(prom.query('up{job="icos-agent"} == 1')) == 3, what="three replicas scraped")
    # drifted traffic (darker, noisy digits) so that the estimators disagree and the headline matters
    rng = np.random.default_rng(0)
    x = mnist_splits.test.x[:600].astype(np.float32)
    x = np.clip(x * 0.6 + rng.normal(0, 0.15, x.shape), 0, 1).astype(np.float32)
    batches = np.array_split(x, 30)
    with httpx.Client(timeout=30) as client:
        for i, b in enumerate(batches[:15]):
            _send(client, replicas[i % 3].url, b)
            _send(client, reference.url, b)
        sent = sum(len(b) for b in batches[:15])
        poll(lambda: _judged(prom) >= sent, what="first half scraped")
        # restart replica 1 mid-window: its counters start again from zero on the same instance
        restarted = replicas[1]
        assert restarted.terminate() == 0
        restarted.start()
        inst = f"127.0.0.1:{restarted.port}"
        poll(lambda: prom.query(f'icos_window_stat_total{{stat="n",instance="{inst}"}} == 0'), what="reset seen")
        for i, b in enumerate(batches[15:]):
            _send(client, replicas[i % 3].url, b)
            _send(client, reference.url, b)
    total = len(x)

    def fleet_caught_up() -> dict[str, Any] | None:
        body: dict[str, Any] = httpx.get(f"{fleet.url}/v1/estimates", timeout=5).json()
        w = body["windows"].get("5m")
        return body if w and w["n"] == total and body["windows"].get("15m", {}).get("n") == total else None

    body = poll(fleet_caught_up, what="fleet estimates of all traffic")
    ref = poll(
        lambda: (
            (r := httpx.get(f"{reference.url}/v1/estimates", timeout=5).json())["windows"]["5m"]["n"] == total and r
        ),
        what="reference judged everything",
    )
    assert body["headline"] == ref["headline"] == HEADLINE
    for window in WINDOWS:
        mine, theirs = body["windows"][window]["estimates"], ref["windows"][window]["estimates"]
        assert set(mine) == set(theirs) and HEADLINE in mine
        for est in mine:
            for key in ("value", "lower", "upper"):
                assert abs(mine[est][key] - theirs[est][key]) <= 0.01, (window, est, key, mine[est], theirs[est])
            assert mine[est]["n"] == theirs[est]["n"] == total
    delta = abs(
        body["windows"]["5m"]["estimates"][HEADLINE]["value"] - ref["windows"]["5m"]["estimates"][HEADLINE]["value"]
    )
    print(f"fleet vs reference headline |delta| = {delta:.6f}")
    assert body["windows"]["5m"]["replicas"] == 3
    m = fleet.metrics()
    key = f"icos_fleet_estimated_accuracy_ratio{{estimator={HEADLINE},model=mnist,version=1,window=5m}}"
    assert m[key] == pytest.approx(body["windows"]["5m"]["estimates"][HEADLINE]["value"])
    assert m["icos_fleet_restarted_replicas{model=mnist}"] >= 1
    assert m["icos_fleet_stale{model=mnist}"] == 0
    assert m["icos_fleet_last_success_timestamp_seconds{model=mnist}"] > time.time() - 30

    # Prometheus down: the last estimates stay, marked stale, and the errors are counted
    prom.stop()
    stale = poll(
        lambda: (b := httpx.get(f"{fleet.url}/v1/estimates", timeout=5).json())["fleet"]["stale"] and b,
        what="stale estimates",
    )
    assert stale["windows"]["5m"]["estimates"][HEADLINE] == body["windows"]["5m"]["estimates"][HEADLINE]
    assert stale["fleet"]["last_error"]
    m = fleet.metrics()
    assert m["icos_fleet_stale{model=mnist}"] == 1 and m["icos_fleet_query_errors_total{model=mnist}"] >= 1
    assert m[key] == pytest.approx(body["windows"]["5m"]["estimates"][HEADLINE]["value"])
