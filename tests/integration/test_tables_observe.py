"""A bundle fitted from a table of predictions, in a real agent process: observe mode judges
observations (inputs + probabilities) with the bundle's decision threshold; serve mode refuses it."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from agent.cli import main
from agent.data.tables import TableColumns
from agent.offline.tables import check_table_report
from bench.headline.nannyml_style import CAR_FEATURES, Table, car_loan
from invariants.bundle import Bundle
from tests.support.agent_process import AgentProcess
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def car() -> Table:
    return car_loan(n_reference=3000, n_analysis=2000, seed=5)


def fit_bundle(car: Table, directory: Path, *extra: str) -> Path:
    ref = directory / "ref.parquet"
    car.period("reference").to_parquet(ref)
    out = directory / "bundle"
    argv = ["fit", "--reference", str(ref), "--label-column", "repaid", "--proba-columns", "y_pred_proba"]
    assert main([*argv, "--feature-columns", ",".join(CAR_FEATURES), "--trees", "30", "--out", str(out), *extra]) == 0
    return out


def observe_config(bundle: Path, state: Path) -> dict[str, object]:
    return {
        "mode": "observe",
        "state_dir": str(state),
        "model": {"name": "carloan"},
        "bundle": {"path": str(bundle)},
        "windows": {"time": ["5m"], "count": 100000},
    }


def test_observe_mode_judges_table_observations_with_the_threshold(car: Table, tmp_path: Path) -> None:
    bundle = fit_bundle(car, tmp_path, "--decision-threshold", "0.3")
    ana = car.period("analysis").iloc[:400]
    x = ana[list(CAR_FEATURES)].to_numpy(np.float32)
    p1 = ana["y_pred_proba"].to_numpy()
    probs = np.stack([1 - p1, p1], axis=1)
    agent = AgentProcess(tmp_path, observe_config(bundle, tmp_path / "state")).start()
    try:
        with httpx.Client(timeout=30) as c:
            for i in range(0, 400, 100):
                body = {"id": f"b{i}", "inputs": x[i : i + 100].tolist(), "probabilities": probs[i : i + 100].tolist()}
                r = c.post(f"{agent.url}/v1/observe", json=body)
                assert r.status_code == 202, r.text
            assert wait_until(lambda: c.get(f"{agent.url}/v1/estimates").json()["total_judged"] == 400, 30)
            est = c.get(f"{agent.url}/v1/estimates").json()
            # realized accuracy from delayed labels: the labels the agent predicted are thresholded at 0.3
            y = ana["repaid"].to_numpy()
            labels = [{"id": f"b{i - i % 100}:{i % 100}", "label": int(y[i])} for i in range(400)]
            assert c.post(f"{agent.url}/v1/labels", json={"labels": labels}).status_code == 200
            assert wait_until(
                lambda: c.get(f"{agent.url}/v1/estimates").json()["windows"]["5m"].get("realized", {}).get("n") == 400,
                30,
            )
            realized = c.get(f"{agent.url}/v1/estimates").json()["windows"]["5m"]["realized"]
        metrics = agent.metrics()
    finally:
        agent.terminate()
    assert est["headline"] == est["headline_evidence"]["chosen"] and est["model"]["sha256"] == ""
    assert {"cbpe", "doc"} <= set(est["headline_evidence"]["errors"])
    window = est["windows"]["5m"]
    assert window["n"] == 400 and "shift_aware" not in window["estimates"]
    thresholded = (p1 >= 0.3).astype(int)
    assert not np.array_equal(thresholded, (p1 >= 0.5).astype(int))  # the threshold matters for these rows
    class1 = sum(v for k, v in metrics.items() if k.startswith("icos_predicted_class_total{class=1,"))
    assert class1 == int(thresholded.sum())
    assert realized["accuracy"]["value"] == pytest.approx(float((thresholded == y).mean()))
    # the same verdicts as `check` on the same rows
    observed = tmp_path / "observed.parquet"
    ana.to_parquet(observed)
    offline = check_table_report(Bundle.load(bundle), observed, TableColumns(("y_pred_proba",), CAR_FEATURES))
    assert window["fails_by_family"] == {k.split(":")[1]: v for k, v in offline["verdicts"].items() if ":" in k}


def test_serve_mode_refuses_a_table_bundle(car: Table, tmp_path: Path) -> None:
    bundle = fit_bundle(car, tmp_path)
    cfg = observe_config(bundle, tmp_path / "state")
    cfg["mode"] = "serve"
    cfg["model"] = {"name": "carloan", "path": str(ROOT / "agent" / "shipped_models" / "digits_cnn.onnx")}
    agent = AgentProcess(tmp_path, cfg)
    with pytest.raises(RuntimeError, match="did not start"):
        agent.start(timeout=30)
    assert "fitted from a table of predictions" in agent.log() and "observe" in agent.log()
