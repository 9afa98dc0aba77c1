"""The Helm chart: lint and render every example values file with Helm's own engine (helm-python-sdk),
validate every rendered manifest strictly against the Kubernetes schemas (kubernetes-validate, offline)
and the operator kinds against the shipped CRD schemas; check the security posture of every pod."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate as kv
import pytest
import yaml

from agent.config import settings as config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "icos-agent"
EXAMPLES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = "1.30"
CRD_SCHEMAS = {
    "ServiceMonitor": ROOT / "deploy" / "schemas" / "servicemonitor-monitoring-v1.json",
    "PrometheusRule": ROOT / "deploy" / "schemas" / "prometheusrule-monitoring-v1.json",
}
EVERYTHING = {
    "prometheusRule": {"enabled": True},
    "serviceMonitor": {"enabled": True},
    "grafana": {"alerts": {"enabled": True}},
    "audits": {"cronjob": {"enabled": True}},
    "podDisruptionBudget": {"enabled": True},
    "fleet": {"enabled": True, "prometheusUrl": "http://prometheus.monitoring:9090"},
}


def _values(path: Path | None) -> dict[str, Any]:
    if path is None:
        return dict(EVERYTHING)
    loaded: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return loaded


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        out = chart.render(values=values, name="demo", namespace="ml")
    docs: list[dict[str, Any]] = []
    for name, text in sorted(out.items()):
        if name.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


CASES = [pytest.param(None, id="all-features")] + [pytest.param(p, id=p.stem) for p in EXAMPLES]


def test_examples_exist_for_every_mode() -> None:
    modes = {_values(p).get("mode") for p in EXAMPLES}
    assert modes == {"serve", "proxy", "observe"}
    sources = {_values(p).get("model", {}).get("source") for p in EXAMPLES if _values(p).get("mode") == "serve"}
    assert sources == {"volume", "initContainer", "mlflow"}


@pytest.mark.parametrize("values_file", CASES)
def test_lint_is_clean(values_file: Path | None) -> None:
    report = helm.lint(CHART, _values(values_file), strict=True, namespace="ml", kube_version=f"v{KUBE_VERSION}.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("values_file", CASES)
def test_rendered_manifests_validate(values_file: Path | None) -> None:
    docs = render(_values(values_file))
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount"} <= kinds
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in CRD_SCHEMAS:
            schema = json.loads(CRD_SCHEMAS[doc["kind"]].read_text(encoding="utf-8"))
            errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=str)
            assert not errors, f"{where}: {errors[0].message} at {list(errors[0].path)}"
            continue
        try:
            kv.validate(doc, KUBE_VERSION, strict=True)
        except kv.ValidationError as exc:  # type: ignore[attr-defined]
            pytest.fail(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")


def _pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for d in docs:
        if d["kind"] == "Deployment":
            out.append((d["metadata"]["name"], d["spec"]["template"]["spec"]))
        elif d["kind"] == "CronJob":
            out.append((d["metadata"]["name"], d["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
    return out


@pytest.mark.parametrize("values_file", CASES)
def test_pods_are_locked_down(values_file: Path | None) -> None:
    values = _values(values_file)
    for name, spec in _pod_specs(render(values)):
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        ours = [
            c
            for c in spec.get("initContainers", []) + spec["containers"]
            if c["name"] != "triton" and c["name"] != "mlserver"
        ]
        for c in ours:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert isinstance(sc["runAsUser"], int) and sc["runAsUser"] > 0, (name, c["name"])
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            assert "/tmp" in mounts, (name, c["name"])


@pytest.mark.parametrize("values_file", CASES)
def test_agent_container_wiring(values_file: Path | None) -> None:
    values = _values(values_file)
    docs = render(values)
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    agent = next(c for c in spec["containers"] if c["name"] == "agent")
    assert agent["args"][:3] == ["serve", "--config", "/etc/icos-agent/agent.yaml"]
    assert agent["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert agent["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    env = {e["name"]: e for e in agent["env"]}
    assert "secretKeyRef" in env["ICOS_AGENT_ADMIN_TOKEN"]["valueFrom"]
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == deploy["metadata"]["name"])
    cfg = yaml.safe_load(cm["data"]["agent.yaml"])
    assert "token" not in json.dumps(cfg)
    mode = values.get("mode", "serve")
    assert cfg["mode"] == mode
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert cfg["server"]["port"] == ports["http"]
    if "metrics" in ports:
        assert cfg["server"]["metrics_port"] == ports["metrics"]
    assert cfg["server"].get("grpc_port") == ports.get("grpc") == values.get("service", {}).get("grpcPort")
    mounted = {m["mountPath"] for m in agent["volumeMounts"]}
    assert any(cfg["bundle"]["path"].startswith(m) for m in mounted)
    if mode == "serve":
        assert any(cfg["model"]["path"].startswith(m) for m in mounted)
    if mode == "proxy":
        assert cfg["upstream"]["url"].startswith("http://127.0.0.1:")
        assert len(spec["containers"]) == 2
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == deploy["metadata"]["name"])
    assert {p["name"] for p in svc["spec"]["ports"]} == set(ports)


def test_agent_config_is_accepted_by_the_agent(tmp_path: Path) -> None:
    """The chart's agent.yaml passes the agent's own validation."""
    for p in EXAMPLES:
        docs = render(_values(p))
        cm = next(d for d in docs if d["kind"] == "ConfigMap" and "agent.yaml" in d.get("data", {}))
        f = tmp_path / f"{p.stem}.yaml"
        f.write_text(cm["data"]["agent.yaml"], encoding="utf-8")
        config.load_settings(f)


def test_schema_rejects_bad_values() -> None:
    with helm.Chart.load(CHART) as chart:
        for bad in (
            {"mode": "sidecar"},
            {"prometheusRule": {"alerts": {"accuracyLow": {"threshold": 1.5}}}},
            {"model": {"source": "mlflow", "mlflow": {"uri": ""}}},
            {"unknownKey": 1},
        ):
            with pytest.raises(helm.HelmError):
                chart.validate_schema(bad)


def test_many_replicas_with_a_readwriteonce_claim_fail_clearly() -> None:
    with pytest.raises(helm.HelmError, match="ReadWriteOnce"):
        render({"replicaCount": 3})


def test_dashboard_configmap_carries_the_sidecar_label_and_the_shipped_json() -> None:
    docs = render({})
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "icos-agent.json").read_text(encoding="utf-8"))
    assert json.loads(cm["data"]["icos-agent.json"]) == shipped


def test_rule_thresholds_come_from_values() -> None:
    docs = render({"prometheusRule": {"enabled": True, "alerts": {"accuracyLow": {"threshold": 0.77, "for": "2m"}}}})
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert "< 0.77" in alerts["IcosEstimatedAccuracyLow"]["expr"]
    assert alerts["IcosEstimatedAccuracyLow"]["for"] == "2m"
    docs = render({"prometheusRule": {"enabled": True, "alerts": {"agentDown": {"enabled": False}}}})
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    names = {r.get("alert") for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "IcosAgentDown" not in names and "IcosEstimatedAccuracyLow" in names


KUSTOMIZE = ROOT / "deploy" / "kubernetes"


@pytest.mark.parametrize("folder", ["base", "components/monitoring"])
def test_plain_manifests_validate(folder: str) -> None:
    root = KUSTOMIZE / folder
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = list(kustomization.get("resources", []))
    listed += [f for g in kustomization.get("configMapGenerator", []) for f in g["files"]]
    assert sorted(listed) == sorted(p.name for p in root.iterdir() if p.name != "kustomization.yaml")
    for name in kustomization.get("resources", []):
        for doc in yaml.safe_load_all((root / name).read_text(encoding="utf-8")):
            if doc["kind"] in CRD_SCHEMAS:
                schema = json.loads(CRD_SCHEMAS[doc["kind"]].read_text(encoding="utf-8"))
                jsonschema.Draft202012Validator(schema).validate(doc)
            else:
                kv.validate(doc, KUBE_VERSION, strict=True)
            assert "helm.sh/chart" not in doc["metadata"].get("labels", {})


def test_plain_servicemonitor_selects_the_plain_service() -> None:
    svc = yaml.safe_load((KUSTOMIZE / "base" / "service.yaml").read_text(encoding="utf-8"))
    sm = yaml.safe_load((KUSTOMIZE / "components" / "monitoring" / "servicemonitor.yaml").read_text(encoding="utf-8"))
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "icos-agent"


def test_audit_trigger_reads_the_admin_token_from_a_file() -> None:
    """The token never sits in a container's arguments or environment (where `ps` or the pod spec shows it)."""
    docs = render({"audits": {"cronjob": {"enabled": True}}})
    job = next(d for d in docs if d["kind"] == "CronJob")
    spec = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    trigger = next(c for c in spec["containers"] if c["name"] == "trigger")
    assert "ICOS_AGENT_ADMIN_TOKEN" not in json.dumps(trigger)
    assert "TOKEN" not in " ".join(trigger["args"])
    assert "-H @/tmp/auth-header" in trigger["args"][0]
    mounts = {m["name"]: m for m in trigger["volumeMounts"]}
    assert mounts["admin-token"]["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == "admin-token")
    assert volume["secret"]["items"] == [{"key": "token", "path": "token"}]


def test_grace_period_covers_the_graceful_timeout_and_the_last_flush() -> None:
    deploy = next(d for d in render({}) if d["kind"] == "Deployment")
    assert deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 20 + 1 + 10
    with pytest.raises(helm.HelmError, match="terminationGracePeriodSeconds 30 is too short"):
        render({"terminationGracePeriodSeconds": 30})
    with pytest.raises(helm.HelmError, match="at least .* = 71"):
        render({"config": {"server": {"graceful_timeout_seconds": 60}}})


def test_network_policy_admits_only_the_namespace_by_default() -> None:
    policy = next(d for d in render({}) if d["kind"] == "NetworkPolicy")
    http_rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "http")
    assert http_rule["from"] == [{"podSelector": {}}]


def test_labels_need_the_labelers_token_from_a_secret_and_the_policy_admits_the_labeling_job() -> None:
    docs = render({})
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "demo-icos-agent-labels")
    assert len(secret["data"]["token"]) > 40  # a random token, base64
    agent = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e for e in agent["spec"]["template"]["spec"]["containers"][0]["env"]}
    ref = env["ICOS_AGENT_LABELS_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "demo-icos-agent-labels", "key": "token"}
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    http_rules = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "http"]
    labeling = {
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/name": "icos-agent-labeling", "app.kubernetes.io/instance": "demo"}
        }
    }
    assert [r["from"] for r in http_rules] == [[{"podSelector": {}}], [labeling]]
    # an existing Secret instead; and no token at all (the endpoints open, as SECURITY.md warns)
    docs = render({"labelsToken": {"existingSecret": "team-labelers"}})
    env = {
        e["name"]: e
        for e in next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["ICOS_AGENT_LABELS_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "team-labelers"
    assert not any(d["kind"] == "Secret" and d["metadata"]["name"].endswith("-labels") for d in docs)
    docs = render({"labelsToken": {"create": False}})
    containers = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "ICOS_AGENT_LABELS_TOKEN" not in {e["name"] for e in containers[0]["env"]}


def test_admin_api_has_its_own_port_reached_only_by_the_audit_job() -> None:
    docs = render({"audits": {"cronjob": {"enabled": True}}})
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and "agent.yaml" in d.get("data", {}))
    config = yaml.safe_load(configmap["data"]["agent.yaml"])
    assert config["server"]["admin_port"] == 9103
    svc = next(d for d in docs if d["kind"] == "Service")
    assert {"name": "admin", "port": 9103, "targetPort": "admin", "protocol": "TCP"} in svc["spec"]["ports"]
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    admin_rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "admin")
    job = next(d for d in docs if d["kind"] == "CronJob")
    job_labels = job["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    assert admin_rule["from"] == [{"podSelector": {"matchLabels": job_labels}}]
    trigger = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert ":9103/v1/audits/" in trigger["args"][0]
    # null puts the admin API back on the http port: no admin port, no admin rule.
    docs = render({"admin": {"port": None}, "audits": {"cronjob": {"enabled": True}}})
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert all(r["ports"][0]["port"] != "admin" for r in policy["spec"]["ingress"])
    job = next(d for d in docs if d["kind"] == "CronJob")
    assert ":8080/v1/audits/" in job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"][0]


def test_fleet_evaluator_is_one_pod_of_its_own_scraped_by_its_own_servicemonitor(tmp_path: Path) -> None:
    assert not any(d["metadata"]["name"].endswith("-fleet") for d in render({}))  # off by default
    docs = render(
        {
            "serviceMonitor": {"enabled": True},
            "fleet": {"enabled": True, "prometheusUrl": "http://thanos-query.monitoring:9090", "selector": 'x="1"'},
            "config": {"windows": {"time": ["10m", "2h"]}},
        }
    )
    byname = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    deploy = byname[("Deployment", "demo-icos-agent-fleet")]
    agent = byname[("Deployment", "demo-icos-agent")]
    assert deploy["spec"]["replicas"] == 1
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["serve", "--config", "/etc/icos-agent/fleet.yaml"]
    # the fleet config passes the agent's own validation and reads this release's replicas only
    cm = byname[("ConfigMap", "demo-icos-agent-fleet")]
    f = tmp_path / "fleet.yaml"
    f.write_text(cm["data"]["fleet.yaml"], encoding="utf-8")
    settings = config.load_settings(f)
    assert settings.mode == "fleet" and settings.fleet.prometheus_url == "http://thanos-query.monitoring:9090"
    assert settings.fleet.selector == 'namespace="ml",service="demo-icos-agent",x="1"'
    assert settings.windows.time == ["10m", "2h"] and settings.model.name == "model"
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    assert any(str(settings.bundle.path).startswith(m) for m in mounted)
    # neither the agents' Service nor their ServiceMonitor selects the evaluator; its own ones do
    fleet_labels = deploy["spec"]["template"]["metadata"]["labels"]
    agent_svc = byname[("Service", "demo-icos-agent")]
    assert not agent_svc["spec"]["selector"].items() <= fleet_labels.items()
    assert agent_svc["spec"]["selector"].items() <= agent["spec"]["template"]["metadata"]["labels"].items()
    fleet_svc = byname[("Service", "demo-icos-agent-fleet")]
    assert fleet_svc["spec"]["selector"].items() <= fleet_labels.items()
    sm = byname[("ServiceMonitor", "demo-icos-agent-fleet")]
    agent_sm = byname[("ServiceMonitor", "demo-icos-agent")]
    assert sm["spec"]["selector"]["matchLabels"].items() <= fleet_svc["metadata"]["labels"].items()
    assert not agent_sm["spec"]["selector"]["matchLabels"].items() <= fleet_svc["metadata"]["labels"].items()
    # job="<prometheusRule.job>-fleet", as IcosFleetEvaluatorStale reads it
    assert fleet_svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "icos-agent-fleet"
    assert sm["spec"]["endpoints"][0]["port"] == "http"


def test_prediction_store_url_comes_from_an_existing_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``predictionStore.existingSecret`` points every replica at a shared PostgreSQL: the URL reaches the
    agent as ``ICOS_AGENT_LABELS__STORE_URL`` from the Secret, never through the ConfigMap; by default
    no such variable (SQLite per pod) and no database is bundled."""

    def agent_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
        deploy = next(d for d in docs if d["kind"] == "Deployment")
        agent = next(c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
        return {e["name"]: e for e in agent["env"]}

    default = render({})
    assert "ICOS_AGENT_LABELS__STORE_URL" not in agent_env(default)
    assert not [d for d in default if d["kind"] in ("StatefulSet",) or "postgres" in json.dumps(d.get("spec", {}))]
    docs = render({"replicaCount": 3, "persistence": {"enabled": False}, "predictionStore": {"existingSecret": "pg"}})
    ref = agent_env(docs)["ICOS_AGENT_LABELS__STORE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "pg", "key": "url"}
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "agent.yaml" in d.get("data", {}))
    assert "store_url" not in cm["data"]["agent.yaml"]
    f = tmp_path / "agent.yaml"
    f.write_text(cm["data"]["agent.yaml"], encoding="utf-8")
    monkeypatch.setenv("ICOS_AGENT_LABELS__STORE_URL", "postgresql://icos:pw@db:5432/icos")
    assert config.load_settings(f).labels.database_url() == "postgresql://icos:pw@db:5432/icos"
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema({"predictionStore": {"existingSecret": "pg", "key": ""}})
    # the fleet evaluator reads the same store (the fleet's with_labels), its URL from the same Secret
    fleet_on = {"fleet": {"enabled": True, "prometheusUrl": "http://prometheus.monitoring:9090"}}
    for store, want in (({}, None), ({"predictionStore": {"existingSecret": "pg"}}, {"name": "pg", "key": "url"})):
        fleet = next(
            d
            for d in render({**fleet_on, **store})
            if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-fleet")
        )
        env = {e["name"]: e for e in fleet["spec"]["template"]["spec"]["containers"][0]["env"]}
        got = env.get("ICOS_AGENT_LABELS__STORE_URL")
        assert (got["valueFrom"]["secretKeyRef"] if got else None) == want
