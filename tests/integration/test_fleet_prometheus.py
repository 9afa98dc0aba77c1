"""The fleet evaluator against real parts: three ``icos-agent serve`` replicas scraped every second by a
real store, ``icos-agent serve`` in ``mode: fleet`` reading the store's Prometheus HTTP API, and a
reference agent (not scraped) that receives every request the replicas receive. The store is a real
Prometheus, then a real VictoriaMetrics: the evaluator must read both alike.

The fleet's headline must equal the reference's (|Δ| ≤ 0.01) across a replica restart in the middle
of the window (its counters reset), Prometheus (which also scrapes the evaluator, with the shipped rules
loaded) must record the fleet's headline as ``icos:headline_accuracy:ratio5m`` (|Δ| ≤ 0.02, labelled
``source="fleet"``), and the last estimates must stay, marked stale, while the store is down."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.data.datasets import Splits
from agent.estimation.segments.segmentation import label_of
from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.ports import free_port
from tests.support.prometheus import PrometheusServer, scrape_every_second
from tests.support.victoria import VictoriaMetricsServer
from tests.support.waiting import poll

ROOT = Path(__file__).resolve().parents[2]
WINDOWS = ["5m", "15m"]
HEADLINE = "shift_aware"


def _poll(fn: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    # nocache: VictoriaMetrics otherwise answers for 30 s ago (its -search.latencyOffset)
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr, "nocache": "1"}, timeout=5)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def _store(
    backend: str, directory: Path, targets: list[str], fleet: str, port: int
) -> PrometheusServer | VictoriaMetricsServer:
    """The store scraping the replicas (job ``icos-agent``) and the evaluator (``icos-agent-fleet``) every
    second; Prometheus with the shipped rule file loaded (VictoriaMetrics evaluates no rules itself)."""
    config = scrape_every_second(targets, rule_files=[str(ROOT / "deploy" / "prometheus" / "icos-agent.rules.yml")])
    config["scrape_configs"].append({"job_name": "icos-agent-fleet", "static_configs": [{"targets": [fleet]}]})
    if backend == "prometheus":
        return PrometheusServer(directory, config, port=port)
    return VictoriaMetricsServer(directory, config, port=port)


@pytest.fixture(
    params=[
        pytest.param("prometheus", marks=pytest.mark.needs("prometheus")),
        pytest.param("victoria-metrics", marks=pytest.mark.needs("victoria-metrics")),
    ]
)
def fleet_parts(request: pytest.FixtureRequest, mnist_bundle_dir: Path, tmp_path: Path) -> Iterator[dict[str, Any]]:
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
    stores: list[PrometheusServer | VictoriaMetricsServer] = []
    try:
        replicas = [AgentProcess(tmp_path, agent_config(f"r{i}")).start() for i in range(3)]
        started.extend(replicas)
        reference = AgentProcess(tmp_path, agent_config("reference")).start()
        started.append(reference)
        prom_port = free_port()  # the store's, chosen before it starts: the evaluator is configured first
        fleet_cfg = {
            "mode": "fleet",
            "model": {"name": "mnist", "version": "1"},
            "bundle": {"path": str(mnist_bundle_dir)},
            "windows": {"time": WINDOWS},
            "fleet": {
                "prometheus_url": f"http://127.0.0.1:{prom_port}",
                "refresh_seconds": 1,
                "query_timeout_seconds": 2,
                "lookback_seconds": 60,
                "stale_after_seconds": 4,
                "selector": 'job="icos-agent"',
            },
        }
        fleet = AgentProcess(tmp_path, fleet_cfg)
        targets = [f"127.0.0.1:{r.port}" for r in replicas]
        store = _store(request.param, tmp_path, targets, f"127.0.0.1:{fleet.port}", prom_port)
        stores.append(store)
        store.start()
        started.append(fleet)
        fleet.start()
        yield {
            "backend": request.param,
            "replicas": replicas,
            "reference": reference,
            "fleet": fleet,
            "prometheus": store.url,
            "store": store,
            "dir": tmp_path,
        }
    finally:
        for p in started:
            p.kill()
        for st in stores:
            st.stop()


def _send(client: httpx.Client, url: str, x: np.ndarray) -> None:
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    r = client.post(f"{url}/v2/models/mnist/infer", json=body)
    assert r.status_code == 200, r.text


def _judged(prom: str, instance: str | None = None) -> float:
    sel = f'stat="n",instance="{instance}"' if instance else 'stat="n"'
    res = _query(prom, f"sum(icos_window_stat_total{{{sel}}})")
    return float(res[0]["value"][1]) if res else 0.0


def _fleet_metrics(fleet: AgentProcess) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(f"{fleet.url}/metrics", timeout=5).text):
        for s in fam.samples:
            out[s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"] = s.value
    return out


def test_fleet_headline_equals_one_agent_across_a_restart_and_survives_prometheus_down(
    fleet_parts: dict[str, Any], mnist_splits: Splits
) -> None:
    replicas: list[AgentProcess] = fleet_parts["replicas"]
    reference: AgentProcess = fleet_parts["reference"]
    fleet: AgentProcess = fleet_parts["fleet"]
    prom: str = fleet_parts["prometheus"]
    _poll(lambda: len(_query(prom, 'up{job="icos-agent"} == 1')) == 3, what="three replicas scraped")
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
        _poll(lambda: _judged(prom) >= sent, what="first half scraped")
        # restart replica 1 mid-window: its counters start again from zero on the same instance
        restarted = replicas[1]
        assert restarted.terminate() == 0
        restarted.start()
        inst = f"127.0.0.1:{restarted.port}"
        _poll(lambda: _query(prom, f'icos_window_stat_total{{stat="n",instance="{inst}"}} == 0'), what="reset seen")
        for i, b in enumerate(batches[15:]):
            _send(client, replicas[i % 3].url, b)
            _send(client, reference.url, b)
    total = len(x)

    def fleet_caught_up() -> dict[str, Any] | None:
        body: dict[str, Any] = httpx.get(f"{fleet.url}/v1/estimates", timeout=5).json()
        w = body["windows"].get("5m")
        return body if w and w["n"] == total and body["windows"].get("15m", {}).get("n") == total else None

    body = poll(
        fleet_caught_up,
        timeout=60,
        what="fleet estimates of all traffic",
        explain=lambda: httpx.get(f"{fleet.url}/v1/estimates", timeout=5).text[:3000],
    )
    ref = _poll(
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
        # one rendering: the fleet reads as one agent, its trust signal and unreliable marks included
        mine_w, theirs_w = body["windows"][window], ref["windows"][window]
        assert mine_w["flag"]["raised"] == theirs_w["flag"]["raised"], (window, mine_w, theirs_w)
        assert mine_w["flag"]["distance"] == pytest.approx(theirs_w["flag"]["distance"], abs=0.05)
        marked = {est: e["unreliable"] for est, e in mine.items() if "unreliable" in e}
        assert set(marked) == {est for est, e in theirs.items() if "unreliable" in e}, (window, marked)
        print(window, "flag", mine_w["flag"], "unreliable", marked)
        _same_segments(mine_w, theirs_w, window)
    _segments_exported(reference, ref)
    delta = abs(
        body["windows"]["5m"]["estimates"][HEADLINE]["value"] - ref["windows"]["5m"]["estimates"][HEADLINE]["value"]
    )
    print(f"fleet vs reference headline |delta| = {delta:.6f}")
    assert body["windows"]["5m"]["replicas"] == 3
    m = _fleet_metrics(fleet)
    key = f"icos_fleet_estimated_accuracy_ratio{{estimator={HEADLINE},model=mnist,version=1,window=5m}}"
    assert m[key] == pytest.approx(body["windows"]["5m"]["estimates"][HEADLINE]["value"])
    top = body["windows"]["5m"]["segments"][0]
    labels = f"kind={top['kind']},model=mnist,segment={label_of(top['name'])},version=1,window=5m"
    assert m[f"icos_fleet_segment_contribution_ratio{{{labels}}}"] == pytest.approx(top["contribution"], abs=1e-6)
    assert m[f"icos_fleet_segment_share_ratio{{{labels}}}"] == pytest.approx(top["share"], abs=1e-6)
    assert m["icos_fleet_restarted_replicas{model=mnist}"] >= 1
    assert m["icos_fleet_stale{model=mnist}"] == 0
    assert m["icos_fleet_last_success_timestamp_seconds{model=mnist}"] > time.time() - 30

    # The recorded headline, which the alerts and the dashboard read, is the fleet's (not the replicas' own).
    head = body["windows"]["5m"]["headline"]
    assert head["estimator"] == HEADLINE
    assert m[f"icos_fleet_headline_accuracy_ratio{{estimator={HEADLINE},model=mnist,version=1,window=5m}}"] == (
        pytest.approx(head["value"])
    )

    if fleet_parts["backend"] == "prometheus":
        _recorded_by_the_shipped_rules(prom, head)

    # The store down: the last estimates stay, marked stale, and the errors are counted
    fleet_parts["store"].stop()
    stale = _poll(
        lambda: (b := httpx.get(f"{fleet.url}/v1/estimates", timeout=5).json())["fleet"]["stale"] and b,
        what="stale estimates",
    )
    assert stale["windows"]["5m"]["estimates"][HEADLINE] == body["windows"]["5m"]["estimates"][HEADLINE]
    assert stale["fleet"]["last_error"]
    m = _fleet_metrics(fleet)
    assert (
        m["icos_fleet_stale{model=mnist}"] == 1
        and m["icos_fleet_query_errors_total{model=mnist,reason=unreachable}"] >= 1
    )
    assert stale["fleet"]["last_error_reason"] == "unreachable"
    assert m[key] == pytest.approx(body["windows"]["5m"]["estimates"][HEADLINE]["value"])


def _same_segments(fleet: dict[str, Any], agent: dict[str, Any], window: str) -> None:
    """The fleet's segments of a window are the reference agent's: the same segments with the same counts,
    shares, estimates and contributions (summed over the replicas' exported per-segment sums)."""
    mine = {s["name"]: s for s in fleet["segments"]}
    theirs = {s["name"]: s for s in agent["segments"]}
    assert mine and set(mine) == set(theirs), window
    for name, seg in mine.items():
        other = theirs[name]
        assert seg["n"] == other["n"] and seg["kind"] == other["kind"], (window, name)
        assert seg["share"] == pytest.approx(other["share"], abs=1e-6), (window, name)
        for key in ("contribution", "reference_accuracy"):
            assert seg[key] == pytest.approx(other[key], abs=0.01), (window, name, key)
        if other["estimate"] is not None:
            assert seg["estimate"]["value"] == pytest.approx(other["estimate"]["value"], abs=0.01), (window, name)
        # what changed where: the fleet's test reads the replicas' summed change sums as the agent reads its own
        assert seg["change"]["changed"] == other["change"]["changed"], (window, name)
        assert seg["change"]["score"] == pytest.approx(other["change"]["score"], abs=0.01), (window, name)
        assert {c["column"] for c in seg["change"]["columns"]} == {c["column"] for c in other["change"]["columns"]}
    # ... and there is something to read: the darker, noisy digits moved the inputs of segments, whose change sums
    # name the components that moved (empty change sums on both sides would compare equal; the model's confidence
    # and the novel inputs are read without them)
    summed = {"column", "pair", "relation", "point"}
    moved = [s for s in agent["segments"] if any(c["kind"] in summed for c in s["change"]["columns"])]
    assert moved, (window, [s["change"] for s in agent["segments"]])
    assert fleet["segments"][0]["name"] == agent["segments"][0]["name"] or (
        fleet["segments"][0]["contribution"] == pytest.approx(agent["segments"][0]["contribution"], abs=0.01)
    )
    assert fleet["segment_drop"]["dimensions"].keys() == agent["segment_drop"]["dimensions"].keys()


def _segments_exported(agent: AgentProcess, estimates: dict[str, Any]) -> None:
    """One agent's ``/metrics`` carries its windows' segments as ``/v1/estimates`` ranks them."""
    m = _fleet_metrics(agent)
    for row in estimates["windows"]["5m"]["segments"][:5]:
        labels = f"kind={row['kind']},model=mnist,segment={label_of(row['name'])},version=1,window=5m"
        assert m[f"icos_segment_share_ratio{{{labels}}}"] == pytest.approx(row["share"], abs=1e-6)
        assert m[f"icos_segment_contribution_ratio{{{labels}}}"] == pytest.approx(row["contribution"], abs=1e-6)
        if row["estimate"] is not None:
            value = m[f"icos_segment_estimated_accuracy_ratio{{{labels}}}"]
            assert value == pytest.approx(row["estimate"]["value"], abs=1e-6)
        moved = label_of(row["change"]["columns"][0]["column"]) if row["change"]["columns"] else ""
        change = m[f"icos_segment_change_score{{column={moved},{labels}}}"]
        assert change == pytest.approx(row["change"]["score"], abs=1e-6)
    segments = {k for k in m if k.startswith("icos_segment_share_ratio{") and "window=5m" in k}
    assert len(segments) == len(estimates["windows"]["5m"]["segments"])
    changes = {k for k in m if k.startswith("icos_segment_change_score{") and "window=5m" in k}
    assert len(changes) == len(segments)  # one series per segment, whatever moved


def _recorded_by_the_shipped_rules(prom: str, head: dict[str, Any]) -> None:
    """Prometheus records the fleet's headline (not the replicas' own) as the alerts and the dashboard read it."""

    def recorded() -> list[dict[str, Any]]:
        res = _query(prom, 'icos:headline_accuracy:ratio5m{model="mnist"}')
        return [r for r in res if abs(float(r["value"][1]) - head["value"]) <= 0.02] if len(res) == 1 else []

    rec = _poll(recorded, what="the fleet's headline recorded by the shipped rules")
    assert rec[0]["metric"] == {
        "__name__": "icos:headline_accuracy:ratio5m",
        "model": "mnist",
        "version": "1",
        "estimator": HEADLINE,
        "source": "fleet",
    }
    print(f"recorded headline {float(rec[0]['value'][1]):.6f}, fleet's {head['value']:.6f}")
