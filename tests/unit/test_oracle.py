"""The ordered oracle (ICOS §4.1), its calibration metrics (§5.3) and fitting (§5.4)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

from invariants.adi import AlgorithmInvariants
from invariants.fit_params import FitParams
from invariants.fitting import FittedOracle, fit_oracle, stratified_split
from invariants.idi import IdiRuleSet
from invariants.oracle import FAMILIES, VERDICTS, Oracle, OracleCalibration, OracleResult, Verdict, calibrate
from invariants.tdi import TrainingInvariants

DIGITS = [str(i) for i in range(10)]
GROUP_RULES = """
rules:
  - name: curves
    when: {field: group, equals: A}
    allowed_labels: [0, 3, 6, 8, 9]
  - name: straight
    when: {field: group, equals: B}
    allowed_labels: [1, 2, 4, 5, 7]
"""


def groups(y: np.ndarray) -> np.ndarray:
    """IDI metadata derived from the true label groups, as in the paper's experiments (§5.4)."""
    return np.where(np.isin(y, [0, 3, 6, 8, 9]), "A", "B")


# ----------------------------------------------------------------------------- tiny, known oracle


def tiny_oracle(adi_answer: bool) -> Oracle:
    x = np.array([[0, 0]] * 20 + [[10, 0]] * 9 + [[10, 10]] * 8, dtype=np.float64)
    y = np.array([0] * 20 + [1] * 9 + [2] * 8)
    tdi = TrainingInvariants.fit(x, y, confidence=0.99, support=8)  # leaves 1 (class 0) and 3 (class 1) selected
    idi = IdiRuleSet.from_yaml("rules: [{name: no-two, when: {field: cam, equals: 1}, forbidden_labels: [2]}]", "012")
    probs = np.random.default_rng(0).dirichlet(np.ones(3), size=10).astype(np.float32)
    adi = AlgorithmInvariants.fit(probs, np.full(10, adi_answer))
    return Oracle(idi, tdi, adi)


FEATURES = np.array([[0, 0], [0, 0], [10, 0], [10, 10], [10, 10], [0, 0]], dtype=np.float32)
LABELS = np.array([2, 1, 1, 2, 0, 0])
META = {"cam": [1, 0, 0, 1, 0, None]}
PROBS = np.full((6, 3), 1 / 3, dtype=np.float32)


def test_verdict_codes_labels_and_families() -> None:
    assert [int(v) for v in Verdict] == [0, 1, 2, 3]
    assert VERDICTS == ("pass", "fail:idi", "fail:tdi", "fail:adi") == tuple(v.label for v in Verdict)
    assert FAMILIES == ("idi", "tdi", "adi")
    labels = [(v.outcome, v.family) for v in Verdict]
    assert labels == [("pass", "none"), ("fail", "idi"), ("fail", "tdi"), ("fail", "adi")]


def test_first_violation_decides() -> None:
    oracle = tiny_oracle(adi_answer=True)
    result = oracle.judge(FEATURES, PROBS, LABELS, META)
    # 0: IDI fires (cam 1, label 2) although TDI would too; 1: TDI (leaf 1 says 0);
    # 2: TDI holds (leaf 3 says 1) -> ADI; 3: IDI; 4: leaf 4 is not selected -> ADI; 5: TDI holds -> ADI
    assert result.names() == ["fail:idi", "fail:tdi", "fail:adi", "fail:idi", "fail:adi", "fail:adi"]
    assert result.verdict.dtype == np.int8 and result.rule.dtype == np.int32
    assert result.rule.tolist() == [0, 0, 0, 0, 0, 0]
    assert result.failed.tolist() == [True] * 6
    assert result.counts() == {"pass": 0, "fail:idi": 2, "fail:tdi": 1, "fail:adi": 3}
    assert oracle.describe(result, 0) == "fail :- cam = 1, output ∈ {2}"
    assert oracle.describe(result, 1) == "fail :- x[0] <= 5.0, output != 0"
    assert "random forest" in oracle.describe(result, 2)


def test_passing_samples_and_absent_families() -> None:
    oracle = tiny_oracle(adi_answer=False)
    result = oracle.judge(FEATURES, PROBS, LABELS, META)
    assert result.names() == ["fail:idi", "fail:tdi", "pass", "fail:idi", "pass", "pass"]
    assert result.rule.tolist() == [0, 0, -1, 0, -1, -1]
    assert oracle.describe(result, 2) == "pass"
    assert result.counts() == {"pass": 3, "fail:idi": 2, "fail:tdi": 1, "fail:adi": 0}
    only_tdi = Oracle(None, oracle.tdi, None).judge(FEATURES, PROBS, LABELS, META)
    assert only_tdi.names() == ["fail:tdi", "fail:tdi", "pass", "pass", "pass", "pass"]
    assert only_tdi.rule.tolist() == [0, 0, -1, -1, -1, -1]
    nothing = Oracle(None, None, None).judge(None, PROBS, LABELS)
    assert nothing.counts() == {"pass": 6, "fail:idi": 0, "fail:tdi": 0, "fail:adi": 0}
    empty = oracle.judge(FEATURES[:0], PROBS[:0], LABELS[:0])
    assert len(empty) == 0 and empty.counts() == dict.fromkeys(VERDICTS, 0)
    with pytest.raises(ValueError, match="need the input features"):
        oracle.judge(None, PROBS, LABELS)


def test_calibration_counts_and_rates() -> None:
    result = OracleResult(np.array([0, 1, 2, 3, 0, 0], dtype=np.int8), np.array([-1, 0, 4, 0, -1, -1], np.int32))
    cal = calibrate(result, np.array([True, True, False, True, False, True]))
    assert (cal.tp, cal.fp, cal.tn, cal.fn, cal.n) == (2, 1, 1, 2, 6)
    assert cal.tpr == 0.5 and cal.fpr == 0.5
    assert cal.f1 == pytest.approx(4 / 7)
    assert cal.per_family == {"idi": {"tp": 1, "fp": 0}, "tdi": {"tp": 0, "fp": 1}, "adi": {"tp": 1, "fp": 0}}
    assert set(cal.per_family) == set(FAMILIES)
    assert OracleCalibration.from_dict(cal.to_dict()) == cal


def test_zero_denominators_give_zero_rates_and_keep_counts() -> None:
    passing = OracleResult(np.zeros(4, dtype=np.int8), np.full(4, -1, np.int32))
    cal = calibrate(passing, np.zeros(4, dtype=bool))
    assert (cal.tpr, cal.fpr, cal.f1) == (0.0, 0.0, 0.0)
    assert (cal.tp, cal.fp, cal.tn, cal.fn, cal.n) == (0, 0, 4, 0, 4)
    failing = OracleResult(np.full(3, 2, dtype=np.int8), np.zeros(3, np.int32))
    cal = calibrate(failing, np.ones(3, dtype=bool))
    assert (cal.tpr, cal.fpr, cal.f1) == (1.0, 0.0, 1.0)
    empty = calibrate(OracleResult(np.zeros(0, np.int8), np.zeros(0, np.int32)), np.zeros(0, bool))
    assert (empty.tpr, empty.fpr, empty.n) == (0.0, 0.0, 0)
    with pytest.raises(ValueError, match="truth flags"):
        calibrate(passing, np.zeros(3, dtype=bool))


def test_calibration_from_dict_refuses_nonsense() -> None:
    good = calibrate(OracleResult(np.array([0, 1], np.int8), np.array([-1, 0], np.int32)), np.array([True, True]))
    data = good.to_dict()
    with pytest.raises(ValueError, match="missing 'tp'"):
        OracleCalibration.from_dict({k: v for k, v in data.items() if k != "tp"})
    with pytest.raises(ValueError, match="inconsistent"):
        OracleCalibration.from_dict({**data, "n": 7})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        OracleCalibration.from_dict({**data, "tpr": 1.5})


# ----------------------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def digits() -> dict[str, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(y.shape[0])
    train, val, test = order[:700], order[700:1300], order[1300:]
    # a deliberately weak model, so that there are mispredictions to detect
    model = LogisticRegression(C=1e-4, max_iter=300).fit(x[train], y[train])
    return {
        "train_x": x[train].astype(np.float32),
        "train_y": y[train],
        "val_x": x[val].astype(np.float32),
        "val_y": y[val],
        "val_p": model.predict_proba(x[val]).astype(np.float32),
        "test_x": x[test].astype(np.float32),
        "test_y": y[test],
        "test_p": model.predict_proba(x[test]).astype(np.float32),
    }


@pytest.fixture(scope="module")
def fitted(digits: dict[str, np.ndarray]) -> FittedOracle:
    return fit_oracle(
        digits["train_x"],
        digits["train_y"],
        digits["val_x"],
        digits["val_y"],
        digits["val_p"],
        idi=IdiRuleSet.from_yaml(GROUP_RULES, DIGITS),
        val_metadata={"group": groups(digits["val_y"])},
        params=FitParams(seed=1),
    )


def test_judging_only_the_survivors_equals_judging_everything(
    digits: dict[str, np.ndarray], fitted: FittedOracle
) -> None:
    oracle = fitted.oracle
    assert oracle.idi is not None and oracle.tdi is not None and oracle.adi is not None
    x, p = digits["test_x"], digits["test_p"]
    labels = p.argmax(axis=1)
    meta = {"group": groups(digits["test_y"])}
    result = oracle.judge(x, p, labels, meta)
    idi = oracle.idi.evaluate(labels, meta)
    tdi = oracle.tdi.evaluate(x, labels)
    adi = oracle.adi.evaluate(p)
    expected = np.where(idi >= 0, 1, np.where(tdi >= 0, 2, np.where(adi, 3, 0)))
    assert np.array_equal(result.verdict, expected)
    expected_rule = np.where(idi >= 0, idi, np.where(tdi >= 0, tdi, np.where(adi, 0, -1)))
    assert np.array_equal(result.rule, expected_rule)
    assert all(result.counts()[name] > 0 for name in ("pass", "fail:idi", "fail:tdi"))
    i = int(np.flatnonzero(result.verdict == 2)[0])
    assert oracle.describe(result, i) == oracle.tdi.rules[int(result.rule[i])].text


def test_relaxing_confidence_or_support_never_lowers_tpr_or_fpr(
    digits: dict[str, np.ndarray], fitted: FittedOracle
) -> None:
    oracle = fitted.oracle
    assert oracle.tdi is not None
    x, p, y = digits["test_x"], digits["test_p"], digits["test_y"]
    labels = p.argmax(axis=1)
    wrong = labels != y
    meta = {"group": groups(y)}
    confidences = [1.0, 0.99, 0.95, 0.9, 0.8, 0.6, 0.3, 0.0]  # each step relaxes C
    supports = [300, 100, 40, 20, 8, 5, 1, 0]  # each step relaxes S
    rates = np.zeros((len(confidences), len(supports), 2))
    for a, c in enumerate(confidences):
        for b, s in enumerate(supports):
            relaxed = Oracle(oracle.idi, oracle.tdi.reselect(c, s), oracle.adi)
            cal = calibrate(relaxed.judge(x, p, labels, meta), wrong)
            rates[a, b] = (cal.tpr, cal.fpr)
    assert (np.diff(rates, axis=0) >= 0).all()  # lower C, same S
    assert (np.diff(rates, axis=1) >= 0).all()  # lower S, same C
    # and the selection really matters on this data: both rates grow from strictest to loosest
    assert rates[-1, -1, 0] > rates[0, 0, 0] and rates[-1, -1, 1] > rates[0, 0, 1]
    # the paper's RQ2 criteria 1 -> 2 -> 3 are such relaxations
    criteria = [(0.99, 8), (0.99, 0), (0.0, 0)]
    tpr_fpr = []
    for c, s in criteria:
        cal = calibrate(Oracle(oracle.idi, oracle.tdi.reselect(c, s), oracle.adi).judge(x, p, labels, meta), wrong)
        tpr_fpr.append((cal.tpr, cal.fpr))
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(tpr_fpr, tpr_fpr[1:], strict=False))


def test_fit_oracle_splits_val_stratified_and_calibrates_on_the_held_out_part(
    digits: dict[str, np.ndarray], fitted: FittedOracle
) -> None:
    val_y, val_p = digits["val_y"], digits["val_p"]
    wrong = val_p.argmax(axis=1) != val_y
    index = fitted.calibration_index
    assert np.array_equal(index, np.unique(index))
    share = FitParams().calibration_fraction
    assert index.size == round(share * wrong.sum()) + round(share * (~wrong).sum())
    assert wrong[index].sum() == round(share * wrong.sum())
    params = fitted.fit_params
    assert params["n_calibration"] == index.size and params["n_adi_train"] == 600 - index.size
    assert {k: params[k] for k in FitParams().recorded()} == FitParams(seed=1).recorded()
    assert params["n_tdi_selected"] == len(fitted.oracle.tdi.selected_rules)  # type: ignore[union-attr]
    result = fitted.oracle.judge(
        digits["val_x"][index], val_p[index], val_p[index].argmax(axis=1), {"group": groups(val_y[index])}
    )
    assert calibrate(result, wrong[index]) == fitted.calibration
    assert fitted.calibration.per_family["idi"]["fp"] == 0  # IDIs derived from the truth never err
    assert fitted.calibration.tpr > fitted.calibration.fpr


def test_fit_oracle_is_seeded_and_reports_progress(digits: dict[str, np.ndarray], fitted: FittedOracle) -> None:
    messages: list[str] = []
    again = fit_oracle(
        digits["train_x"],
        digits["train_y"],
        digits["val_x"],
        digits["val_y"],
        digits["val_p"],
        idi=IdiRuleSet.from_yaml(GROUP_RULES, DIGITS),
        val_metadata={"group": groups(digits["val_y"])},
        params=FitParams(seed=1),
        progress=messages.append,
    )
    assert np.array_equal(again.calibration_index, fitted.calibration_index)
    assert again.calibration == fitted.calibration
    assert len(messages) >= 4 and any("random forest" in m for m in messages)
    other = fit_oracle(
        digits["train_x"],
        digits["train_y"],
        digits["val_x"],
        digits["val_y"],
        digits["val_p"],
        idi=None,
        params=FitParams(seed=2, n_estimators=10),
        class_names=DIGITS,
    )
    assert not np.array_equal(other.calibration_index, fitted.calibration_index)
    assert other.oracle.idi is None and other.calibration.per_family["idi"] == {"tp": 0, "fp": 0}
    with pytest.raises(ValueError, match="calibration_fraction"):
        FitParams(calibration_fraction=1.0)


def test_stratified_split() -> None:
    strata = np.array([True] * 7 + [False] * 33)
    kept, held = stratified_split(strata, 0.3, seed=0)
    assert held.size == 2 + 10 and strata[held].sum() == 2
    assert np.array_equal(np.sort(np.concatenate([kept, held])), np.arange(40))
    again_kept, again_held = stratified_split(strata, 0.3, seed=0)
    assert np.array_equal(held, again_held) and np.array_equal(kept, again_kept)
    _, single = stratified_split(np.array([True] + [False] * 9), 0.3, seed=0)
    assert single.size == 3
