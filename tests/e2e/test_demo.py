"""End-to-end: ``icos-agent demo --quick`` runs the whole story with a real agent subprocess and
leaves a report and MLflow runs behind."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.support.demo import DEMO_TIMEOUT_SECONDS

#: The first test here runs the demo (a few minutes on two loaded cores; bounded by its own timeout).
pytestmark = pytest.mark.timeout(DEMO_TIMEOUT_SECONDS + 300)

PHASES = ["in distribution", "label shift", "translation", "noise", "recovery"]
AUDITS = ("dscore", "mutation", "metamorphic")


@pytest.fixture(scope="module")
def demo(demo_run: Any) -> Any:
    assert demo_run.returncode == 0, f"demo failed:\n{demo_run.stdout[-3000:]}\n{demo_run.stderr[-3000:]}"
    return demo_run


def test_story_is_told_in_plain_lines(demo: Any) -> None:
    out = demo.stdout
    assert "\x1b[" not in out  # --no-live: no escape codes
    for i, name in enumerate(PHASES):
        assert re.search(rf"^\[{i + 1}/5\] {name}: 250 predictions", out, re.M), name
    assert len(re.findall(r"^      where the drop is: ", out, re.M)) == len(PHASES)
    for kind in AUDITS:
        assert re.search(rf"^  {kind}: ", out, re.M), kind
    assert "report" in out and "index.html" in out
    assert "mlflow ui --backend-store-uri sqlite:///" in out


def test_report_files(demo: Any) -> None:
    r = demo.report_dir
    html = (r / "index.html").read_text(encoding="utf-8")
    pngs = re.findall(r'<img src="([^"]+)"', html)
    assert set(pngs) == {
        "estimates_vs_truth.png",
        "verdict_mix.png",
        "dscore_heatmaps.png",
        "mutation.png",
        "metamorphic.png",
    }
    for name in pngs:
        data = (r / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000, name
    assert "/" not in "".join(pngs)  # relative paths next to index.html
    assert (r / "metrics.txt").read_text().count("icos_predictions_total") >= 1


def test_recorded_numbers_are_consistent(demo: Any) -> None:
    rec = json.loads((demo.report_dir / "demo.json").read_text(encoding="utf-8"))
    assert rec["window"] == "last250"
    assert [p["name"] for p in rec["phases"]] == PHASES
    headline = rec["headline"]
    assert rec["estimators"][0] == headline
    for p in rec["phases"]:
        assert p["sent"] == 250
        assert sum(p["verdicts"].values()) == 250
        # at the end of a phase the count window holds exactly that phase's predictions
        assert p["window_n"] == 250
        assert set(rec["estimators"]) <= set(p["estimates"])
        e = p["estimates"][headline]
        assert 0.0 <= e["lower"] <= e["value"] <= e["upper"] <= 1.0
        if p["realized"] is not None:  # delayed labels: the agent's realized accuracy is the truth
            assert p["realized"] == pytest.approx(p["truth"], abs=1e-9)
    by = {p["key"]: p for p in rec["phases"]}
    # translation breaks the CNN: the truth drops and the oracle fails more predictions
    assert by["translation"]["truth"] < by["in_distribution"]["truth"] - 0.1
    share = lambda p: p["verdicts"].get("pass", 0) / p["sent"]  # noqa: E731
    assert share(by["translation"]) < share(by["in_distribution"])
    # where the drop is: a segment of the translated digits lost accuracy beyond noise, and the labels posted
    # with every prediction say what it really lost
    drop = by["translation"]["drop"]
    assert drop is not None and drop["contribution"] > 0 and drop["name"]
    assert drop["estimate"] < drop["reference_accuracy"]
    if drop["realized"] is not None:
        assert drop["realized"] < drop["reference_accuracy"]
    for kind in AUDITS:
        assert rec["audits"][kind]["status"] == "success"
    assert len(rec["trace"]) >= 5


def test_mlflow_store_holds_fit_audits_and_snapshots(demo: Any) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{demo.state_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("icos-agent")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    by_kind: dict[str, list[object]] = {}
    for run in runs:
        by_kind.setdefault(run.data.tags.get("icos.kind", ""), []).append(run)
    fit = by_kind["fit"][0]
    assert fit.data.metrics["val_accuracy"] > 0.9
    assert 0 < fit.data.metrics["calibration_tpr"] <= 1
    assert fit.data.tags["icos.model.sha256"]
    assert "dscore" in by_kind and "mutation" in by_kind and "metamorphic" in by_kind
    dscore = by_kind["dscore"][0]
    assert {"dscore", "fitness", "robustness"} <= set(dscore.data.metrics)
    assert dscore.data.tags["icos.audit.status"] == "success"
    assert "all_mae_change_pct_mean" in by_kind["mutation"][0].data.metrics
    assert "overall_violation_rate" in by_kind["metamorphic"][0].data.metrics
    snap = by_kind["estimates"][0]
    assert "truth" in snap.data.metrics
    history = client.get_metric_history(snap.info.run_id, "truth")
    assert len(history) == 5  # one snapshot per phase
    for run in runs:
        assert run.info.status == "FINISHED"
