"""Realized-window maths: windows by prediction time, the count window, estimators on the labeled
subset, absolute errors, and MAE/MSE/RMSE of probabilities against one-hot truth; label parsing."""

from __future__ import annotations

import numpy as np
import pytest

from agent.audits.mutation.robustness import probability_errors as mutation_probability_errors
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import estimate_all
from agent.estimation.statistics.window import WindowStats
from agent.labels.intake import parse_labels, resolve_label
from agent.labels.realized import RealizedWindows, probability_errors, realized_window
from agent.labels.rows import LabeledRows, onehot_errors

CAL = EstimatorCalibration(tpr=0.6, fpr=0.05, n_wrong=100, n_right=900, accuracy=0.9, avg_conf=0.92, atc_threshold=0.7)


def labeled(n: int, ts: np.ndarray, k: int = 4, seed: int = 0) -> tuple[LabeledRows, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k) * 0.5, n)
    y = rng.integers(0, k, n)
    y = np.where(rng.uniform(size=n) < 0.6, p.argmax(axis=1), y)
    errs = np.array([onehot_errors(p[i], int(y[i])) for i in range(n)])
    rows = LabeledRows(
        timestamp=np.asarray(ts, dtype=np.float64),
        verdict=rng.integers(0, 4, n).astype(np.int8),
        confidence=p.max(axis=1),
        correct=p.argmax(axis=1) == y,
        abs_err=errs[:, 0],
        sq_err=errs[:, 1],
        n_classes=np.full(n, k),
    )
    return rows, p, y


def test_probability_errors_match_the_one_hot_definition() -> None:
    rows, p, y = labeled(500, np.zeros(500))
    got = probability_errors(rows.abs_err, rows.sq_err, rows.n_classes)
    want = mutation_probability_errors(p, y)
    assert got.mae == pytest.approx(want["mae"], rel=1e-12)
    assert got.mse == pytest.approx(want["mse"], rel=1e-12)
    assert got.rmse == pytest.approx(want["rmse"], rel=1e-12)
    # the binary case is the paper's note: ten negatives at 0.49 and ten positives at 0.51 → MAE 0.49
    pb = np.r_[np.tile([0.51, 0.49], (10, 1)), np.tile([0.49, 0.51], (10, 1))]
    yb = np.r_[np.zeros(10, int), np.ones(10, int)]
    e = np.array([onehot_errors(pb[i], int(yb[i])) for i in range(20)])
    assert probability_errors(e[:, 0], e[:, 1], np.full(20, 2)).mae == pytest.approx(0.49)


def test_realized_window_compares_estimators_on_the_same_predictions() -> None:
    rows, _, _ = labeled(300, np.zeros(300))
    w = realized_window(rows, CAL)
    assert w is not None
    acc = float(rows.correct.mean())
    assert w.n == 300 and w.correct == int(rows.correct.sum())
    assert w.accuracy.value == pytest.approx(acc)
    assert w.accuracy.lower <= acc <= w.accuracy.upper
    expect = estimate_all(WindowStats.from_batch(rows.verdict, rows.confidence, CAL), CAL)
    assert set(w.estimates) == set(expect)
    for k, e in expect.items():
        assert w.estimates[k].value == pytest.approx(e.value)
        assert w.abs_errors[k] == pytest.approx(abs(e.value - acc))
    assert realized_window(LabeledRows.empty(), CAL) is None


def test_windows_select_by_prediction_time_and_count() -> None:
    now = 10_000.0
    ts = np.r_[np.full(50, now - 7200), np.linspace(now - 1800, now - 1700, 30), np.full(20, now - 60)]
    rows, _, _ = labeled(100, ts)
    rw = RealizedWindows({"5m": 300.0, "1h": 3600.0}, count=40, capacity=1000)
    # labels arrive in any order: the windows go by prediction time
    order = np.random.default_rng(1).permutation(100)
    for part in np.array_split(order, 7):
        rw.add(LabeledRows(*(getattr(rows, f)[part] for f in LabeledRows.__dataclass_fields__)))
    out = rw.compute(CAL, now)
    assert out["5m"] is not None and out["1h"] is not None and out["last40"] is not None
    assert (out["5m"].n, out["1h"].n, out["last40"].n) == (20, 50, 40)
    assert out["5m"].correct == int(rows.correct[80:].sum())
    assert out["1h"].correct == int(rows.correct[50:].sum())
    assert out["last40"].correct == int(rows.correct[60:].sum())
    # samples no window can hold are pruned: the 50 two-hour-old ones (beyond the count window too)
    assert rw.size == 50
    later = rw.compute(CAL, now + 3600)
    assert later["5m"] is None and later["1h"] is None
    assert later["last40"] is not None and later["last40"].n == 40


def test_capacity_bounds_memory() -> None:
    rows, _, _ = labeled(500, np.arange(500, dtype=np.float64))
    rw = RealizedWindows({"1h": 3600.0}, count=None, capacity=100)
    rw.add(rows)
    out = rw.compute(CAL, 600.0)
    assert out["1h"] is not None and out["1h"].n == 100 and rw.size == 100
    assert out["1h"].correct == int(rows.correct[400:].sum())
    rw.reset()
    assert rw.compute(CAL, 600.0)["1h"] is None


def test_resolve_and_parse_labels() -> None:
    classes = ["cat", "dog", "2"]
    assert resolve_label(1, classes) == 1
    assert resolve_label(1.0, classes) == 1
    assert resolve_label("dog", classes) == 1
    assert resolve_label("2", classes) == 2
    assert resolve_label("0", classes) == 0  # a digit string that is not a class name is an index
    for bad in (3, -1, True, None, "cow", 1.5, [1]):
        assert resolve_label(bad, classes) is None
    parsed = parse_labels(
        {"labels": [{"id": "a:0", "label": "cat"}, {"id": "a:0", "label": 1}, {"id": "", "label": 1}, {"id": "b:1"}]},
        classes,
        10,
    )
    assert parsed.labels == [("a:0", 0)] and parsed.duplicate_in_request == ["a:0"] and parsed.invalid == 2
    assert [p["index"] for p in parsed.problems] == [1, 2, 3]
    with pytest.raises(ValueError):
        parse_labels({"labels": "x"}, classes, 10)
    with pytest.raises(OverflowError):
        parse_labels({"labels": [{}] * 11}, classes, 10)
