"""Maths of the recommended ``shift_aware`` estimator: cells, distance, weight, interval, fitting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.estimators import (
    CONF_EDGES,
    N_CELLS,
    N_CONF_BINS,
    RECOMMENDED_ESTIMATOR,
    EstimatorCalibration,
    JudgedSet,
    ShiftCalibration,
    WindowStats,
    cell_counts,
    cell_index,
    conf_bins,
    estimate_all,
    fit_shift_calibration,
    shift_aware,
    shift_distance,
    shift_weight,
)


def _shift_cal(**kw: object) -> ShiftCalibration:
    base: dict[str, object] = dict(
        p_id=(0.3, 0.6, 0.8, 0.9, 0.97, 0.995),
        n_id=(10, 20, 30, 40, 100, 300),
        p_shift=tuple([0.2, 0.5, 0.7, 0.85, 0.95, 0.99] + [0.0] * 6 + [0.1] * 6 + [0.15] * 6),
        n_shift=tuple([500] * N_CELLS),
        clean_hist=(0.02, 0.04, 0.06, 0.08, 0.2, 0.6),
        n_clean=500,
        d0=0.05,
        d1=0.25,
        rmse_shift=0.1,
    )
    base.update(kw)
    return ShiftCalibration(**base)  # type: ignore[arg-type]


def _cal(shift: ShiftCalibration | None) -> EstimatorCalibration:
    return EstimatorCalibration(
        tpr=0.8, fpr=0.05, n_wrong=20, n_right=480, accuracy=0.96, avg_conf=0.95, atc_threshold=0.6, shift=shift
    )


def test_cells_split_by_verdict_and_confidence() -> None:
    assert list(conf_bins(np.array([0.1, 0.6, 0.85, 0.95, 0.99, 0.999]))) == [0, 1, 2, 3, 4, 5]
    assert len(CONF_EDGES) + 1 == N_CONF_BINS
    idx = cell_index(np.array([0, 2, 3]), np.array([0.999, 0.5, 0.85]))
    assert list(idx) == [5, 2 * N_CONF_BINS, 3 * N_CONF_BINS + 2]
    counts = cell_counts(np.array([0, 0, 1]), np.array([0.99, 0.5, 0.7]))
    assert sum(counts) == 3 and len(counts) == N_CELLS


def test_distance_is_zero_on_the_calibration_histogram_and_grows_with_shift() -> None:
    cal = _shift_cal()
    same = np.array(cal.clean_hist) * 1000
    assert shift_distance(same, cal) == 0.0
    moved = np.array([0.2, 0.2, 0.2, 0.1, 0.1, 0.2]) * 1000
    far = np.array([0.6, 0.2, 0.1, 0.05, 0.05, 0.0]) * 1000
    assert 0 < shift_distance(moved, cal) < shift_distance(far, cal)
    assert shift_weight(0.0, cal) == 0.0 and shift_weight(1.0, cal) == 1.0
    assert shift_weight(0.15, cal) == pytest.approx(0.5)


def test_in_distribution_window_uses_the_confidence_calibration() -> None:
    cal = _shift_cal()
    by_bin = np.array(cal.clean_hist) * 1000
    cells = np.zeros(N_CELLS)
    cells[:N_CONF_BINS] = by_bin  # all pass
    parts = shift_aware(cells.astype(int).tolist(), cal)
    expected = float((by_bin * np.array(cal.p_id)).sum() / by_bin.sum())
    assert parts.weight == 0.0
    assert parts.estimate.value == pytest.approx(expected)
    assert parts.estimate.lower < parts.estimate.value < parts.estimate.upper
    assert parts.estimate.upper - parts.estimate.lower < 0.05


def test_shifted_window_uses_the_cell_calibration_and_widens_the_interval() -> None:
    cal = _shift_cal()
    cells = np.zeros(N_CELLS, dtype=int)
    cells[0] = 400  # pass, low confidence
    cells[2 * N_CONF_BINS + 0] = 300  # fail:tdi, low confidence
    cells[5] = 300
    parts = shift_aware(cells.tolist(), cal)
    assert parts.weight == 1.0
    assert parts.estimate.value == pytest.approx((400 * 0.2 + 300 * 0.1 + 300 * 0.99) / 1000)
    width = parts.estimate.upper - parts.estimate.lower
    assert width >= 2 * 1.96 * 0.1 - 1e-9  # the leave-one-corruption-out error is part of the interval


def test_estimate_all_adds_shift_aware_only_with_a_shift_calibration() -> None:
    v = np.array([0] * 90 + [2] * 10)
    c = np.linspace(0.5, 1.0, 100)
    without = estimate_all(WindowStats.from_batch(v, c, _cal(None)), _cal(None))
    assert RECOMMENDED_ESTIMATOR not in without
    cal = _cal(_shift_cal())
    est = estimate_all(WindowStats.from_batch(v, c, cal), cal)
    assert RECOMMENDED_ESTIMATOR in est
    e = est[RECOMMENDED_ESTIMATOR]
    assert 0 <= e.lower <= e.value <= e.upper <= 1 and e.n == 100


def test_calibration_round_trips_through_json_dicts() -> None:
    import json

    cal = _cal(_shift_cal(families=("elastic", "gamma")))
    back = EstimatorCalibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back == cal
    old = {k: v for k, v in cal.to_dict().items() if k != "shift"}
    assert EstimatorCalibration.from_dict(old).shift is None


@given(st.integers(1, 50), st.integers(1, 50), st.integers(0, 10_000))
@settings(max_examples=30, deadline=None)
def test_cells_are_additive_and_old_window_dicts_still_load(n1: int, n2: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cal = _cal(_shift_cal())
    v1, v2 = rng.integers(0, 4, n1), rng.integers(0, 4, n2)
    c1, c2 = rng.uniform(0.1, 1, n1), rng.uniform(0.1, 1, n2)
    a, b = WindowStats.from_batch(v1, c1, cal), WindowStats.from_batch(v2, c2, cal)
    both = WindowStats.from_batch(np.r_[v1, v2], np.r_[c1, c2], cal)
    assert (a + b).cells == both.cells
    assert (both - b).cells == a.cells
    old = both.to_dict()
    del old["cells"]
    assert sum(WindowStats.from_dict(old).cells) == 0


def _synthetic_set(name: str, n: int, acc: float, conf_shift: float, rng: np.random.Generator) -> JudgedSet:
    correct = rng.uniform(size=n) < acc
    conf = np.clip(np.where(correct, rng.beta(20, 1, n), rng.beta(3, 2, n)) - conf_shift * rng.uniform(size=n), 0.1, 1)
    verdicts = np.where(rng.uniform(size=n) < np.where(correct, 0.05, 0.4), 2, 0)
    return JudgedSet(name, verdicts, conf, correct)


def test_fit_recovers_accuracy_on_clean_and_shifted_data() -> None:
    rng = np.random.default_rng(0)
    clean = _synthetic_set("clean", 600, 0.95, 0.0, rng)
    shifted = [
        _synthetic_set(fam, 600, acc, s, rng)
        for fam in ("a", "b", "c")
        for acc, s in ((0.9, 0.05), (0.7, 0.15), (0.5, 0.3))
    ]
    sc = fit_shift_calibration(clean, shifted)
    assert sc.families == ("a", "b", "c") and sc.d0 <= sc.d1 and sc.rmse_shift >= 0
    assert len(sc.p_shift) == N_CELLS and all(0 <= p <= 1 for p in sc.p_shift)
    test_clean = _synthetic_set("clean", 2000, 0.95, 0.0, rng)
    parts = shift_aware(cell_counts(test_clean.verdicts, test_clean.confidences), sc)
    assert abs(parts.estimate.value - test_clean.correct.mean()) < 0.03
    test_shift = _synthetic_set("x", 2000, 0.6, 0.25, rng)
    parts = shift_aware(cell_counts(test_shift.verdicts, test_shift.confidences), sc)
    assert parts.weight > 0.5
    assert abs(parts.estimate.value - test_shift.correct.mean()) < 0.1
    assert parts.estimate.lower <= test_shift.correct.mean() <= parts.estimate.upper


def test_fit_without_shifted_sets_falls_back_to_the_confidence_calibration() -> None:
    rng = np.random.default_rng(1)
    sc = fit_shift_calibration(_synthetic_set("clean", 300, 0.9, 0.0, rng), [])
    assert sc.d0 == sc.d1 == 1.0 and sc.families == ()
