"""The reference docs are current: CLI and configuration pages are generated from the code and
committed as generated; every metric the agent exports is documented with its labels; the PromQL
examples parse."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.support.inprocess import RunningServer
from tests.support.requirements import require

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


@pytest.mark.parametrize("script", ["gen_cli.py", "gen_config.py"])
def test_generated_page_is_current(script: str) -> None:
    proc = subprocess.run(  # noqa: S603
        [sys.executable, str(DOCS / script), "--check"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_cli_page_lists_every_command_and_flag() -> None:
    from agent.cli import build_parser

    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        assert f"`icos-agent {name}`" in text
        for action in p._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in text, (name, flag)


def _documented() -> dict[str, set[str]]:
    """``{metric: labels}`` from the tables of docs/metrics.md."""
    rows = re.findall(r"^\| `(icos_[a-z0-9_]+)` \| (\w+) \|([^|]*)\|", (DOCS / "metrics.md").read_text(), re.M)
    return {name: {lab.strip() for lab in labels.split(",") if lab.strip()} for name, _, labels in rows}


def _exported(app: Any) -> dict[str, set[str]]:
    """``{metric as queried: declared labels}`` of everything on the app's registry."""
    from prometheus_client.metrics import MetricWrapperBase

    out: dict[str, set[str]] = {}
    for collector in list(app.state.registry._collector_to_names):
        if isinstance(collector, MetricWrapperBase):
            name = collector._name + ("_total" if collector._type == "counter" else "")
            out[name] = set(collector._labelnames)
        else:
            for fam in collector.collect():
                out[fam.name + ("_total" if fam.type == "counter" else "")] = {k for s in fam.samples for k in s.labels}
    return out


def _fleet_exported() -> dict[str, set[str]]:
    """``{metric: labels}`` of the fleet evaluator (``mode: fleet``), from a snapshot with every part."""
    from exporters.fleet import FleetCollector, FleetSnapshot, FleetVersion
    from exporters.prometheus import EstimatePoint

    snap = FleetSnapshot(
        model="mnist",
        versions=[
            FleetVersion(
                "1",
                [EstimatePoint("shift_aware", "5m", 0.9, 0.8, 0.95, 10)],
                {"5m": 10},
                {"5m": 3},
                classes={"5m": {"macro": {"precision": 0.9, "recall": 0.8, "f1": 0.85}}},
            )
        ],
        mismatches=[("2", "mixed")],
        last_success=1.0,
        refresh_seconds=0.1,
        errors={"unreachable": 0},
        stale=False,
        label_errors={"unreachable": 0},
    )
    out: dict[str, set[str]] = {}
    for fam in FleetCollector(lambda: snap).collect():
        name = fam.name + ("_total" if fam.type == "counter" else "")
        out[name] = {k for s in fam.samples for k in s.labels}
    return out


def _challenger_exported() -> dict[str, set[str]]:
    """``{metric: labels}`` of a challenger beside the champion (an agent's and the fleet evaluator's), from
    its metrics and a snapshot with every part."""
    from prometheus_client import CollectorRegistry

    from exporters.challenger_metrics import ChallengerCollector, ChallengerMetrics, ChallengerSnapshot, PairedPoint
    from exporters.prometheus import EstimatePoint

    e = EstimatePoint("label_free", "5m", 0.01, -0.02, 0.04, 100)
    snap = ChallengerSnapshot("mnist", "1", "v2", [PairedPoint("5m", 100, 0.9, [e], e, e)])
    fleet = ChallengerSnapshot("mnist", "1", "v2", [PairedPoint("5m", 100, 0.9, [e])])  # label-free sums only
    registry = CollectorRegistry()
    metrics = ChallengerMetrics(registry, "v2")
    metrics.stats.add(("mnist", "1", "abc"), [("n", 100.0)])
    metrics.predictions.labels("mnist", "1", "v2").inc()
    registry.register(ChallengerCollector(lambda: snap))
    registry.register(ChallengerCollector(lambda: fleet, prefix="icos_fleet_"))
    from prometheus_client.metrics import MetricWrapperBase

    out: dict[str, set[str]] = {}
    for collector in list(registry._collector_to_names):
        if isinstance(collector, MetricWrapperBase):
            out[collector._name + ("_total" if collector._type == "counter" else "")] = set(collector._labelnames)
        else:
            for fam in collector.collect():
                out[fam.name + ("_total" if fam.type == "counter" else "")] = {k for s in fam.samples for k in s.labels}
    return out


def test_every_exported_metric_is_documented_with_its_labels(
    mnist_bundle_dir: Path, tmp_path: Path, run_server: Callable[..., RunningServer]
) -> None:
    from agent.config.settings import load_settings
    from agent.data.datasets import mnist_splits
    from agent.protocol import v2
    from agent.server.app import create_app

    settings = load_settings(
        None,
        mode="serve",
        model={"name": "mnist", "path": str(REPO / "agent/shipped_models/mnist_cnn.onnx")},
        bundle={"path": str(mnist_bundle_dir)},
        state_dir=str(tmp_path),
    )
    app = create_app(settings)
    x = np.ascontiguousarray(mnist_splits().test.x[:8])
    srv = run_server(app)
    with httpx.Client(base_url=srv.url, timeout=30) as client:  # predictions and labels, so the collectors report
        body, headers = v2.encode_request([v2.tensor("input", x, "FP32")], binary=True, request_id="r1")
        assert client.post("/v2/models/mnist/infer", content=body, headers=headers).status_code == 200
        labels = {"labels": [{"id": f"r1:{i}", "label": 1} for i in range(8)]}
        assert client.post("/v1/labels", json=labels).status_code == 200
        scraped = client.get("/metrics").text
        exported = _exported(app)
    exported.update(_fleet_exported())
    exported.update(_challenger_exported())
    # proxy mode registers its upstream's readiness metrics too (the app is built, never started)
    upstream = settings.upstream.model_copy(update={"url": srv.url})
    proxy = settings.model_copy(update={"mode": "proxy", "upstream": upstream})
    for name, labs in _exported(create_app(proxy)).items():
        exported.setdefault(name, labs)
    documented = _documented()
    for metric, kind in re.findall(r"^# TYPE (icos_\w+) (\w+)", scraped, re.M):
        if metric.endswith("_created"):  # prometheus_client's creation time of counters and histograms
            continue
        if kind == "counter" and not metric.endswith("_total"):
            metric += "_total"
        assert metric in documented, f"{metric} is exported but not documented in docs/metrics.md"
    for name, labs in exported.items():
        assert name in documented, f"{name} is exported but not documented in docs/metrics.md"
        if labs or name in ("icos_estimated_accuracy_ratio", "icos_realized_accuracy_ratio"):
            assert documented[name] == labs, f"{name}: documented labels {documented[name]} != exported {labs}"
    stale = set(documented) - set(exported)
    assert not stale, f"documented but not exported: {sorted(stale)}"


def test_promql_examples_parse(tmp_path: Path) -> None:
    promtool = require("promtool")
    exprs: list[str] = []
    for block in re.findall(r"```promql\n(.*?)```", (DOCS / "metrics.md").read_text(), re.S):
        current: list[str] = []
        for line in block.splitlines() + [""]:
            if current and (line.startswith("#") or not line.strip() or not line[0].isspace()):
                exprs.append("\n".join(current))  # an expression ends where an unindented line starts
                current = []
            if line.strip() and not line.startswith("#"):
                current.append(line)
    assert len(exprs) >= 10
    rules = {
        "groups": [{"name": "docs", "rules": [{"record": f"docs:example{i}", "expr": e} for i, e in enumerate(exprs)]}]
    }
    path = tmp_path / "docs.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)  # noqa: S603
    assert proc.returncode == 0, proc.stdout + proc.stderr
