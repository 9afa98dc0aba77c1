"""The shipped Grafana dashboard type-checks against ``@grafana/schema`` (TypeScript, strict, excess
properties rejected): the whole dashboard as ``Dashboard``, and each panel's options and queries
against its panel plugin's types. ``make grafana-typecheck`` fills ``deploy/grafana/typecheck/node_modules``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.requirements import require

ROOT = Path(__file__).resolve().parents[2]
TYPECHECK = ROOT / "deploy" / "grafana" / "typecheck"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "icos-agent.json"
PANEL_TYPES = {"timeseries": "TimeSeriesPanel", "stat": "StatPanel", "row": "Row"}


@pytest.fixture(scope="module")
def tsc() -> Path:
    """TypeScript from ``deploy/grafana/typecheck/node_modules`` (``make grafana-typecheck`` runs npm ci there)."""
    path: Path = require("grafana-typecheck")
    return path


def _check_source(dashboard: dict[str, object]) -> str:
    lines = [
        "import type { ShippedDashboard, TimeSeriesPanel, StatPanel, Row } from '../types';",
        f"export const dashboard: ShippedDashboard = {json.dumps(dashboard, indent=2)};",
    ]
    for panel in dashboard["panels"]:  # type: ignore[attr-defined]
        kind = PANEL_TYPES[panel["type"]]
        lines.append(f"export const panel{panel['id']}: {kind} = {json.dumps(panel, indent=2)};")
    return "\n".join(lines) + "\n"


def _typecheck(tsc: Path, dashboard: dict[str, object]) -> subprocess.CompletedProcess[str]:
    build = TYPECHECK / "build"
    build.mkdir(exist_ok=True)
    (build / "dashboard.check.ts").write_text(_check_source(dashboard), encoding="utf-8")
    return subprocess.run(
        ["node", str(tsc), "-p", "tsconfig.json"],
        cwd=TYPECHECK,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_every_panel_type_is_checked() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert {p["type"] for p in dashboard["panels"]} <= set(PANEL_TYPES)
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert {"namespace", "model", "version"} <= set(names)


def test_dashboard_typechecks(tsc: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    res = _typecheck(tsc, dashboard)
    assert res.returncode == 0, res.stdout + res.stderr
    # The check has teeth: a misspelt field and a wrong enum value are both rejected.
    broken = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    broken["panels"][1]["options"]["colorMode"] = "rainbow"
    broken["panels"][2]["gridPos"]["width"] = 3
    res = _typecheck(tsc, broken)
    assert res.returncode != 0
    assert "rainbow" in res.stdout and "width" in res.stdout, res.stdout
    res = _typecheck(tsc, dashboard)
    assert res.returncode == 0
