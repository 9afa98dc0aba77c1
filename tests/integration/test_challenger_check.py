"""``icos-agent check --challenger``: two versions compared offline through the command line, for ONNX models
(the shipped CNN and its retrained version on rotated digits) and for tables of predictions (two probability
column sets of one table), against the truth the data's labels give."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from agent.cli import main
from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from invariants.bundle import Bundle
from tests.support.challenger import CHALLENGER_MODEL, drifted


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["check", *argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return out


def test_check_compares_two_onnx_versions_label_free_and_with_labels(
    mnist_bundle_dir: Path,
    challenger_bundle_dir: Path,
    mnist_splits: Splits,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "rotated.npz"
    np.savez(data, x=drifted(mnist_splits.test.x), y=mnist_splits.test.y)
    pair = ["--model", str(default_model_path()), "--bundle", str(mnist_bundle_dir), "--data", str(data)]
    pair += ["--challenger", str(CHALLENGER_MODEL), "--challenger-bundle", str(challenger_bundle_dir)]
    report = _check(capsys, *pair)
    section = report["challenger"]
    truth = section["truth"]
    assert truth["champion"] == pytest.approx(report["truth"]["accuracy"])
    assert truth["difference"] == pytest.approx(truth["challenger"] - truth["champion"])
    free = section["difference"]
    assert free["estimator"] == "label_free" and set(section["differences"]) == {"label_free"}
    assert free["lower"] <= truth["difference"] <= free["upper"]
    assert section["n"] == 1000 and 0 < section["disagreements"] < 1000
    assert section["champion"]["estimator"] == report["headline"]
    assert section["model"]["sha256"] == Bundle.load(challenger_bundle_dir).model_sha256

    labeled = _check(capsys, *pair, "--labels", "60", "--seed", "4")["challenger"]
    best = labeled["difference"]
    assert best["estimator"] == "with_labels" and best["n_labels"] == min(60, section["disagreements"])
    assert best["seed"] == 4
    assert best["lower"] <= truth["difference"] <= best["upper"]
    assert best["upper"] - best["lower"] < free["upper"] - free["lower"]

    assert main(["check", *pair]) == 0
    text = capsys.readouterr().out
    assert "challenger: agrees with the model on" in text and "(label_free)" in text


def test_check_refuses_a_challenger_bundle_without_the_pair(
    mnist_bundle_dir: Path, mnist_splits: Splits, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "test.npz"
    np.savez(data, x=mnist_splits.test.x[:50], y=mnist_splits.test.y[:50])
    argv = ["check", "--model", str(default_model_path()), "--bundle", str(mnist_bundle_dir), "--data", str(data)]
    argv += ["--challenger", str(default_model_path()), "--challenger-bundle", str(mnist_bundle_dir)]
    assert main(argv) == 2
    assert "holds no comparison with a champion" in capsys.readouterr().err
    assert main(argv[:-2]) == 2
    assert "--challenger needs --challenger-bundle" in capsys.readouterr().err


def _table(rng: np.random.Generator, n: int, shift: float) -> pd.DataFrame:
    """Three features, a binary label, a champion (columns a0, a1) that ignores the third feature and a
    challenger (b0, b1) that reads it; ``shift`` moves the features."""
    x = rng.normal(size=(n, 3)) + shift
    logit = x @ np.array([1.0, -1.0, 1.5])
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(int)
    pa = 1 / (1 + np.exp(-(x[:, :2] @ np.array([1.0, -1.0]))))
    pb = 1 / (1 + np.exp(-logit))
    return pd.DataFrame(
        {"f0": x[:, 0], "f1": x[:, 1], "f2": x[:, 2], "a0": 1 - pa, "a1": pa, "b0": 1 - pb, "b1": pb, "y": y}
    )


def test_check_compares_two_tables_of_predictions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(8)
    _table(rng, 3000, 0.0).to_csv(tmp_path / "ref.csv", index=False)
    _table(rng, 2000, 0.5).to_csv(tmp_path / "prod.csv", index=False)
    common = ["--reference", str(tmp_path / "ref.csv"), "--label-column", "y", "--trees", "10", "--json"]
    assert (
        main(
            ["fit", *common, "--proba-columns", "a0,a1", "--feature-columns", "f0,f1,f2", "--out", str(tmp_path / "A")]
        )
        == 0
    )
    # the challenger's features default to every numeric column but the two probability sets and the label
    assert (
        main(
            [
                "fit",
                *common,
                "--proba-columns",
                "b0,b1",
                "--champion-proba-columns",
                "a0,a1",
                "--out",
                str(tmp_path / "B"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    challenger = Bundle.load(tmp_path / "B")
    assert challenger.table is not None and list(challenger.table.feature_columns) == ["f0", "f1", "f2"]
    assert challenger.pair is not None and challenger.pair["corrupted_sets"] == 0
    argv = ["--bundle", str(tmp_path / "A"), "--data", str(tmp_path / "prod.csv"), "--label-column", "y"]
    argv += ["--challenger-bundle", str(tmp_path / "B"), "--labels", "100"]
    section = _check(capsys, *argv)["challenger"]
    truth = section["truth"]["difference"]
    assert truth > 0  # the challenger reads the feature the champion ignores
    assert "unreliable" in section["differences"]["label_free"]  # calibrated on clean rows only
    best = section["difference"]
    assert best["estimator"] == "with_labels" and "unreliable" not in best
    assert best["lower"] <= truth <= best["upper"]
    assert section["model"]["proba_columns"] == ["b0", "b1"]
