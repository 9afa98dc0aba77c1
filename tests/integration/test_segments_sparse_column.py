"""A column that is mostly zero, zeroed upstream inside one category, on a real model: a scikit-learn pipeline
(StandardScaler, OneHotEncoder, logistic regression) exported with skl2onnx, fitted with ``icos-agent fit`` and read by
``icos-agent check``. The few non-zero values were the column's whole spread, so its moments barely move; its share at
0 does, and ``check`` names the category and the column's point (``balance at 0``), without labels; served, the live
windows name it the same, and ``/metrics`` exports it."""

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
from tests.support.inprocess import RunningServer
from tests.support.v2 import send_table
from tests.support.waiting import wait_until

REGIONS = ("north", "south", "east", "west", "centre")


def _rows(n: int, rng: np.random.Generator) -> pd.DataFrame:
    """Customers: ``balance`` is 0 but for a sixth of them, and a positive balance makes ``y`` = 1 far likelier."""
    region = np.array(REGIONS, dtype=object)[rng.choice(len(REGIONS), n, p=[0.3, 0.25, 0.2, 0.15, 0.1])]
    age = rng.normal(40, 12, n).round(1)
    visits = rng.poisson(3, n).astype(np.int64)
    balance = ((rng.random(n) < 0.17) * np.round(rng.exponential(400.0, n) + 50.0, 2)).astype(np.float32)
    score = 4.0 * (balance > 0) + 0.05 * (age - 40) + 0.2 * (visits - 3) - 1.0 + rng.logistic(0, 0.5, n)
    frame = pd.DataFrame({"region": region, "age": age, "visits": visits, "balance": balance})
    frame["y"] = (score > 0).astype(np.int64)
    return frame


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The model, its bundle fitted by the command line, and the directory of the data."""
    from skl2onnx import to_onnx
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    root = tmp_path_factory.mktemp("sparse-column")
    rng = np.random.default_rng(0)
    train, val = _rows(4000, rng), _rows(2000, rng)
    x = train.drop(columns="y")
    pre = ColumnTransformer(
        [
            ("numeric", StandardScaler(), ["age", "visits", "balance"]),
            ("categorical", OneHotEncoder(handle_unknown="ignore"), ["region"]),
        ]
    )
    pipe = Pipeline([("pre", pre), ("clf", LogisticRegression(max_iter=1000))]).fit(x, train["y"])
    model = root / "model.onnx"
    onnx = to_onnx(pipe, x[:1], options={LogisticRegression: {"zipmap": False}})
    model.write_bytes(onnx.SerializeToString())
    train.to_parquet(root / "train.parquet")
    val.to_parquet(root / "val.parquet")
    argv = ["fit", "--model", str(model), "--train", str(root / "train.parquet"), "--val", str(root / "val.parquet")]
    argv += ["--label-column", "y", "--trees", "20", "--shift-sets", "24", "--out", str(root / "bundle")]
    assert main(argv) == 0
    return model, root / "bundle", root


def _check(fitted: tuple[Path, Path, Path], data: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    model, bundle, _ = fitted
    capsys.readouterr()
    argv = ["check", "--model", str(model), "--bundle", str(bundle), "--data", str(data), "--label-column", "y"]
    assert main([*argv, *flags]) == 0
    return capsys.readouterr().out


def test_a_mostly_zero_column_zeroed_inside_one_category_is_found_by_its_share_at_zero(
    fitted: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = fitted[2]
    test = _rows(3000, np.random.default_rng(1))
    test.to_parquet(root / "clean.parquet")
    clean: dict[str, Any] = json.loads(_check(fitted, root / "clean.parquet", capsys, "--json"))
    assert not any(s["change"]["changed"] for s in clean["segments"]), [s["change"] for s in clean["segments"]]

    test.loc[test["region"] == "south", "balance"] = 0.0
    test.to_parquet(root / "broken.parquet")
    report: dict[str, Any] = json.loads(_check(fitted, root / "broken.parquet", capsys, "--json"))
    top = report["segments"][0]
    assert top["name"] == "region=south", [(s["name"], s["change"]) for s in report["segments"][:3]]
    column = top["change"]["columns"][0]
    assert (column["column"], column["kind"]) == ("balance at 0", "point"), top["change"]
    assert 0.1 < column["shift"] < 0.25  # its share at 0 rose from about 0.83 to 1
    # the moments alone: a third of a deviation, under the threshold a column's change must reach
    assert all(c["column"] != "balance" for c in top["change"]["columns"]), top["change"]
    assert top["truth_accuracy"] < top["reference_accuracy"] - 0.08  # the truth: it did drop
    words = _check(fitted, root / "broken.parquet", capsys)
    where = words.split("where the drop is")[1].splitlines()
    assert where[1].strip().startswith("region=south:") and "inputs changed (balance at 0: share +0." in where[1], where


def test_a_mostly_zero_column_scaled_inside_one_category_is_found_by_its_other_values(
    fitted: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A unit changed upstream for one region: its share at 0 stays, its other values are three times as large."""
    root = fitted[2]
    test = _rows(3000, np.random.default_rng(3))
    test.loc[test["region"] == "east", "balance"] *= 3.0
    test.to_parquet(root / "scaled.parquet")
    report: dict[str, Any] = json.loads(_check(fitted, root / "scaled.parquet", capsys, "--json"))
    top = report["segments"][0]
    assert top["name"] == "region=east", [(s["name"], s["change"]) for s in report["segments"][:3]]
    column = top["change"]["columns"][0]
    assert (column["column"], column["kind"]) == ("balance other than 0", "column"), top["change"]
    # in the other values' deviations at reference (the largest ones clipped at 6 of the whole column's)
    assert column["shift"] > 1.0 and column["spread"] > 1.2, column


#: The model's inputs as V2 tensors: skl2onnx types each column of the frame as its dtype.
DATATYPES = {"region": "BYTES", "age": "FP64", "visits": "INT64", "balance": "FP32"}


def test_a_served_model_names_the_point_column_in_its_live_windows(
    fitted: tuple[Path, Path, Path], tmp_path: Path, run_server: Callable[..., RunningServer]
) -> None:
    """The same fault on live traffic, sent as V2 requests: the served view is float32, the count window keeps each
    prediction's point column beside its other change columns, and both windows read the same test as ``check``."""
    model, bundle, _ = fitted
    test = _rows(2000, np.random.default_rng(2))
    test.loc[test["region"] == "south", "balance"] = 0.0
    rows = len(test)
    settings = load_settings(
        None,
        mode="serve",
        model={"name": "accounts", "path": str(model)},
        bundle={"path": str(bundle)},
        state_dir=str(tmp_path / "state"),
        windows={"time": ["5m"], "count": rows},
        labels={"sample_rate": 0.0},
    )
    srv = run_server(create_app(settings, CollectorRegistry()))
    send_table(srv.url, "accounts", {name: test[name].to_numpy() for name in DATATYPES}, DATATYPES)
    with httpx.Client(timeout=60) as client:
        assert wait_until(lambda: client.get(f"{srv.url}/v1/estimates").json()["total_judged"] == rows, 30)
        windows = client.get(f"{srv.url}/v1/estimates").json()["windows"]
        metrics = client.get(f"{srv.url}/metrics").text
    for name in ("5m", f"last{rows}"):
        top = windows[name]["segments"][0]
        assert top["name"] == "region=south", (name, [(s["name"], s["change"]) for s in windows[name]["segments"][:3]])
        column = top["change"]["columns"][0]
        assert (column["column"], column["kind"]) == ("balance at 0", "point"), (name, top["change"])
    timed, counted = (windows[name]["segments"][0]["change"]["columns"] for name in ("5m", f"last{rows}"))
    assert [c["distance"] for c in timed] == pytest.approx([c["distance"] for c in counted], rel=1e-4)
    score = 'icos_segment_change_score{column="balance at 0",kind="column",model="accounts",segment="region=south"'
    assert score in metrics, [line for line in metrics.splitlines() if line.startswith("icos_segment_change_score")]
