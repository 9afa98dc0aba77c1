"""``fit`` in stages: each stage timed in the report and in ``fit --json``, the model left as it was given,
the calibration plan's sizes used, and a fit's mistakes said as one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from agent.cli import main
from agent.data.files import Dataset
from agent.errors import UserError
from agent.model.classifier import OnnxClassifier
from agent.offline.fit import STAGES, fit_bundle
from invariants.bundle import Bundle
from invariants.fit_params import CalibrationPlan, FitParams


def _binary_model(tmp_path: Path) -> tuple[OnnxClassifier, np.ndarray, np.ndarray]:
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    x, y = make_classification(n_samples=1000, n_features=6, n_informative=4, flip_y=0.1, random_state=3)
    x = x.astype(np.float32)
    clf = LogisticRegression().fit(x[:400], y[:400])
    exported = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    (tmp_path / "m.onnx").write_bytes(exported.SerializeToString())
    return OnnxClassifier.load(tmp_path / "m.onnx"), x, y


def test_a_table_fit_reports_the_seconds_of_every_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    rng = np.random.default_rng(2)
    x = rng.normal(size=(1200, 3))
    p1 = 1 / (1 + np.exp(-(x @ np.array([1.5, -1.0, 0.5]))))
    frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "p1": p1, "y": rng.uniform(size=1200) < p1})
    frame["y"] = frame["y"].astype(int)
    frame.to_csv(tmp_path / "ref.csv", index=False)
    argv = ["fit", "--reference", str(tmp_path / "ref.csv"), "--label-column", "y", "--proba-columns", "p1"]
    assert main([*argv, "--trees", "10", "--out", str(tmp_path / "bundle"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(summary["stage_seconds"]) == [*STAGES, "save"]
    assert all(v >= 0 for v in summary["stage_seconds"].values())
    assert sum(summary["stage_seconds"].values()) <= summary["seconds"] + 0.01
    # the data-needed advice: plenty of errors here, so nothing more is needed
    advice = summary["validation_needed"]
    assert advice["errors_seen"] > 100 and advice["more"] == 0 and advice["needed"] <= advice["validation"]
    # a table bundle's flag, fitted on simulated shifts of held-out folds (no shift_aware, no trust distance)
    flag = Bundle.load(tmp_path / "bundle").estimator_calibration["flag"]
    assert flag["features"] == ["log_shift", "disagreement", "drop", "small_window", "inputs_beyond_confidence"]
    assert flag["windows"] > 0


def test_a_model_fit_leaves_the_model_as_given_and_draws_the_plans_sizes(tmp_path: Path) -> None:
    model, x, y = _binary_model(tmp_path)
    plan = CalibrationPlan(shift_windows=300, clean_windows=40, windows_per_kind=3, bootstrap=20, min_fold_rows=20)
    report = fit_bundle(
        model,
        Dataset(x[:400], y[:400]),
        Dataset(x[400:], y[400:]),
        params=FitParams(n_estimators=10, decision_threshold=0.3, shift_sets=12),
        plan=plan,
    )
    assert model.decision_threshold is None and report.bundle.decision_threshold == 0.3
    assert tuple(report.stage_seconds) == STAGES
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.coverage = 0.0  # type: ignore[misc]
    evidence = report.calibration.headline
    assert evidence is not None and evidence.folds == plan.headline_folds
    assert evidence.windows == plan.windows_per_kind * len(evidence.kinds) * plan.headline_folds
    shift = report.calibration.shift
    assert shift is not None and shift.trust is not None
    flag = report.calibration.flag  # fitted on the refits behind shift_aware's interval
    assert flag is not None and flag.features[0] == "log_distance" and flag.headline == "shift_aware"
    assert flag.windows > 0 and all(c >= 0 for c in flag.coef)


def test_too_few_validation_records_for_a_calibration_split_is_a_users_mistake(tmp_path: Path) -> None:
    model, x, y = _binary_model(tmp_path)
    with pytest.raises(UserError, match="too few to split"):
        fit_bundle(model, Dataset(x[:400], y[:400]), Dataset(x[400:402], y[400:402]), params=FitParams(n_estimators=5))


def test_the_tdi_tree_grows_on_a_bounded_stratified_sample_of_a_large_training_set() -> None:
    from invariants.fitting import fit_oracle

    rng = np.random.default_rng(4)
    x = rng.normal(size=(3000, 4)).astype(np.float32)
    y = (x[:, 0] + 0.3 * rng.normal(size=3000) > 0.8).astype(np.int64)  # classes of about 20% and 80%
    p1 = 1 / (1 + np.exp(-3 * x[:600, 0]))
    probs = np.stack([1 - p1, p1], axis=1).astype(np.float32)
    params = FitParams(n_estimators=5, tdi_max_records=1000)
    fitted = fit_oracle(x, y, x[:600], y[:600], probs, idi=None, params=params)
    tdi = fitted.oracle.tdi
    assert tdi is not None
    assert sum(r.support for r in tdi.rules) == 1000  # the records the tree grew on
    ones = sum(r.support for r in tdi.rules if r.label == 1)
    assert abs(ones / 1000 - y.mean()) < 0.05  # stratified: the classes keep their shares (leaves are near pure)
    assert fitted.fit_params["tdi_max_records"] == 1000 and fitted.fit_params["n_train"] == 3000
    whole = fit_oracle(x, y, x[:600], y[:600], probs, idi=None, params=FitParams(n_estimators=5))
    assert whole.oracle.tdi is not None and sum(r.support for r in whole.oracle.tdi.rules) == 3000
