"""Estimator maths: intervals, Rogan–Gladen correction, ATC threshold, additive window statistics."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.estimation.calibration import EstimatorCalibration, atc_threshold
from agent.estimation.estimators.registry import (
    ESTIMATORS,
    REGISTRY,
    estimate_all,
    estimator_names,
    register_estimator,
    rogan_gladen,
)
from agent.estimation.intervals import Estimate, wilson
from agent.estimation.statistics.window import WindowStats
from agent.judging.windows import WindowSet


def _cal(**kw: float) -> EstimatorCalibration:
    base = dict(tpr=0.8, fpr=0.05, n_wrong=200, n_right=800, accuracy=0.8, avg_conf=0.85, atc_threshold=0.6)
    base.update(kw)
    return EstimatorCalibration(**base)  # type: ignore[arg-type]


def test_wilson_matches_reference_values() -> None:
    # Reference: 81 successes of 263 -> (0.2553, 0.3662) (Wilson 1927 / Newcombe 1998 worked example style)
    lo, hi = wilson(81, 263)
    assert lo == pytest.approx(0.2553, abs=5e-4) and hi == pytest.approx(0.3662, abs=5e-4)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0)
    assert wilson(0, 0) == (0.0, 1.0)


def test_rogan_gladen_inverts_the_observation_model() -> None:
    cal = _cal()
    for acc in (0.5, 0.8, 0.95, 1.0):
        r = cal.tpr * (1 - acc) + cal.fpr * acc  # expected fail share
        est = rogan_gladen(r, 10_000, cal)
        assert est.value == pytest.approx(acc, abs=1e-9)
        assert est.lower <= est.value <= est.upper


def test_rogan_gladen_clips_and_handles_useless_oracle() -> None:
    assert rogan_gladen(0.99, 100, _cal()).value == 0.0
    assert rogan_gladen(0.0, 100, _cal()).value == 1.0
    useless = rogan_gladen(0.3, 100, _cal(tpr=0.1, fpr=0.1))
    assert (useless.lower, useless.upper) == (0.0, 1.0)


@given(st.lists(st.floats(0.1, 1.0), min_size=5, max_size=200), st.floats(0.0, 1.0))
@settings(max_examples=60, deadline=None)
def test_atc_threshold_reproduces_calibration_accuracy(conf: list[float], acc: float) -> None:
    c = np.array(conf)
    t = atc_threshold(c, acc)
    share = float((c > t).mean())
    # ties can only move the share by the tied mass
    ties = float((c == t).mean())
    assert share <= acc + 1.0 / len(c) + 1e-12 or share - ties <= acc + 1.0 / len(c)
    assert share + ties >= acc - 1.0 / len(c) - 1e-12


def test_calibration_fit_counts_rates() -> None:
    conf = np.array([0.9, 0.8, 0.55, 0.99, 0.4, 0.7])
    correct = np.array([1, 1, 0, 1, 0, 1], bool)
    failed = np.array([0, 1, 1, 0, 0, 0], bool)
    cal = EstimatorCalibration.fit(conf, correct, failed)
    assert (cal.n_wrong, cal.n_right) == (2, 4)
    assert cal.tpr == 0.5 and cal.fpr == 0.25
    assert cal.accuracy == pytest.approx(4 / 6)
    assert ((conf > cal.atc_threshold).mean()) == pytest.approx(4 / 6)
    assert EstimatorCalibration.from_dict(cal.to_dict()) == cal


@given(st.integers(1, 60), st.integers(1, 60), st.integers(0, 1000))
@settings(max_examples=40, deadline=None)
def test_window_stats_are_additive(n1: int, n2: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cal = _cal()
    v1, v2 = rng.integers(0, 4, n1), rng.integers(0, 4, n2)
    c1, c2 = rng.uniform(0.1, 1, n1), rng.uniform(0.1, 1, n2)
    a, b = WindowStats.from_batch(v1, c1, cal), WindowStats.from_batch(v2, c2, cal)
    both = WindowStats.from_batch(np.r_[v1, v2], np.r_[c1, c2], cal)
    s = a + b
    assert (s.n, s.fails, s.fails_by_family, s.atc_above) == (both.n, both.fails, both.fails_by_family, both.atc_above)
    assert s.conf_sum == pytest.approx(both.conf_sum)
    back = s - b
    assert (back.n, back.fails, back.fails_by_family) == (a.n, a.fails, a.fails_by_family)
    assert WindowStats.from_dict(s.to_dict()) == s


def test_estimate_all_values() -> None:
    cal = _cal(accuracy=0.9, avg_conf=0.8, atc_threshold=0.5)
    verdicts = np.array([0] * 8 + [2, 3])
    conf = np.array([0.9] * 8 + [0.4, 0.3])
    est = estimate_all(WindowStats.from_batch(verdicts, conf, cal), cal)
    assert est["icos"].value == pytest.approx(0.8)
    assert est["avg_conf"].value == pytest.approx(0.79)
    assert est["atc"].value == pytest.approx(0.8)
    assert est["doc"].value == pytest.approx(0.79 + 0.1)
    assert est["icos_corrected"].value == pytest.approx((0.8 - 0.2) / 0.75)
    for e in est.values():
        assert 0 <= e.lower <= e.value <= e.upper <= 1 and e.n == 10
    assert estimate_all(WindowStats(), cal) == {}


@pytest.fixture
def constant_estimator() -> Iterator[str]:
    """A trivial estimator registered for one test and removed afterwards."""
    name = "constant_half"

    @register_estimator(name)
    def _constant(stats: WindowStats, calibration: EstimatorCalibration) -> Estimate:
        return Estimate(0.5, 0.0, 1.0, stats.n)

    try:
        yield name
    finally:
        del REGISTRY[name]


def test_one_registry_entry_adds_an_estimator_everywhere(constant_estimator: str) -> None:
    rng = np.random.default_rng(3)
    v, c = rng.integers(0, 4, 50).astype(np.int8), rng.uniform(0.3, 1.0, 50)
    stats = WindowStats.of_samples(v, c, 0.6)
    out = estimate_all(stats, _cal())
    assert list(out)[-1] == constant_estimator and out[constant_estimator] == Estimate(0.5, 0.0, 1.0, 50)
    assert constant_estimator in estimator_names()
    windows = WindowSet({"5m": 300.0}, 20)
    windows.record(v, c, _cal(), now=100.0)
    for stats in windows.stats(_cal(), now=100.0).values():
        assert estimate_all(stats, _cal())[constant_estimator].value == 0.5
    with pytest.raises(ValueError, match="already registered"):
        register_estimator(constant_estimator)(lambda s, cal: None)


def test_registry_lists_the_builtin_estimators_in_report_order() -> None:
    assert ESTIMATORS == ("icos", "icos_corrected", "avg_conf", "cbpe", "atc", "doc", "shift_aware")
    assert tuple(REGISTRY)[: len(ESTIMATORS) + 1] == (*ESTIMATORS, "with_labels")
    assert estimator_names(label_free=True)[: len(ESTIMATORS)] == ESTIMATORS
