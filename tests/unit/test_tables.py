"""Bundles fitted from tables of predictions (no ONNX model): fit, check in bounded batches, the
decision threshold of binary models, and the modes that cannot use such a bundle."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agent.cli import main
from agent.config.settings import load_settings
from agent.data.tables import TableColumns, default_classes, iter_table, resolve_columns
from agent.errors import UserError
from agent.judging.runtime import load_runtime
from agent.model.classifier import label_confidences, predicted_classes_of
from bench.headline.nannyml_style import CAR_FEATURES, Table, car_loan
from invariants.bundle import Bundle, BundleError

ROOT = Path(__file__).resolve().parents[2]

FEATURES = ",".join(CAR_FEATURES)


@pytest.fixture(scope="module")
def car() -> Table:
    return car_loan(n_reference=3000, n_analysis=10000, seed=3)


@pytest.fixture(scope="module")
def files(car: Table, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tables")
    out = {"ref": d / "ref.csv", "ana": d / "ana.parquet", "ana_csv": d / "ana.csv"}
    car.period("reference").to_csv(out["ref"], index=False)
    car.period("analysis").to_parquet(out["ana"])
    car.period("analysis").to_csv(out["ana_csv"], index=False)
    return out


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def cli_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one-line error of a refused command (exit status 2)."""
    assert main(list(argv)) == 2
    return capsys.readouterr().err


def fit(capsys: pytest.CaptureFixture[str], ref: Path, out: Path, *extra: str) -> dict[str, object]:
    return cli_json(
        capsys,
        "fit",
        "--reference",
        str(ref),
        "--label-column",
        "repaid",
        "--proba-columns",
        "y_pred_proba",
        "--feature-columns",
        FEATURES,
        "--trees",
        "30",
        "--out",
        str(out),
        *extra,
    )


@pytest.fixture(scope="module")
def bundle_dir(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "b"
    argv = ["fit", "--reference", str(files["ref"]), "--label-column", "repaid", "--proba-columns", "y_pred_proba"]
    assert main([*argv, "--feature-columns", FEATURES, "--trees", "30", "--out", str(out), "--json"]) == 0
    return out


def test_table_bundle_records_its_columns_and_loads_without_a_model(bundle_dir: Path) -> None:
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    assert manifest["model_sha256"] is None
    assert manifest["table"] == {
        "proba_columns": ["y_pred_proba"],
        "feature_columns": list(CAR_FEATURES),
        "label_column": "repaid",
    }
    # chosen from evidence at fit (tests/unit/test_headline_choice.py)
    assert manifest["headline"] == manifest["estimator_calibration"]["headline"]["chosen"]
    assert "shift" not in manifest["estimator_calibration"] or not manifest["estimator_calibration"]["shift"]
    b = Bundle.load(bundle_dir)
    assert b.table is not None and b.classes == ["0", "1"] and b.input_shape == [len(CAR_FEATURES)]
    assert Bundle.table_source(bundle_dir) == b.table
    with pytest.raises(BundleError, match="fitted from a table"):
        Bundle.load(bundle_dir, expected_model_sha256="a" * 64)


def test_check_reads_features_and_probabilities_from_the_table(
    bundle_dir: Path, files: dict[str, Path], car: Table, capsys: pytest.CaptureFixture[str]
) -> None:
    report = cli_json(capsys, "check", "--bundle", str(bundle_dir), "--data", str(files["ana"]))
    ana = car.period("analysis")
    assert report["n"] == 10000 == len(ana)
    assert report["headline"] == Bundle.load(bundle_dir).headline == report["headline_evidence"]["chosen"]
    estimates = report["estimates"]
    assert isinstance(estimates, dict)
    assert set(estimates) == {"icos", "icos_corrected", "avg_conf", "atc", "doc", "cbpe"}  # shift_aware needs the model
    truth = float(((ana["y_pred_proba"] >= 0.5).astype(int) == ana["repaid"]).mean())
    assert report["truth"] == {"accuracy": pytest.approx(truth), "none_of_the_classes": {"n": 0, "share": 0.0}}
    verdicts = report["verdicts"]
    assert isinstance(verdicts, dict) and sum(verdicts.values()) == 10000


def test_check_streams_in_bounded_batches_with_the_same_result(
    bundle_dir: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """10,000 rows read 1,000 (or 777) at a time, CSV and Parquet, give the whole file's report."""
    whole = cli_json(capsys, "check", "--bundle", str(bundle_dir), "--data", str(files["ana"]))
    for data, rows in ((files["ana"], "1000"), (files["ana_csv"], "777")):
        batched = cli_json(capsys, "check", "--bundle", str(bundle_dir), "--data", str(data), "--batch-rows", rows)
        assert batched["verdicts"] == whole["verdicts"] and batched["truth"] == whole["truth"]
        for k, e in whole["estimates"].items():  # type: ignore[union-attr]
            assert batched["estimates"][k]["value"] == pytest.approx(e["value"], abs=1e-9)  # type: ignore[index]
    cols, _ = resolve_columns(files["ana_csv"], proba=["y_pred_proba"], label="repaid", features=list(CAR_FEATURES))
    for data in (files["ana"], files["ana_csv"]):
        sizes = [len(b) for b in iter_table(data, cols, batch_rows=1024)]
        assert sum(sizes) == 10000 and max(sizes) <= 1024


def test_chunks_add_up_to_the_file(
    bundle_dir: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    report = cli_json(
        capsys, "check", "--bundle", str(bundle_dir), "--data", str(files["ana"]), "--chunk-size", "3000",
        "--batch-rows", "1024",
    )  # fmt: skip
    chunks = report["chunks"]
    assert isinstance(chunks, list)
    assert [(c["start"], c["end"]) for c in chunks] == [(0, 3000), (3000, 6000), (6000, 9000), (9000, 10000)]
    assert sum(c["verdicts"]["pass"] for c in chunks) == report["verdicts"]["pass"]  # type: ignore[index]


def test_decision_threshold_changes_labels_verdicts_and_accuracy(
    files: dict[str, Path], car: Table, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = np.array([[0.65, 0.35], [0.8, 0.2], [0.3, 0.7]], dtype=np.float32)
    assert predicted_classes_of(p).tolist() == [0, 0, 1]
    assert predicted_classes_of(p, 0.3).tolist() == [1, 0, 1]
    assert label_confidences(p, predicted_classes_of(p, 0.3)).tolist() == pytest.approx([0.35, 0.8, 0.7])
    plain = fit(capsys, files["ref"], tmp_path / "plain")
    low = fit(capsys, files["ref"], tmp_path / "low", "--decision-threshold", "0.3")
    assert plain["decision_threshold"] is None and low["decision_threshold"] == 0.3
    assert Bundle.load(tmp_path / "low").decision_threshold == 0.3
    ana = car.period("analysis")
    checks = {}
    for name in ("plain", "low"):
        checks[name] = cli_json(capsys, "check", "--bundle", str(tmp_path / name), "--data", str(files["ana"]))
    y, p1 = ana["repaid"].to_numpy(), ana["y_pred_proba"].to_numpy()
    assert checks["plain"]["truth"]["accuracy"] == pytest.approx(float(((p1 >= 0.5) == y).mean()))
    assert checks["low"]["truth"]["accuracy"] == pytest.approx(float(((p1 >= 0.3) == y).mean()))
    assert checks["low"]["truth"] != checks["plain"]["truth"]
    assert checks["low"]["verdicts"] != checks["plain"]["verdicts"]
    assert checks["low"]["decision_threshold"] == 0.3
    # a threshold for three classes is refused
    args = ["--label-column", "repaid", "--proba-columns", "y_pred_proba", "--classes", "a,b,c"]
    err = cli_error(
        capsys, "fit", "--reference", str(files["ref"]), *args, "--decision-threshold", "0.3", "--out", str(tmp_path)
    )
    assert "binary models only" in err


def test_serve_and_proxy_modes_refuse_a_table_bundle(bundle_dir: Path) -> None:
    onnx = str(ROOT / "agent" / "shipped_models" / "digits_cnn.onnx")
    for mode, extra in (("serve", {}), ("proxy", {"upstream": {"url": "http://127.0.0.1:9"}})):
        model = {"name": "m", "path": onnx}
        settings = load_settings(None, mode=mode, model=model, bundle={"path": str(bundle_dir)}, **extra)
        with pytest.raises(UserError, match="fitted from a table of predictions.*observe"):
            load_runtime(settings)
    rt = load_runtime(load_settings(None, mode="observe", model={"name": "m"}, bundle={"path": str(bundle_dir)}))
    assert (
        rt.input_shape == (len(CAR_FEATURES),)
        and rt.headline == Bundle.load(bundle_dir).headline
        and rt.model_sha256 == ""
    )


def test_cli_names_what_is_missing(
    bundle_dir: Path, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref, out = str(files["ref"]), str(tmp_path / "b")
    assert "--proba-columns" in cli_error(capsys, "fit", "--reference", ref, "--label-column", "repaid", "--out", out)
    onnx = str(ROOT / "agent" / "shipped_models" / "digits_cnn.onnx")
    err = cli_error(capsys, "check", "--bundle", str(bundle_dir), "--data", str(files["ana"]), "--model", onnx)
    assert "fitted from a table of predictions" in err and "without --model" in err
    err = cli_error(
        capsys, "fit", "--reference", ref, "--label-column", "repaid", "--proba-columns", "nope", "--out", out
    )
    assert "not found: nope" in err
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"a": [1.0, 2.0], "p0": [0.2, 0.5], "p1": [0.2, 0.5], "y": [0, 1]}).to_csv(bad, index=False)
    cols = TableColumns(("p0", "p1"), ("a",), "y")
    with pytest.raises(UserError, match="sum to 1"):
        list(iter_table(bad, cols))


def test_class_names_come_from_the_probability_columns() -> None:
    assert default_classes(["y_pred_proba"]) == ["0", "1"]
    assert default_classes(["y_pred_proba_prepaid_card", "y_pred_proba_highstreet_card"]) == [
        "prepaid_card",
        "highstreet_card",
    ]


def test_serve_mode_model_predicts_with_the_bundle_threshold(bundle_dir: Path, car: Table, tmp_path: Path) -> None:
    """An ONNX binary model served with a bundle that has a decision threshold labels by it."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    from invariants.bundle import sha256_file

    ref = car.period("reference")
    x = ref[list(CAR_FEATURES)].to_numpy(np.float32)
    clf = LogisticRegression(max_iter=500).fit(x, ref["repaid"].to_numpy())
    onnx_path = tmp_path / "loan.onnx"
    onnx_path.write_bytes(to_onnx(clf, x[:1], options={"zipmap": False}).SerializeToString())
    b = Bundle.load(bundle_dir)
    b.table, b.model_sha256, b.decision_threshold, b.headline = None, sha256_file(onnx_path), 0.7, None
    b.save(tmp_path / "model-bundle")
    model = {"name": "m", "path": str(onnx_path)}
    rt = load_runtime(load_settings(None, mode="serve", model=model, bundle={"path": str(tmp_path / "model-bundle")}))
    assert rt.classifier is not None and rt.classifier.decision_threshold == 0.7 and rt.headline == "shift_aware"
    pred = rt.classifier.predict(x[:500])
    p1 = clf.predict_proba(x[:500])[:, 1]
    assert pred.predicted.tolist() == (p1 >= 0.7).astype(int).tolist() != (p1 >= 0.5).astype(int).tolist()
    assert rt.predicted_classes(pred.probabilities).tolist() == pred.predicted.tolist()
