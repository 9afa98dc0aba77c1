"""``icos-agent audit ...`` on the shipped MNIST CNN with a small MNIST-5k sample: every audit kind,
the ``--json`` shape (D-Score's n² lists), the human summary, retrain mode, one-line user errors."""

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

MODEL = str(default_model_path())


@pytest.fixture(scope="module")
def data_npz(tmp_path_factory: pytest.TempPathFactory, mnist_splits: Splits) -> Path:
    path = tmp_path_factory.mktemp("audit-cli") / "test.npz"
    np.savez(path, x=mnist_splits.test.x[:150], y=mnist_splits.test.y[:150])
    return path


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1, "--json prints exactly one line"
    obj = json.loads(out)
    assert isinstance(obj, dict)
    return obj


def test_dscore_json(capsys: pytest.CaptureFixture[str], data_npz: Path) -> None:
    out = _json(
        capsys, ["audit", "dscore", "--model", MODEL, "--data", str(data_npz), "--n", "3", "--t", "5", "--json"]
    )
    assert out["kind"] == "dscore" and out["status"] == "success" and out["n_samples"] == 150
    for key in ("variant_accuracies", "translated_accuracies", "feature_distribution", "attention_distribution"):
        assert len(out[key]) == 9, key
    assert 0.9 < out["base_accuracy"] <= 1.0
    for key in ("fitness", "robustness", "dscore", "g", "augmentation_probability", "robustness_terms", "n_classes"):
        assert key in out, key
    assert out["dscore"] == pytest.approx(out["fitness"] - out["robustness"])
    assert out["n"] == 3 and out["n_classes"] == 10
    assert out["model"]["sha256"] and out["mlflow"] is None
    assert set(out["result"]["artifacts"]) == {"dscore_feature_distribution.png", "dscore_attention_distribution.png"}
    assert out["result"]["params"] == {"n": 3, "t": 5.0, "n_samples": 150, "n_classes": 10}


def test_dscore_label_free_and_text(capsys: pytest.CaptureFixture[str], data_npz: Path) -> None:
    out = _json(
        capsys, ["audit", "dscore", "--model", MODEL, "--data", str(data_npz), "--n", "2", "--label-free", "--json"]
    )
    assert out["base_accuracy"] == 1.0 and len(out["variant_accuracies"]) == 4
    assert out["result"]["details"]["label_free"] is True
    assert main(["audit", "dscore", "--model", MODEL, "--data", str(data_npz), "--n", "2", "--max-samples", "50"]) == 0
    text = capsys.readouterr().out
    assert "D-Score" in text and "on 50 inputs" in text


def test_mutation_json(capsys: pytest.CaptureFixture[str], data_npz: Path) -> None:
    argv = ["audit", "mutation", "--model", MODEL, "--data", str(data_npz), "--k", "400", "--repetitions", "2"]
    out = _json(capsys, [*argv, "--operators", "SGN,DIG,IMP", "--seed", "7", "--json"])
    assert out["kind"] == "mutation"
    metrics = out["result"]["metrics"]
    for group in ("sgn", "dig", "imp", "all"):
        for m in ("mae", "mse", "rmse"):
            assert f"{group}_{m}_change_pct_mean" in metrics
    assert out["result"]["params"]["operators"] == ["SGN", "DIG", "IMP"]
    assert out["result"]["params"]["seed"] == 7
    # seeded: the same command gives the same numbers
    again = _json(capsys, [*argv, "--operators", "SGN,DIG,IMP", "--seed", "7", "--json"])
    assert again["result"]["metrics"] == metrics


def test_mutation_retrain_mode(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(10, 3, size=(160, 3)).round(2)
    df = pd.DataFrame(x, columns=["a", "b", "c"])
    df["y"] = 2 * df["a"] - df["b"] + rng.normal(0, 0.5, 160)
    df.iloc[:120].to_csv(tmp_path / "train.csv", index=False)
    df.iloc[120:].to_csv(tmp_path / "test.csv", index=False)
    spec = tmp_path / "spec.yaml"
    spec.write_text("estimator: sklearn.linear_model.LinearRegression\nparams: {}\n")
    argv = ["audit", "mutation", "--spec", str(spec), "--train", str(tmp_path / "train.csv")]
    argv += ["--test", str(tmp_path / "test.csv"), "--target", "y", "--k", "30", "--repetitions", "3", "--json"]
    out = _json(capsys, argv)
    assert out["kind"] == "mutation_retrain"
    assert out["result"]["params"]["task"] == "regression" and out["result"]["params"]["n_train"] == 120
    assert "dec_mae_change_pct_mean" in out["result"]["metrics"]
    assert out["model"]["name"] == "LinearRegression"


def test_metamorphic_json(capsys: pytest.CaptureFixture[str], data_npz: Path, tmp_path: Path) -> None:
    spec = tmp_path / "transformations.yaml"
    spec.write_text("- shift\n- {name: brightness, delta: 0.05}\n- {name: blur, sigma: 0.7}\n")
    argv = ["audit", "metamorphic", "--model", MODEL, "--data", str(data_npz), "--transformations", str(spec)]
    out = _json(capsys, [*argv, "--order", "2", "--seed", "3", "--json"])
    relations = [r["relation"] for r in out["result"]["details"]["relations"]]
    assert relations == ["shift+brightness", "shift+blur", "brightness+blur"]
    assert 0.0 <= out["result"]["metrics"]["overall_violation_rate"] <= 1.0
    inline = _json(
        capsys,
        ["audit", "metamorphic", "--model", MODEL, "--data", str(data_npz), "--transformations", "[hflip]"]
        + ["--allow-flips", "--json"],
    )
    assert [r["relation"] for r in inline["result"]["details"]["relations"]] == ["hflip"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["audit", "dscore", "--model", MODEL, "--data", "{data}", "--n", "0"], "--n:"),
        (["audit", "dscore", "--model", MODEL, "--data", "missing.npz"], "data file not found"),
        (["audit", "mutation", "--model", MODEL, "--data", "{data}", "--operators", "FOO"], "--operators"),
        (["audit", "mutation", "--spec", "s.yaml", "--train", "t.csv"], "missing --test, --target"),
        (["audit", "metamorphic", "--model", MODEL, "--data", "{data}", "--transformations", "[hflip]"], "flip"),
        (["audit", "metamorphic", "--model", MODEL, "--data", "{data}", "--transformations", "[warp]"], "warp"),
        (["audit", "dscore", "--model", "nope.onnx", "--data", "{data}"], "nope.onnx"),
    ],
)
def test_user_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], data_npz: Path, argv: list[str], message: str
) -> None:
    code = main([a.replace("{data}", str(data_npz)) for a in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("icos-agent audit: error:") and err.count("\n") == 1, err
    assert message in err
