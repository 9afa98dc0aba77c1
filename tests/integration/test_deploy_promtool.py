"""Rules and alerts: the generated files are current, promtool accepts every rule file we ship (plain,
operator, Helm-rendered, Grafana provisioning, dashboard queries) and the unit tests cover every rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.requirements import require

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "icos-agent.rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "icos-agent.rules.test.yml"
GENERATOR = ROOT / "deploy" / "alerts" / "generate.py"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require("promtool"), *args], capture_output=True, text=True, timeout=120, check=False)


def _check_rules(tmp_path: Path, groups: dict[str, Any], name: str) -> None:
    f = tmp_path / f"{name}.rules.yml"
    f.write_text(yaml.safe_dump(groups, sort_keys=False), encoding="utf-8")
    res = _promtool("check", "rules", str(f))
    assert res.returncode == 0, res.stdout + res.stderr


def _load_generator() -> Any:
    sys.path.insert(0, str(GENERATOR.parent))
    try:
        import generate  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    return generate


def test_generated_files_are_current() -> None:
    res = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def test_every_rule_has_a_unit_test() -> None:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    tested_alerts = {t["alertname"] for g in tests["tests"] for t in g.get("alert_rule_test", [])}
    tested_exprs = " ".join(t["expr"] for g in tests["tests"] for t in g.get("promql_expr_test", []))
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["alert"] in tested_alerts, f"no promtool test for alert {rule['alert']}"
            else:
                assert rule["record"] in tested_exprs, f"no promtool test for recording rule {rule['record']}"
    # Each alert is tested both firing and silent.
    for g in tests["tests"]:
        for t in g.get("alert_rule_test", []):
            assert "exp_alerts" in t
    firing = {t["alertname"] for g in tests["tests"] for t in g.get("alert_rule_test", []) if t["exp_alerts"]}
    silent = {t["alertname"] for g in tests["tests"] for t in g.get("alert_rule_test", []) if not t["exp_alerts"]}
    assert firing == silent == tested_alerts


def test_thresholds_are_the_same_everywhere() -> None:
    gen = _load_generator()
    src = gen.load_source()
    plain = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    graf_file = ROOT / "deploy" / "grafana" / "provisioning" / "alerting" / "icos-agent.yaml"
    grafana = {r["title"]: r for g in yaml.safe_load(graf_file.read_text())["groups"] for r in g["rules"]}
    values = yaml.safe_load((ROOT / "helm" / "icos-agent" / "values.yaml").read_text())["prometheusRule"]["alerts"]
    op_file = ROOT / "deploy" / "kubernetes" / "components" / "monitoring" / "prometheusrule.yaml"
    operator = yaml.safe_load(op_file.read_text())["spec"]
    assert operator == yaml.safe_load(RULES.read_text())
    for rule in src["alerts"]["rules"]:
        name = rule["alert"]
        assert grafana[name]["data"][0]["model"]["expr"] == plain[name]["expr"]
        assert grafana[name]["for"] == plain[name]["for"] == values[rule["key"]]["for"]
        for param, default in rule["params"].items():
            assert values[rule["key"]][param] == default


@pytest.mark.needs("promtool")
def test_promtool_check_rules() -> None:
    res = _promtool("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.needs("promtool")
def test_promtool_unit_tests() -> None:
    res = _promtool("test", "rules", str(RULE_TESTS))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.needs("promtool")
def test_helm_rendered_rules_pass_promtool(tmp_path: Path) -> None:
    import helm_python as helm

    overrides = {
        "prometheusRule": {
            "enabled": True,
            "job": "ml-agents",
            "alerts": {"auditFailing": {"window": "90m"}, "accuracyLow": {"threshold": 0.5, "for": "1h"}},
        }
    }
    with helm.Chart.load(ROOT / "helm" / "icos-agent") as chart:
        out = chart.render(values=overrides, name="demo", namespace="ml")
    doc = yaml.safe_load(out["icos-agent/templates/prometheusrule.yaml"])
    _check_rules(tmp_path, doc["spec"], "helm")
    alerts = {r["alert"]: r for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert "[90m]" in alerts["IcosAuditFailing"]["expr"]
    assert 'job="ml-agents"' in alerts["IcosAgentDown"]["expr"]


@pytest.mark.needs("promtool")
def test_grafana_alert_and_dashboard_queries_parse(tmp_path: Path) -> None:
    graf = yaml.safe_load((ROOT / "deploy" / "grafana" / "provisioning" / "alerting" / "icos-agent.yaml").read_text())
    exprs = [q["model"]["expr"] for g in graf["groups"] for r in g["rules"] for q in r["data"] if "expr" in q["model"]]
    sys.path.insert(0, str(ROOT / "deploy" / "grafana"))
    try:
        import dashboard  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    shipped = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "icos-agent.json").read_text())
    dash_exprs = dashboard.expressions(shipped)
    assert len(dash_exprs) >= 15
    rules = [{"record": f"icos_check:expr_{i}", "expr": e} for i, e in enumerate(exprs + dash_exprs)]
    _check_rules(tmp_path, {"groups": [{"name": "queries", "rules": rules}]}, "queries")


@pytest.mark.needs("promtool")
def test_absolute_thresholds_can_be_set_besides_the_relative_alerts(tmp_path: Path) -> None:
    """The default alerts compare a model with itself (reference accuracy, D-Score baseline); an absolute
    floor set in the values (``threshold``) fires where the relative alert stays silent: a model that
    always scores 0.875 below a 0.9 floor, the demo CNN's D-Score 0.647 below 0.8."""
    gen = _load_generator()
    src = gen.load_source()
    overrides = {"accuracyLow": {"threshold": 0.9, "for": "0s"}, "dscoreDegraded": {"threshold": 0.8}}
    (tmp_path / "floors.rules.yml").write_text(yaml.safe_dump(gen.prometheus_groups(src, overrides=overrides)))
    (tmp_path / "defaults.rules.yml").write_text(yaml.safe_dump(gen.prometheus_groups(src)))
    target = 'namespace="ml",job="icos-agent",instance="s1"'
    head = f'{target},model="steady",version="3",estimator="shift_aware",window="1h"'
    series = {
        f"icos_headline_accuracy_ratio{{{head}}}": "0.875x30",
        f"icos_headline_accuracy_ratio_lower{{{head}}}": "0.8125x30",
        f"icos_headline_accuracy_ratio_upper{{{head}}}": "0.9375x30",
        f"icos_headline_accuracy_samples{{{head}}}": "3600x30",
        f'icos_reference_accuracy_ratio{{{target},model="steady",version="3"}}': "0.875x30",
        f'icos_predictions_total{{{target},model="steady",version="3"}}': "0+60x30",
        f"icos_dscore{{{target}}}": "0.647x30",
        f"icos_dscore_baseline{{{target}}}": "0.647x30",
    }
    description = (
        "The shift_aware headline (agents) over the last hour is 87.5%: more than the margin below the model's "
        "reference accuracy, which lies above its 95% interval, or below the configured floor."
    )
    accuracy = {
        "exp_labels": {
            "severity": "warning",
            "namespace": "ml",
            "model": "steady",
            "version": "3",
            "estimator": "shift_aware",
            "source": "agents",
        },
        "exp_annotations": {"summary": "Estimated accuracy of steady 3 is low", "description": description},
    }
    dscore = {
        "exp_labels": {"severity": "warning", "namespace": "ml", "job": "icos-agent"},
        "exp_annotations": {
            "summary": "D-Score of the model behind icos-agent is degraded",
            "description": "The last D-Score audit gave 0.647: more than the allowed drop below its baseline, or "
            "below the configured floor.",
        },
    }
    for rules, fire in (("floors", True), ("defaults", False)):
        tests = {
            "rule_files": [f"{rules}.rules.yml"],
            "evaluation_interval": "1m",
            "tests": [
                {
                    "interval": "1m",
                    "input_series": [{"series": k, "values": v} for k, v in series.items()],
                    "alert_rule_test": [
                        {"eval_time": "20m", "alertname": "IcosEstimatedAccuracyLow", "exp_alerts": [accuracy] * fire},
                        {"eval_time": "20m", "alertname": "IcosDScoreDegraded", "exp_alerts": [dscore] * fire},
                    ],
                }
            ],
        }
        (tmp_path / f"{rules}.test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
        res = _promtool("test", "rules", str(tmp_path / f"{rules}.test.yml"))
        assert res.returncode == 0, rules + ": " + res.stdout + res.stderr
