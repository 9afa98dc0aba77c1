"""The fleet's comparison of a champion with its challenger against real parts: two ``icos-agent serve``
replicas, each running the challenger beside the shipped CNN, scraped every second by a real Prometheus (with
the shipped rules loaded), and ``icos-agent serve`` in ``mode: fleet`` reading Prometheus's HTTP API. The
fleet's paired window must hold every replica's paired predictions, its disagreements the count computed
offline with both models, and its difference the one estimated from the replicas' summed pair sums."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.data.datasets import Splits
from agent.estimation.pairs.calibration import pair_of_bundle
from agent.estimation.pairs.paired import PairSums, label_free
from agent.model.classifier import OnnxClassifier, default_model_path
from invariants.bundle import Bundle
from tests.support.agent_process import AgentProcess
from tests.support.challenger import CHALLENGER_MODEL, drifted
from tests.support.metrics import scrape
from tests.support.ports import free_port
from tests.support.prometheus import PrometheusServer, sample_since, scrape_every_second
from tests.support.waiting import poll

ROOT = Path(__file__).resolve().parents[2]
WINDOWS = ["5m", "15m"]


@pytest.fixture
def fleet(mnist_bundle_dir: Path, challenger_bundle_dir: Path, tmp_path: Path) -> Iterator[dict[str, Any]]:
    challenger = {"bundle_path": str(challenger_bundle_dir), "version": "drift"}

    def replica(name: str) -> dict[str, Any]:
        return {
            "mode": "serve",
            "model": {"name": "mnist", "version": "1", "path": str(default_model_path())},
            "bundle": {"path": str(mnist_bundle_dir)},
            "windows": {"time": WINDOWS, "count": 10_000},
            "state_dir": str(tmp_path / f"state-{name}"),
            "labels": {"enabled": False},
            "challenger": {**challenger, "model_path": str(CHALLENGER_MODEL)},
        }

    started: list[AgentProcess] = []
    prom: PrometheusServer | None = None
    try:
        replicas = [AgentProcess(tmp_path, replica(f"r{i}")).start() for i in range(2)]
        started += replicas
        port = free_port()
        evaluator = AgentProcess(
            tmp_path,
            {
                "mode": "fleet",
                "model": {"name": "mnist", "version": "1"},
                "bundle": {"path": str(mnist_bundle_dir)},
                "windows": {"time": WINDOWS},
                "challenger": challenger,
                "fleet": {
                    "prometheus_url": f"http://127.0.0.1:{port}",
                    "refresh_seconds": 1,
                    "lookback_seconds": 60,
                    "selector": 'job="icos-agent"',
                },
            },
        )
        rules = [str(ROOT / "deploy" / "prometheus" / "icos-agent.rules.yml")]
        config = scrape_every_second([f"127.0.0.1:{r.port}" for r in replicas], rule_files=rules)
        config["scrape_configs"].append(
            {"job_name": "icos-agent-fleet", "static_configs": [{"targets": [f"127.0.0.1:{evaluator.port}"]}]}
        )
        prom = PrometheusServer(tmp_path, config, port=port).start()
        started.append(evaluator.start())
        yield {"replicas": replicas, "fleet": evaluator, "prometheus": prom.url}
    finally:
        for p in started:
            p.kill()
        if prom is not None:
            prom.stop()


@pytest.mark.needs("prometheus")
def test_the_fleet_sums_the_replicas_pair_sums(
    fleet: dict[str, Any], mnist_splits: Splits, mnist_model: OnnxClassifier, challenger_bundle_dir: Path
) -> None:
    x = drifted(mnist_splits.test.x[:600])
    a = mnist_model.predict(x).predicted
    b = OnnxClassifier.load(CHALLENGER_MODEL).predict(x).predicted
    with httpx.Client(timeout=30) as client:
        for k in range(12):  # 50 digits a request, the replicas taking turns
            rows = x[50 * k : 50 * (k + 1)]
            body = {
                "inputs": [
                    {"name": "input", "shape": list(rows.shape), "datatype": "FP32", "data": rows.ravel().tolist()}
                ]
            }
            r = client.post(f"{fleet['replicas'][k % 2].url}/v2/models/mnist/infer", json=body)
            assert r.status_code == 200, r.text
    # the replicas' own pair sums, once each has paired its 300 predictions
    sums = []
    for rep in fleet["replicas"]:
        m = poll(lambda rep=rep: (s := scrape(rep.url)).value("icos_challenger_stat_total", stat="n") == 300 and s, 60)
        sums.append(PairSums.from_items({s.labels["stat"]: s.value for s in m.matching("icos_challenger_stat_total")}))
    total = sums[0] + sums[1]
    assert total.n_dis == int((a != b).sum())

    def fleet_window() -> dict[str, Any] | None:
        doc = httpx.get(f"{fleet['fleet'].url}/v1/estimates", timeout=10).json()
        w = doc.get("challenger", {}).get("windows", {}).get("5m")
        return w if w and w["n"] == 600 else None

    window = poll(fleet_window, 90, what="the fleet's paired window of 600 predictions")
    seen = time.time()  # the window is complete from here on: no more predictions come
    assert window["replicas"] == 2 and window["disagreements"] == total.n_dis
    pair = pair_of_bundle(Bundle.load(challenger_bundle_dir).pair, None)
    want = label_free(total, pair)
    assert want is not None
    got = window["differences"]["label_free"]
    assert (got["value"], got["lower"], got["upper"]) == pytest.approx((want.value, want.lower, want.upper), abs=1e-5)
    # the evaluator's metrics, scraped by Prometheus with the rules loaded: only a scrape taken after the window
    # was seen complete holds its value, and only a rule evaluated two intervals after that scrape reads it
    expr = 'icos_fleet_challenger_difference_ratio{window="5m",estimator="label_free",challenger="drift"}'
    scraped_at, value = poll(lambda: sample_since(fleet["prometheus"], expr, seen), 60, what=f"{expr} after {seen}")
    assert value == pytest.approx(want.value, abs=1e-5)
    rule = 'icos:challenger_difference:ratio5m{challenger="drift",source="fleet"}'
    _, value = poll(lambda: sample_since(fleet["prometheus"], rule, scraped_at + 2), 60, what=f"{rule} later")
    assert value == pytest.approx(want.value, abs=1e-5)
