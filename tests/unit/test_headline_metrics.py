"""The headline and reference figures an agent and the fleet evaluator export, audit gauges absent until
set (never NaN), and the audit baselines alerts compare with."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.audits.baselines import AuditBaselines
from agent.audits.config import audits_config_model
from agent.estimation.estimators.registry import TABLE_HEADLINE, headline_of
from agent.estimation.intervals import Estimate
from agent.judging.state import StateStore
from exporters.audit_metrics import AuditMetrics, GaugeSpec
from exporters.fleet import FleetCollector, FleetSnapshot, FleetVersion
from exporters.prometheus import EstimatePoint, EstimatesCollector, Snapshot, WindowPoint


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[s.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}"] = s.value
    return out


def test_headline_is_the_bundle_estimator_else_doc_never_a_weaker_one() -> None:
    e = {name: Estimate(v, v - 0.05, v + 0.05, 100) for name, v in [("icos_corrected", 0.4), ("doc", 0.7)]}
    assert headline_of({**e, "shift_aware": Estimate(0.72, 0.65, 0.8, 100)}, "shift_aware") == (
        "shift_aware",
        Estimate(0.72, 0.65, 0.8, 100),
    )
    assert headline_of(e, "shift_aware") == (TABLE_HEADLINE, e["doc"])  # a bundle without shift calibration
    assert headline_of({"icos_corrected": e["icos_corrected"]}, "shift_aware") is None
    assert headline_of({}, "doc") is None


def test_agent_exports_its_headline_and_reference_and_no_nan() -> None:
    points = [EstimatePoint("shift_aware", "5m", 0.72, 0.65, 0.8, 120), EstimatePoint("icos", "5m", 0.4, 0.3, 0.5, 120)]
    snap = Snapshot(
        "m",
        "1",
        [*points, EstimatePoint("avg_conf", "1h", math.nan, math.nan, math.inf, 3)],
        [WindowPoint("5m", 120), WindowPoint("1h", 3, trust_distance=math.nan)],
        headline=[points[0]],
        reference_accuracy=0.98,
    )
    reg = CollectorRegistry()
    reg.register(EstimatesCollector(lambda: snap))
    text = generate_latest(reg).decode()
    got = _samples(reg)
    labels = "{estimator=shift_aware,model=m,version=1,window=5m}"
    assert got["icos_headline_accuracy_ratio" + labels] == 0.72
    assert got["icos_headline_accuracy_ratio_lower" + labels] == 0.65
    assert got["icos_headline_accuracy_ratio_upper" + labels] == 0.8
    assert got["icos_headline_accuracy_samples" + labels] == 120
    assert got["icos_reference_accuracy_ratio{model=m,version=1}"] == 0.98
    assert not any(k.startswith("icos_headline_accuracy_ratio{estimator=icos,") for k in got)
    assert "NaN" not in text and "Inf" not in text
    assert "icos_estimated_accuracy_ratio{estimator=avg_conf,model=m,version=1,window=1h}" not in got


def test_fleet_exports_its_headline() -> None:
    head = EstimatePoint("doc", "1h", 0.7, 0.66, 0.74, 900)
    snap = FleetSnapshot("t", [FleetVersion("2", [head], {"1h": 900}, {"1h": 3}, [head])], [], 1.0, 0.1, {}, False)
    reg = CollectorRegistry()
    reg.register(FleetCollector(lambda: snap))
    got = _samples(reg)
    assert got["icos_fleet_headline_accuracy_ratio{estimator=doc,model=t,version=2,window=1h}"] == 0.7
    assert got["icos_fleet_headline_accuracy_ratio_upper{estimator=doc,model=t,version=2,window=1h}"] == 0.74


def test_audit_gauges_are_absent_until_set_and_never_nan() -> None:
    baselines: dict[str, float] = {}
    reg = CollectorRegistry()
    metrics = AuditMetrics(
        reg,
        ["toy"],
        [GaugeSpec("icos_toy_ratio", "toy", baseline=True), GaugeSpec("icos_toy_by_ratio", "toy", ("k",))],
        lambda: baselines,
    )
    text = generate_latest(reg).decode()
    assert "# TYPE icos_toy_ratio gauge" in text and "\nicos_toy_ratio " not in text
    assert "\nicos_toy_ratio_baseline " not in text
    metrics.set_gauge("icos_toy_ratio", {(): 0.6})
    metrics.set_gauge("icos_toy_by_ratio", {("a",): 0.1, ("b",): math.nan})
    baselines["icos_toy_ratio"] = 0.65
    got = _samples(reg)
    assert got["icos_toy_ratio{}"] == 0.6 and got["icos_toy_ratio_baseline{}"] == 0.65
    assert got["icos_toy_by_ratio{k=a}"] == 0.1 and "icos_toy_by_ratio{k=b}" not in got
    metrics.set_gauge("icos_toy_ratio", {(): math.inf})  # a non-finite result: absent, not Inf
    assert "icos_toy_ratio{}" not in _samples(reg) and metrics.value("icos_toy_ratio") is None


def test_baselines_first_run_wins_configured_overrides_and_survive_a_restart(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    try:
        b = AuditBaselines("m", {}, lambda: store)
        assert b.get("icos_dscore", "id1") is None
        b.learn("icos_dscore", "id1", math.nan)  # never learnt
        assert b.get("icos_dscore", "id1") is None
        b.learn("icos_dscore", "id1", 0.65)
        b.learn("icos_dscore", "id1", 0.40)  # a later, worse run does not move the baseline
        assert b.get("icos_dscore", "id1") == 0.65
        assert b.get("icos_dscore", "id2") is None  # another model or audit setting: its own
        again = AuditBaselines("m", {}, lambda: store)  # a restart reads the store
        assert again.get("icos_dscore", "id1") == 0.65
        configured = AuditBaselines("m", {"icos_dscore": 0.7}, lambda: store)
        assert configured.get("icos_dscore", "id1") == 0.7
    finally:
        store.close()


def test_baselines_learnt_before_the_store_opens_are_kept(tmp_path: Path) -> None:
    opened: list[StateStore] = []
    b = AuditBaselines("m", {}, lambda: opened[0] if opened else None)
    b.learn("icos_dscore", "id1", 0.5)
    opened.append(StateStore(tmp_path))
    try:
        assert b.get("icos_dscore", "id1") == 0.5
        assert AuditBaselines("m", {}, lambda: opened[0]).get("icos_dscore", "id1") == 0.5  # written back
    finally:
        opened[0].close()


def test_configured_baseline_of_a_kind_without_one_is_refused() -> None:
    model = audits_config_model()
    assert model.model_validate({"baselines": {"dscore": 0.6}}).configured_baselines() == {"icos_dscore": 0.6}
    with pytest.raises(ValueError, match="audit 'mutation' has no baseline; kinds with one: dscore"):
        model.model_validate({"baselines": {"mutation": 0.1}})
    with pytest.raises(ValueError, match="finite"):
        model.model_validate({"baselines": {"dscore": "nan"}})
