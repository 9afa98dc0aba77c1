"""Data mutation (DEC/IMP/SGN/DIG, paper §4) and the audits built on it."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.audits.mutation.operators import NotApplicable, dec, decimal_parts, dig, imp, mutate, sgn
from agent.audits.mutation.retrain import ALLOWED_ESTIMATORS, build_estimator, run_retrain_audit
from agent.audits.mutation.robustness import probability_errors
from agent.audits.mutation.run import MutationPlan, run_mutation_audit
from agent.audits.report import AuditError

ROOT = Path(__file__).resolve().parents[2]
DIGITS_CNN = ROOT / "agent" / "shipped_models" / "digits_cnn.onnx"

# Numbers with 1-4 decimals, as typed into a table: whole part up to 6 digits.
decimals = st.builds(
    lambda whole, frac, places, neg: float(Decimal(f"{'-' if neg else ''}{whole}.{frac:0{places}d}")),
    st.integers(0, 999_999),
    st.integers(1, 9999),
    st.integers(4, 4),
    st.booleans(),
).filter(lambda v: decimal_parts(v)[1] != "")


# --------------------------------------------------------------------------------------------
# DEC
# --------------------------------------------------------------------------------------------


def test_dec_paper_example_18_27() -> None:
    rng = np.random.default_rng(0)
    assert {dec(18.27, rng) for _ in range(300)} == {1.827, 182.7, 1827.0}
    assert {dec(0.23, rng) for _ in range(200)} == {2.3, 23.0}  # cannot move left below 1
    f32 = {dec(float(np.float32(18.27)), rng, dtype=np.float32) for _ in range(300)}
    assert f32 == {1.827, 182.7, 1827.0}


@settings(max_examples=200, deadline=None)
@given(value=decimals, seed=st.integers(0, 2**32 - 1))
def test_dec_exponent_range(value: float, seed: int) -> None:
    whole, frac = decimal_parts(value)
    alpha, beta = len(whole), len(frac)
    new = dec(value, np.random.default_rng(seed))
    e = round(math.log10(abs(new) / abs(value))) if value != 0 else None
    assert e is not None and e != 0 and -(alpha - 1) <= e <= beta
    assert Decimal(repr(new)) == Decimal(repr(value)).scaleb(e)
    assert math.copysign(1, new) == math.copysign(1, value)
    if abs(value) > 1:
        assert abs(new) > 1


def test_dec_alpha_beta_override_and_not_applicable() -> None:
    rng = np.random.default_rng(1)
    assert {dec(18.27, rng, alpha=1, beta=1) for _ in range(50)} == {182.7}
    for whole in (5.0, 0.0, 1827.0, -3.0, math.nan, math.inf):
        with pytest.raises(NotApplicable):
            dec(whole, rng)


# --------------------------------------------------------------------------------------------
# IMP
# --------------------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    column=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=30),
    data=st.data(),
)
def test_imp_picks_zero_previous_or_running_mean(column: list[float], data: st.DataObject) -> None:
    i = data.draw(st.integers(1, len(column) - 1))
    seed = data.draw(st.integers(0, 2**32 - 1))
    options = {0.0, column[i - 1], float(np.mean(column[:i]))}
    try:
        new = imp(column, i, np.random.default_rng(seed))
    except NotApplicable as exc:
        assert exc.code == "no_effect" and column[i] in options
        return
    assert new in options and new != column[i]


def test_imp_reaches_all_three_choices_and_first_row_only_zero() -> None:
    column = [1.0, 2.0, 3.0, 10.0]
    seen = {imp(column, 3, np.random.default_rng(s)) for s in range(60)}
    assert seen == {0.0, 3.0, 2.0}  # zero, previous, mean of previous
    assert {imp(column, 0, np.random.default_rng(s)) for s in range(10)} == {0.0}
    with pytest.raises(NotApplicable):
        imp([0.0, 5.0], 0, np.random.default_rng(0))


# --------------------------------------------------------------------------------------------
# SGN and DIG
# --------------------------------------------------------------------------------------------


@given(value=st.floats(allow_nan=False, allow_infinity=False).filter(lambda v: v != 0))
def test_sgn_negates(value: float) -> None:
    assert sgn(value) == -value


def test_sgn_not_applicable_to_zero() -> None:
    with pytest.raises(NotApplicable):
        sgn(0.0)


@settings(max_examples=300, deadline=None)
@given(
    value=st.one_of(decimals, st.integers(-(10**7), 10**7).map(float)),
    seed=st.integers(0, 2**32 - 1),
)
def test_dig_changes_exactly_one_whole_digit_and_keeps_sign(value: float, seed: int) -> None:
    new = dig(value, np.random.default_rng(seed))
    w0, f0 = decimal_parts(value)
    w1, f1 = decimal_parts(new)
    assert f1 == f0  # fractional part untouched
    width = max(len(w0), len(w1))
    a, b = w0.zfill(width), w1.zfill(width)
    assert sum(x != y for x, y in zip(a, b, strict=True)) == 1
    if value > 0:
        assert new >= 0
    if value < 0:
        assert new <= 0


def test_dig_examples() -> None:
    rng = np.random.default_rng(2)
    out = {dig(-18.27, rng) for _ in range(400)}
    assert -19.27 in out and -98.27 in out and -8.27 in out  # s=1 and s=2, leading 1 → 0
    assert all(v < 0 for v in out) and len(out) == 18  # 9 alternatives for each of 2 digits
    assert {dig(0.5, rng) for _ in range(200)} == {m + 0.5 for m in range(1, 10)}


# --------------------------------------------------------------------------------------------
# mutate()
# --------------------------------------------------------------------------------------------


def _table(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "flow": rng.normal(500, 100, n).round(2),
            "count": rng.integers(0, 5000, n),
            "ratio": rng.uniform(-1, 1, n).astype(np.float32),
            "name": [f"s{i}" for i in range(n)],
        }
    )


def test_mutate_dataframe_equal_counts_distinct_cells_and_log() -> None:
    df = _table()
    out, log = mutate(df, 42, seed=7)
    assert log.requested == {"DEC": 11, "IMP": 11, "SGN": 10, "DIG": 10}
    assert log.counts() == log.requested and sum(log.shortfall().values()) == 0
    cells = {(r.row, r.column) for r in log.applied}
    assert len(cells) == 42
    changed = {
        (i, c) for c in ("flow", "count", "ratio") for i in np.flatnonzero(out[c].to_numpy() != df[c].to_numpy())
    }
    assert changed == cells
    assert (out["name"] == df["name"]).all()
    assert out["ratio"].dtype == np.float32
    assert log.ineligible["DEC"] >= 200  # the integer column (and any whole-number flow) has no decimal part
    for r in log.applied:
        assert r.operator in {"DEC", "IMP", "SGN", "DIG"} and r.old == float(df.at[r.row, r.column])
    json.dumps(log.to_dict())


def test_mutate_is_seeded() -> None:
    df = _table()
    a, la = mutate(df, 30, seed=3)
    b, lb = mutate(df, 30, seed=3)
    c, _ = mutate(df, 30, seed=4)
    pd.testing.assert_frame_equal(a, b)
    assert la.applied == lb.applied
    assert not a.equals(c)


def test_mutate_images_dec_not_applicable_is_reported() -> None:
    x = np.random.default_rng(0).integers(0, 17, (50, 1, 8, 8)).astype(np.float32)
    out, log = mutate(x, 400, seed=1)
    assert out.shape == x.shape and out.dtype == np.float32
    assert log.counts()["DEC"] == 0 and log.shortfall()["DEC"] == 100
    assert log.ineligible["DEC"] == x.size
    assert log.counts()["SGN"] == log.counts()["DIG"] == log.counts()["IMP"] == 100
    assert int((out != x).sum()) == len(log.applied) == 300
    only_dec, dec_log = mutate(x, 10, operators=("DEC",), seed=1)
    assert np.array_equal(only_dec, x) and dec_log.shortfall() == {"DEC": 10}


def test_mutate_rejects_bad_arguments() -> None:
    with pytest.raises(AuditError, match="unknown mutation operator"):
        mutate(np.ones((3, 3)), 1, operators=("FOO",))
    with pytest.raises(AuditError, match="not numeric"):
        mutate(_table(), 1, columns=["name"])


# --------------------------------------------------------------------------------------------
# Audits
# --------------------------------------------------------------------------------------------


def test_probability_errors_match_binary_definition() -> None:
    p1 = np.array([0.51, 0.49, 0.9, 0.2])  # positive-class scores
    y = np.array([0, 1, 1, 0])
    two = np.stack([1 - p1, p1], axis=1)
    e = probability_errors(two, y)
    assert e["mae"] == pytest.approx(np.mean(np.abs(y - p1)))
    assert e["mse"] == pytest.approx(np.mean((y - p1) ** 2))
    assert e["rmse"] == pytest.approx(math.sqrt(e["mse"]))
    assert e["accuracy"] == pytest.approx(0.5)


@pytest.fixture(scope="module")
def digits_model_and_data() -> tuple[object, np.ndarray, np.ndarray]:
    if not DIGITS_CNN.is_file():
        pytest.skip(f"shipped model {DIGITS_CNN.relative_to(ROOT)} is missing")
    from agent.data.datasets import digits_splits
    from agent.model.classifier import OnnxClassifier

    test = digits_splits().test
    return OnnxClassifier.load(DIGITS_CNN), test.x, test.y


def test_mutation_audit_on_shipped_digits_cnn(digits_model_and_data: tuple[object, np.ndarray, np.ndarray]) -> None:
    model, x, y = digits_model_and_data
    predict = model.predict_proba  # type: ignore[attr-defined]
    calls: list[tuple[int, int]] = []
    k = int(0.05 * x.size)
    r = run_mutation_audit(
        predict, x, y, MutationPlan(k=k, repetitions=3, seed=11), progress=lambda d, t: calls.append((d, t))
    )
    assert r.kind == "mutation" and calls[-1] == (15, 15)
    assert r.metrics["baseline_accuracy"] > 0.9
    for g in ("imp", "sgn", "dig", "all"):
        for m in ("mae", "mse", "rmse", "accuracy"):
            assert math.isfinite(r.metrics[f"{g}_{m}_change_pct_mean"])
            assert r.metrics[f"{g}_{m}_change_pct_std"] >= 0
    assert r.metrics["sgn_mae_change_pct_mean"] > 0 and r.metrics["all_mae_change_pct_mean"] > 0
    assert math.isnan(r.metrics["dec_mae_change_pct_mean"])  # whole-number pixels: DEC never applies
    assert "not applicable" in r.details["summary"]["DEC"]["note"]
    doc = json.loads(r.to_json())
    assert doc["metrics"]["dec_mae_change_pct_mean"] is None
    again = run_mutation_audit(predict, x, y, MutationPlan(k=k, repetitions=3, seed=11))
    assert again.to_json() == r.to_json()
    free = run_mutation_audit(predict, x, None, MutationPlan(k=k, repetitions=1, seed=11, operators=("SGN",)))
    with pytest.raises(AuditError, match="repetitions must be >= 1, got 0"):
        MutationPlan(k=k, repetitions=0)
    assert free.metrics["baseline_accuracy"] == 1.0 and free.params["label_free"]


def _diabetes() -> tuple[pd.DataFrame, pd.DataFrame]:
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True).frame
    return frame.iloc[:330].reset_index(drop=True), frame.iloc[330:].reset_index(drop=True)


def test_retrain_audit_regression_linear_vs_forest() -> None:
    train, test = _diabetes()
    lin = run_retrain_audit(
        {"estimator": "sklearn.linear_model.LinearRegression"}, train, test, "target", MutationPlan(k=80)
    )
    assert lin.kind == "mutation_retrain" and lin.params["task"] == "regression"
    assert set(lin.details["baseline"]) == {"mae", "mse", "rmse"}
    assert lin.metrics["all_mae_change_pct_mean"] > 10  # DEC/DIG on scaled features wreck a linear fit
    spec = {"estimator": "sklearn.tree.DecisionTreeRegressor", "params": {"max_depth": 4}}
    tree = run_retrain_audit(spec, train, test, "target", MutationPlan(k=80, repetitions=2, seed=5))
    assert tree.params["estimator_params"] == {"max_depth": 4}
    again = run_retrain_audit(spec, train, test, "target", MutationPlan(k=80, repetitions=2, seed=5))
    assert again.metrics == tree.metrics


def test_retrain_audit_classification() -> None:
    from sklearn.datasets import load_iris

    frame = load_iris(as_frame=True).frame.sample(frac=1.0, random_state=0).reset_index(drop=True)
    spec = {"estimator": "sklearn.ensemble.RandomForestClassifier", "params": {"n_estimators": 25, "max_depth": 10}}
    r = run_retrain_audit(spec, frame.iloc[:100], frame.iloc[100:], "target", MutationPlan(k=40, repetitions=2))
    assert r.params["task"] == "classification"
    assert set(r.details["baseline"]) == {"mae", "mse", "rmse", "accuracy"}
    assert 0 <= r.metrics["baseline_mae"] <= 1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"estimator": "os.system"}, "not allowed"),
        ({"estimator": "sklearn.svm.SVC"}, "not allowed"),
        ({"estimator": "sklearn.linear_model.Ridge", "params": {"alpah": 1.0}}, "invalid parameters"),
        ({"estimator": "sklearn.linear_model.Ridge", "params": {"alpha": {"x": 1}}}, "must be a number"),
        ({"estimator": "sklearn.linear_model.Ridge", "extra": 1}, "unknown key"),
        (["sklearn.linear_model.Ridge"], "must be a mapping"),
    ],
)
def test_estimator_spec_is_allow_listed(spec: object, message: str) -> None:
    with pytest.raises(AuditError, match=message):
        build_estimator(spec)  # type: ignore[arg-type]


def test_allow_list_entries_all_import() -> None:
    for path in ALLOWED_ESTIMATORS:
        assert build_estimator({"estimator": path}, seed=0) is not None
