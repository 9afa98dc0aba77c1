"""Where the drop is, end to end: a real table model (the zoo's scikit-learn pipeline over numeric and
categorical columns) fitted with ``icos-agent fit``, a new subpopulation (a category never seen at fit), and
``icos-agent check`` ranking it first, in ``--json`` and in words, its true accuracy beside; the same model served,
a column broken inside one category found in its live windows; a reference table fitted with ``fit --reference``
and checked with a fault in one of its categories, the same."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry

from agent.cli import main
from agent.config.settings import load_settings
from agent.server.app import create_app
from bench.zoo import Split, ZooModel, build
from tests.support.inprocess import RunningServer
from tests.support.v2 import send_table
from tests.support.waiting import wait_until

NEW = "city unseen at fit"


def _frame(split: Split) -> pd.DataFrame:
    frame = pd.DataFrame({k: v[:, 0] for k, v in split.inputs.items()})
    frame["y"] = split.y
    return frame


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[ZooModel, Path, Path]:
    """The zoo's table model, its bundle fitted by the command line, and where its files are."""
    root = tmp_path_factory.mktemp("segments-check")
    zoo = build("tabular_categorical", root / "zoo", seed=0)
    for part in ("train", "val"):
        _frame(getattr(zoo, part)).to_parquet(root / f"{part}.parquet")
    argv = ["fit", "--model", str(zoo.path), "--train", str(root / "train.parquet"), "--val", str(root / "val.parquet")]
    argv += ["--label-column", "y", "--trees", "20", "--shift-sets", "24", "--out", str(root / "bundle")]
    assert main(argv) == 0
    return zoo, root, root / "bundle"


def _check(zoo: ZooModel, bundle: Path, data: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    capsys.readouterr()
    argv = ["check", "--model", str(zoo.path), "--bundle", str(bundle), "--data", str(data), "--label-column", "y"]
    assert main([*argv, *flags]) == 0
    return capsys.readouterr().out


def test_check_ranks_a_new_subpopulation_first_and_the_labels_confirm_it(
    fitted: tuple[ZooModel, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    zoo, root, bundle = fitted
    test = _frame(zoo.test)
    rng = np.random.default_rng(0)
    new = rng.uniform(size=len(test)) < 0.2  # a fifth of the traffic now comes from cities never seen at fit
    test.loc[new, "city"] = [f"new_city_{i % 7}" for i in range(int(new.sum()))]
    test.to_parquet(root / "new.parquet")
    report: dict[str, Any] = json.loads(_check(zoo, bundle, root / "new.parquet", capsys, "--json"))
    segments = report["segments"]
    top = segments[0]
    assert top["name"] == NEW and top["kind"] == "column" and top["dimension"] == "city", segments[:3]
    changed = [s["change"]["changed"] for s in segments]
    assert changed == sorted(changed, reverse=True)  # segments whose inputs changed first
    unchanged = [s["contribution"] for s in segments if not s["change"]["changed"]]
    assert unchanged == sorted(unchanged, reverse=True)  # then the others by contribution
    assert top["change"]["changed"] and top["change"]["columns"][0]["kind"] == "share"  # unseen at fit
    assert top["contribution"] > 0.01
    assert top["share"] == pytest.approx(float(new.mean()), abs=1e-9) and top["reference_share"] == 0
    # the truth confirms it: the new population lost accuracy, and the segment's estimate says so
    assert top["truth_accuracy"] < top["reference_accuracy"] - 0.1
    assert top["estimate"]["value"] < top["reference_accuracy"] - 0.05
    assert set(top) >= {"share", "reference_share", "estimate", "reference_accuracy", "contribution", "truth_accuracy"}
    assert report["segment_drop"]["dimensions"]["city"]["within"] > 0
    words = _check(zoo, bundle, root / "new.parquet", capsys)
    where = words.split("where the drop is")[1].splitlines()
    assert where[1].strip().startswith(f"{NEW}:") and "true " in where[1]
    assert "realized" not in top  # no label drawn


def test_check_with_labels_gives_every_segment_its_realized_accuracy(
    fitted: tuple[ZooModel, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--labels N``: every segment with a drawn label shows the realized accuracy of those labels and its
    interval; a dimension's segments share out the N labels."""
    zoo, root, bundle = fitted
    test = _frame(zoo.test)
    new = np.random.default_rng(1).uniform(size=len(test)) < 0.2
    test.loc[new, "city"] = [f"new_city_{i % 7}" for i in range(int(new.sum()))]
    test.to_parquet(root / "new-labels.parquet")
    report: dict[str, Any] = json.loads(
        _check(zoo, bundle, root / "new-labels.parquet", capsys, "--json", "--labels", "300")
    )
    city = [s for s in report["segments"] if s["dimension"] == "city"]
    assert sum(s["realized"]["n"] for s in city if "realized" in s) == 300
    for s in report["segments"]:
        if "realized" in s:
            z = s["realized"]
            assert 0 <= z["lower"] <= z["value"] <= z["upper"] <= 1 and z["n"] >= 1
    top = next(s for s in city if s["name"] == NEW)
    assert top["realized"]["upper"] < top["reference_accuracy"]  # the drawn labels alone show the drop
    words = _check(zoo, bundle, root / "new-labels.parquet", capsys, "--labels", "300")
    assert "labels drawn:" in words.split("where the drop is")[1]


def _clean(zoo: ZooModel, root: Path) -> Path:
    """The test split as a file, written by whichever test needs it first (the tests of this module may run
    on different workers, each with its own ``root``)."""
    path = root / "clean.parquet"
    if not path.exists():
        _frame(zoo.test).to_parquet(path)
    return path


def test_a_clean_batch_names_no_segment(
    fitted: tuple[ZooModel, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    zoo, root, bundle = fitted
    report = json.loads(_check(zoo, bundle, _clean(zoo, root), capsys, "--json"))
    largest = max(s["contribution"] for s in report["segments"])
    assert largest <= 0.02
    assert not any(s["change"]["changed"] for s in report["segments"]), report["segments"][:3]
    assert {s["status"] for s in report["segments"]} <= {"ok", "dropping"}
    assert report["segment_drop"]["widespread"] is False
    words = _check(zoo, bundle, _clean(zoo, root), capsys)
    quiet = "where the drop is: no segment's inputs changed and none lost accuracy beyond noise"
    assert (quiet in words) == (largest <= 0), words


def test_a_column_broken_inside_one_category_is_found_without_labels(
    fitted: tuple[ZooModel, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The case no label-free estimate sees: ``income`` read as 0 upstream for one city only. The model stays
    confident, so the segment's estimate does not move; its inputs did, and ``check`` ranks that city first,
    names the column, says the cost is unknown without labels, and the truth confirms the drop."""
    zoo, root, bundle = fitted
    test = _frame(zoo.test)
    city = test["city"].value_counts().index[1]  # a frequent city, not the most frequent one
    test.loc[test["city"] == city, "income"] = 0.0
    test.to_parquet(root / "broken.parquet")
    report: dict[str, Any] = json.loads(_check(zoo, bundle, root / "broken.parquet", capsys, "--json"))
    top = report["segments"][0]
    assert top["name"] == f"city={city}", [(s["name"], s["change"]) for s in report["segments"][:3]]
    assert top["change"]["changed"] and top["change"]["columns"][0]["column"] == "income"
    assert top["change"]["columns"][0]["spread"] < 0.1  # every value the same: its spread collapsed
    assert report["segment_drop"]["widespread"] is False  # the other cities isolate it
    assert top["status"] in ("changed_cost_unknown", "dropping")
    assert top["truth_accuracy"] < top["reference_accuracy"] - 0.1  # the truth: it did drop
    if top["status"] == "changed_cost_unknown":
        assert top.get("estimable") is False and "income" in top["why"]
    words = _check(zoo, bundle, root / "broken.parquet", capsys)
    where = words.split("where the drop is")[1].splitlines()
    assert where[1].strip().startswith(f"city={city}:") and "inputs changed (income" in where[1], where[:3]
    with_labels = json.loads(_check(zoo, bundle, root / "broken.parquet", capsys, "--json", "--labels", "200"))
    realized = next(s for s in with_labels["segments"] if s["name"] == f"city={city}")
    assert realized["status"] in ("changed", "dropping") and "realized" in realized


def test_a_served_model_finds_a_column_broken_inside_one_category_in_its_live_windows(
    fitted: tuple[ZooModel, Path, Path], tmp_path: Path, run_server: Callable[..., RunningServer]
) -> None:
    """The case above on live traffic: the table model served, ``income`` read as 0 for one city only, sent as
    V2 requests. The time window and the count window both rank that city first and name ``income`` (the served
    windows sum the change columns per segment as ``check`` does), and ``/metrics`` exports the change with the
    column's name."""
    zoo, _, bundle = fitted
    city = pd.Series(zoo.test.inputs["city"][:, 0]).value_counts().index[1]
    inputs = {k: v.copy() for k, v in zoo.test.inputs.items()}
    inputs["income"][inputs["city"][:, 0] == city] = 0.0
    rows = len(zoo.test.y)
    settings = load_settings(
        None,
        mode="serve",
        model={"name": "tables", "path": str(zoo.path)},
        bundle={"path": str(bundle)},
        state_dir=str(tmp_path / "state"),
        windows={"time": ["5m"], "count": rows},
        labels={"sample_rate": 0.0},
    )
    srv = run_server(create_app(settings, CollectorRegistry()))
    types = {spec.name: spec.v2_datatype for spec in zoo.inputs}
    send_table(srv.url, "tables", inputs, types)
    with httpx.Client(timeout=60) as client:
        assert wait_until(lambda: client.get(f"{srv.url}/v1/estimates").json()["total_judged"] == rows, 30)
        windows = client.get(f"{srv.url}/v1/estimates").json()["windows"]
        metrics = client.get(f"{srv.url}/metrics").text
    for name in ("5m", f"last{rows}"):
        top = windows[name]["segments"][0]
        assert top["name"] == f"city={city}", (name, [(s["name"], s["change"]) for s in windows[name]["segments"][:3]])
        assert top["change"]["changed"] and top["change"]["columns"][0]["column"] == "income", (name, top["change"])
    timed, counted = (windows[name]["segments"][0]["change"]["columns"] for name in ("5m", f"last{rows}"))
    assert [c["column"] for c in timed] == [c["column"] for c in counted]  # the same rows, the same test
    assert [c["distance"] for c in timed] == pytest.approx([c["distance"] for c in counted], rel=1e-4)
    score = f'icos_segment_change_score{{column="income",kind="column",model="tables",segment="city={city}"'
    assert score in metrics, [line for line in metrics.splitlines() if line.startswith("icos_segment_change_score")]


def test_a_column_broken_in_every_row_is_a_change_across_the_traffic(
    fitted: tuple[ZooModel, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``income`` read in another unit for every row: every cut of the traffic changed, so ``check`` says the drop
    is across the traffic, in no one segment, instead of offering its first segment as where the drop is."""
    zoo, root, bundle = fitted
    test = _frame(zoo.test)
    test["income"] = test["income"] * 100.0
    test.to_parquet(root / "every-row.parquet")
    report: dict[str, Any] = json.loads(_check(zoo, bundle, root / "every-row.parquet", capsys, "--json"))
    drop = report["segment_drop"]
    shares = {d: v["changed_share"] for d, v in drop["dimensions"].items()}
    assert drop["widespread"] is True and min(shares.values()) >= 0.5, shares
    words = _check(zoo, bundle, root / "every-row.parquet", capsys)
    assert "where the drop is: across the traffic, in no one segment" in words, words


def test_a_categorical_column_broken_inside_one_category_is_a_change_not_an_estimate(
    fitted: tuple[ZooModel, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``plan`` read as a value never seen at fit, for one city only: no sketched (numeric) column of that city
    moved, but its inputs are novel to the input PCA, so the city is changed (``novel inputs``) and its
    label-free estimate, which the learnt estimator's drop moved, is marked not estimable instead of being
    offered as its accuracy."""
    zoo, root, bundle = fitted
    test = _frame(zoo.test)
    city = test["city"].value_counts().index[1]
    test.loc[test["city"] == city, "plan"] = "plan_never_seen"
    test.to_parquet(root / "broken-plan.parquet")
    report: dict[str, Any] = json.loads(_check(zoo, bundle, root / "broken-plan.parquet", capsys, "--json"))
    row = next(s for s in report["segments"] if s["name"] == f"city={city}")
    assert row["change"]["changed"] and "novel inputs" in [c["column"] for c in row["change"]["columns"]], row
    assert row["estimable"] is False and "novel inputs" in row["why"]
    assert row["status"] in ("dropping", "changed_cost_unknown")
    clean = json.loads(_check(zoo, bundle, _clean(zoo, root), capsys, "--json"))
    assert not any(s["change"]["changed"] for s in clean["segments"])


def test_a_reference_table_gets_segments_of_its_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(4)

    def table(n: int, broken_region: int | None) -> pd.DataFrame:
        region = rng.integers(0, 4, n)
        x = rng.normal(size=(n, 2))
        logit = 2.5 * x[:, 0] - 1.5 * x[:, 1] + 0.5 * region
        p1 = 1 / (1 + np.exp(-logit))
        y = (rng.uniform(size=n) < p1).astype(int)
        if broken_region is not None:  # the model's answers for one region became noise
            hit = region == broken_region
            p1 = np.where(hit, rng.uniform(0.3, 0.7, n), p1)
        return pd.DataFrame({"x0": x[:, 0], "x1": x[:, 1], "region": region, "p1": p1, "y": y})

    table(4000, None).to_csv(tmp_path / "ref.csv", index=False)
    table(3000, 2).to_csv(tmp_path / "prod.csv", index=False)
    fit = ["fit", "--reference", str(tmp_path / "ref.csv"), "--label-column", "y", "--proba-columns", "p1"]
    assert main([*fit, "--trees", "10", "--out", str(tmp_path / "bundle")]) == 0
    capsys.readouterr()
    check = ["check", "--bundle", str(tmp_path / "bundle"), "--data", str(tmp_path / "prod.csv")]
    assert main([*check, "--label-column", "y", "--json", "--chunk-size", "1500"]) == 0
    report = json.loads(capsys.readouterr().out)
    top = report["segments"][0]
    assert top["name"] == "region=2.0" and top["kind"] == "column", report["segments"][:3]
    assert top["truth_accuracy"] < top["reference_accuracy"] - 0.1
    assert all(chunk["segments"][0]["name"] == "region=2.0" for chunk in report["chunks"])
    names = {s["name"] for s in report["segments"]}
    assert {"predicted=0", "predicted=1", "region=0.0"} <= names and any(n.startswith("x0 < ") for n in names)
