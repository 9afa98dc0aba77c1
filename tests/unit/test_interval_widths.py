"""Every interval's width against its analytic formula on small windows computed by hand.

An interval that collapses to zero width, or that leaves out one of its variance terms, still passes
tests that only check ``lower <= value <= upper``; these cases pin each term to a number worked out
in the comments, through the estimator registry (:func:`estimate_all`) as reports read it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import (
    estimate_all,
    estimate_window,
    rogan_gladen,
    split_floored,
    split_half_widths,
    window_trust,
)
from agent.estimation.estimators.shift_aware import ShiftAwareParts, shift_aware, window_features
from agent.estimation.estimators.shift_calibration import ShiftCalibration
from agent.estimation.estimators.tree_ensemble import TreeEnsemble
from agent.estimation.estimators.trust import KindSupport, TrustModel
from agent.estimation.intervals import Z95, Estimate
from agent.estimation.layout import MEAN_CONFIDENCE, REDUCED_FEATURES
from agent.estimation.statistics.reference import InputReference
from agent.estimation.statistics.window import WindowStats

#: 100 predictions, half at confidence 0.6 and half at 0.8: mean 0.7, unbiased variance
#: 50·0.1²·2 / 99 = 1/99, outcome variance Σc(1 − c) = 50·0.24 + 50·0.16 = 20.
HALF_AND_HALF = np.r_[np.full(50, 0.6), np.full(50, 0.8)]
#: its mean-confidence half-width: 1.96 · √(var(c)/n + Σc(1 − c)/n²) = 1.96 · √(1/9900 + 0.002)
MEAN_HALF = Z95 * math.sqrt(1 / 9900 + 0.002)


def _cal(**kw: object) -> EstimatorCalibration:
    base: dict[str, object] = dict(
        tpr=0.8, fpr=0.1, n_wrong=25, n_right=100, accuracy=0.75, avg_conf=0.8, atc_threshold=0.7
    )
    base.update(kw)
    return EstimatorCalibration(**base)  # type: ignore[arg-type]


#: The calibration split of :func:`_cal` (100 right of 125): its accuracy 0.8 and its Wilson 95% interval
#: [0.721410, 0.860701] reach 0.0786 below and 0.0607 above, the floor of every estimator calibrated on it.
SPLIT_BELOW, SPLIT_ABOVE = 0.8 - 0.721410, 0.860701 - 0.8


def _floored(value: float, half: float) -> tuple[float, float, float]:
    """``value`` with a half-width ``half`` combined in quadrature with the split's (clipped to [0, 1])."""
    lo, hi = value - math.hypot(half, SPLIT_BELOW), value + math.hypot(half, SPLIT_ABOVE)
    return value, max(lo, 0.0), min(hi, 1.0)


def _wilson_var(x: float, n: float) -> float:
    """A proportion's variance with Wilson's pseudo-counts: p̃(1 − p̃)/(n + z²), p̃ = (x + z²/2)/(n + z²)."""
    z2 = Z95 * Z95
    p = (x + z2 / 2) / (n + z2)
    return p * (1 - p) / (n + z2)


def test_the_split_floor_is_the_wilson_interval_of_the_calibration_accuracy() -> None:
    """100 right of 125: Wilson's centre (0.8 + z²/250)/(1 + z²/125) = 0.7911 ± z·√(0.00128 + z²/62500)
    /(1 + z²/125) = 0.0696, i.e. [0.7214, 0.8607]; an estimate of half-width 0.05 at 0.7 becomes
    0.7 − √(0.05² + 0.0786²), 0.7 + √(0.05² + 0.0607²); one at 0.98 is clipped at 1."""
    assert split_half_widths(25, 125) == pytest.approx((SPLIT_BELOW, SPLIT_ABOVE), abs=1e-6)
    e = split_floored(Estimate(0.7, 0.65, 0.75, 100), _cal())
    assert (e.value, e.lower, e.upper) == pytest.approx(_floored(0.7, 0.05), abs=1e-6)
    top = split_floored(Estimate(0.98, 0.96, 1.0, 100), _cal())
    assert top.upper == 1.0 and top.lower == pytest.approx(0.98 - math.hypot(0.02, SPLIT_BELOW), abs=1e-6)
    # no wrong prediction in the split: the floor above is 0, the one below is not
    below, above = split_half_widths(0, 500)
    assert above == 0.0 and below == pytest.approx(1 - 1 / (1 + Z95**2 / 500), abs=1e-9)


def _stats(conf: np.ndarray, fails: int = 0, cal: EstimatorCalibration | None = None) -> WindowStats:
    verdicts = np.r_[np.full(fails, 3), np.zeros(len(conf) - fails)].astype(np.int64)  # 3: fail:adi
    return WindowStats.of_samples(verdicts, conf, (cal or _cal()).atc_threshold)


def test_confidence_intervals_are_the_mean_sampling_plus_outcome_variance() -> None:
    """``avg_conf``, ``cbpe`` and ``doc`` share one half-width, 0.0898 here, and shift it by their
    offsets: ``cbpe`` by the bins' offsets (0.6 falls in bin 1, 0.8 in bin 2: ½·(−0.05) + ½·(−0.02)),
    ``doc`` by calibration accuracy minus mean confidence (0.75 − 0.8); the two calibrated on the split
    combine it with the split's floor."""
    cal = _cal(conf_offsets=(0.0, -0.05, -0.02, 0.0, 0.0, 0.0))
    est = estimate_all(_stats(HALF_AND_HALF, cal=cal), cal)
    assert MEAN_HALF == pytest.approx(0.089838, abs=1e-6)
    e = est["avg_conf"]
    assert (e.value, e.lower, e.upper) == pytest.approx((0.7, 0.7 - MEAN_HALF, 0.7 + MEAN_HALF), abs=1e-9)
    for name, value in (("cbpe", 0.665), ("doc", 0.65)):
        e = est[name]
        assert (e.value, e.lower, e.upper) == pytest.approx(_floored(value, MEAN_HALF), abs=1e-6)


def test_equal_confidences_still_leave_the_outcomes_uncertain() -> None:
    """100 predictions all at 0.9 have no spread of confidence, but a calibrated model gets about 90 of
    them right, give or take a binomial √(0.9·0.1/100) = 0.03: half-width 1.96 · 0.03, never zero."""
    est = estimate_all(_stats(np.full(100, 0.9)), _cal())["avg_conf"]
    assert (est.lower, est.upper) == pytest.approx((0.9 - Z95 * 0.03, 0.9 + Z95 * 0.03), abs=1e-9)


def test_wilson_interval_of_icos_and_atc_on_8_of_10() -> None:
    """8 passes of 10 (and 8 of 10 confidences above the ATC threshold): Wilson's 95% interval is
    centre (0.8 + z²/20)/(1 + z²/10) = 0.7168 ± z·√(0.016 + z²/400)/(1 + z²/10) = 0.2266; ``atc``, whose
    threshold comes from the calibration split, combines it with the split's floor."""
    conf = np.r_[np.full(2, 0.5), np.full(8, 0.9)]
    est = estimate_all(_stats(conf, fails=2), _cal())
    e = est["icos"]
    assert (e.value, e.lower, e.upper) == pytest.approx((0.8, 0.4902, 0.9433), abs=1e-4)
    a = est["atc"]
    below, above = 0.8 - 0.4902, 0.9433 - 0.8
    expected = (0.8, 0.8 - math.hypot(below, SPLIT_BELOW), 0.8 + math.hypot(above, SPLIT_ABOVE))
    assert (a.value, a.lower, a.upper) == pytest.approx(expected, abs=1e-4)


def test_rogan_gladen_interval_has_the_fail_share_tpr_and_fpr_variances() -> None:
    """TPR 0.8 measured on 25 wrong predictions, FPR 0.1 on 100 right ones, 24 fails among 100
    predictions: accuracy (0.8 − 0.24)/0.7 = 0.8. Delta method with Wilson-type variances (p̃ of
    ``x + z²/2`` successes in ``n + z²``): var = (v(24, 100) + err²·v(20, 25) + acc²·v(10, 100)) /
    (TPR − FPR)², half-width 1.96·√var = 0.1450; through the registry it is combined with the split's
    floor."""
    cal = _cal()
    var = (_wilson_var(24, 100) + 0.04 * _wilson_var(20, 25) + 0.64 * _wilson_var(10, 100)) / 0.49
    half = Z95 * math.sqrt(var)
    assert half == pytest.approx(0.14503, abs=1e-4)
    raw = rogan_gladen(0.24, 100, cal)
    assert (raw.value, raw.lower, raw.upper) == pytest.approx((0.8, 0.8 - half, 0.8 + half), abs=1e-9)
    est = estimate_all(_stats(np.full(100, 0.9), fails=24), cal)["icos_corrected"]
    assert (est.value, est.lower, est.upper) == pytest.approx(_floored(0.8, half), abs=1e-6)
    # a million predictions remove the fail share's noise, not that of TPR and FPR measured on 125
    big = rogan_gladen(0.24, 1_000_000, cal)
    rates = 0.04 * _wilson_var(20, 25) + 0.64 * _wilson_var(10, 100)
    expected = Z95 * math.sqrt((_wilson_var(0.24e6, 1e6) + rates) / 0.49)
    assert (big.upper - big.lower) / 2 == pytest.approx(expected, abs=1e-9)
    assert expected > 0.08
    # each calibration term on its own: a perfect FPR measurement leaves err²·var(TPR), and vice versa
    only_tpr = rogan_gladen(0.24, 1_000_000, _cal(n_right=10**12))
    only_fpr = rogan_gladen(0.24, 1_000_000, _cal(n_wrong=10**12))
    tpr_half = Z95 * math.sqrt(0.04 * _wilson_var(20, 25) / 0.49)
    fpr_half = Z95 * math.sqrt(0.64 * _wilson_var(10, 100) / 0.49)
    assert (only_tpr.upper - only_tpr.lower) / 2 == pytest.approx(tpr_half, abs=2e-5)
    assert (only_fpr.upper - only_fpr.lower) / 2 == pytest.approx(fpr_half, abs=2e-5)


def test_rogan_gladen_without_calibration_counts_assumes_the_widest_rate_variance() -> None:
    """No wrong (or right) prediction in the calibration split: that rate's variance is taken as 1/4,
    the largest a proportion can have, not 0."""
    cal = _cal(n_wrong=0)
    est = rogan_gladen(0.24, 1_000_000, cal)
    expected = Z95 * math.sqrt((_wilson_var(0.24e6, 1e6) + 0.04 * 0.25 + 0.64 * _wilson_var(10, 100)) / 0.49)
    assert est.value - est.lower == pytest.approx(expected, abs=1e-9)  # the upper bound is clipped at 1


# -- shift_aware: a calibration whose forests predict a constant residual, so every term is by hand --------
EDGES = (0.5, 0.75, 0.9)
Q_MODEL = (0.3, 0.2, 0.1, 0.05)


def _reference() -> InputReference:
    return InputReference(
        center=(0.0,), scale=(1.0,), basis=(), pca_edges=(0.1, 0.2, 0.3), rule_label=(), rule_selected=(), leaf_ref=()
    )


def _constant_shift(residual: float, trust: TrustModel | None = None) -> ShiftCalibration:
    """Forests that add ``residual`` to the window's mean confidence whatever its features."""
    forest = TreeEnsemble(init=residual, rate=1.0, trees=())
    return ShiftCalibration(forest, forest, forest, EDGES, Q_MODEL, Q_MODEL, Q_MODEL, _reference(), trust=trust)


def test_shift_aware_interval_combines_model_error_and_sampling_noise() -> None:
    """Mean confidence 0.7 plus a residual of 0.1: 0.8, in the bin (0.75, 0.9] whose model error is
    0.1; sampling noise 1.96·√(0.8·0.2/100) = 0.0784; half-width √(0.1² + 0.0784²) = 0.1271."""
    cal = _cal().with_shift(_constant_shift(0.1))
    raw = shift_aware(_stats(HALF_AND_HALF, cal=cal), cal.shift, cal.conf_offsets).estimate  # type: ignore[arg-type]
    assert (raw.value, raw.lower, raw.upper) == pytest.approx((0.8, 0.8 - 0.127068, 0.8 + 0.127068), abs=1e-5)
    est = estimate_all(_stats(HALF_AND_HALF, cal=cal), cal)["shift_aware"]  # with the split's floor
    assert (est.value, est.lower, est.upper) == pytest.approx(_floored(0.8, 0.127068), abs=1e-5)
    # 0.95 lies above 0.9: model error 0.05, sampling 1.96·√(0.95·0.05/100) = 0.0427, half 0.0658
    # (the upper bound is clipped at 1)
    high = shift_aware(_stats(HALF_AND_HALF), _constant_shift(0.25)).estimate
    assert (high.value, high.value - high.lower, high.upper) == pytest.approx((0.95, 0.065762, 1.0), abs=1e-5)
    # a window of a million predictions keeps the model error: nothing in it makes the regression surer
    many = np.tile(HALF_AND_HALF, 10_000)
    big = shift_aware(_stats(many), _constant_shift(0.1)).estimate
    assert (big.upper - big.lower) / 2 == pytest.approx(math.hypot(0.1, Z95 * math.sqrt(0.16 / 1e6)), abs=1e-6)
    # and the sampling noise alone when the model error is 0 (a window of 100 is never certain)
    exact = _constant_shift(0.1)
    exact = ShiftCalibration(
        exact.full, exact.inputs, exact.reduced, EDGES, (0.0,) * 4, (0.0,) * 4, (0.0,) * 4, _reference()
    )
    alone = shift_aware(_stats(HALF_AND_HALF), exact).estimate
    assert (alone.upper - alone.lower) / 2 == pytest.approx(Z95 * 0.04, abs=1e-9)


def _trust_model(x: np.ndarray, *, offset: float, drifted: bool) -> TrustModel:
    """A trust model around window features ``x``: one calibration window ``offset`` away (unit scales,
    radius 1, so the trust distance is ``offset``), and a clean split at ``x`` itself (drift 0) or far
    from it (``drifted``). ``q_clean`` 0.02, ``q_base`` 0.2."""
    f = len(x)
    point = np.array(x, dtype=np.float64)
    point[0] += offset
    clean = np.array(x, dtype=np.float64) + (5.0 if drifted else 0.0)
    support = KindSupport(
        scale=(1.0,) * f,
        points=(tuple(point),),
        radius=1.0,
        clean_mean=tuple(clean),
        clean_spread=(1.0,) * f,
        drift_q90=1.0,
    )
    return TrustModel(kinds={"reduced": support}, q_clean=0.02, q_base=0.2, calibration_errors=100)


def test_shift_aware_interval_follows_the_trust_weight() -> None:
    """The learnt value 0.8 (model error 0.1) is kept where the window drifted from the clean split
    inside the calibration windows' support; where the window looks clean the estimate is the confidence
    estimate 0.7 with the clean windows' error 0.02; far outside the support (distance 2.5) it is the
    confidence estimate with the error over all calibration windows, widened by 2.5/2: 0.2·1.25 = 0.25.
    Each is combined with the sampling noise at the estimate, 1.96·√(v(1 − v)/100)."""
    stats = _stats(HALF_AND_HALF)
    x, kind = window_features(stats, _reference())
    assert kind == "reduced" and len(x) == len(REDUCED_FEATURES) and x[MEAN_CONFIDENCE] == pytest.approx(0.7)

    def half_at(v: float, model: float) -> float:
        return math.hypot(model, Z95 * math.sqrt(v * (1 - v) / 100))

    cases = (
        (_trust_model(x, offset=0.0, drifted=True), 0.8, 0.1, 1.0),
        (_trust_model(x, offset=0.0, drifted=False), 0.7, 0.02, 0.0),
        (_trust_model(x, offset=2.5, drifted=True), 0.7, 0.25, 0.0),
    )
    for model, value, model_err, weight in cases:
        parts = shift_aware(stats, _constant_shift(0.1, model))
        e = parts.estimate
        assert parts.trust is not None and parts.trust.weight == pytest.approx(weight)
        half = half_at(value, model_err)
        assert (e.value, e.lower, e.upper) == pytest.approx((value, value - half, value + half), abs=1e-9)


def test_the_trust_signal_of_one_prediction_is_that_of_its_estimate() -> None:
    """A window of a single prediction has a trust signal, the same as its ``shift_aware`` estimate
    carries (one computation)."""
    stats = _stats(np.array([0.7]))
    x, _ = window_features(stats, _reference())
    cal = _cal().with_shift(_constant_shift(0.1, _trust_model(x, offset=0.0, drifted=True)))
    trust = window_trust(stats, cal)
    assert trust is not None and trust.weight == pytest.approx(1.0)
    assert estimate_window(stats, cal).trust == trust


def test_shift_aware_of_an_empty_window_and_of_one_prediction() -> None:
    """No prediction: [0, 1] around 0 from the reduced model, no features. One prediction at 0.7 plus
    the residual 0.1: 0.8 with model error 0.1 and the sampling noise of one outcome, 1.96·√0.16."""
    cal = _constant_shift(0.1)
    empty = shift_aware(WindowStats(), cal)
    assert empty == ShiftAwareParts(Estimate(0.0, 0.0, 1.0, 0), "reduced", {})
    one = shift_aware(_stats(np.array([0.7])), cal).estimate
    half = math.hypot(0.1, Z95 * 0.4)
    assert (one.value, one.lower, one.upper, one.n) == pytest.approx((0.8, 0.8 - half, 1.0, 1), abs=1e-9)


def test_a_value_on_an_edge_takes_the_model_error_of_the_bin_above() -> None:
    """Bins of predicted accuracy are (…, 0.5], (0.5, 0.75], (0.75, 0.9], (0.9, …) closed on the left:
    0.5 + 0.25 = 0.75 exactly takes the error of (0.75, 0.9], 0.1, not 0.2."""
    est = shift_aware(_stats(np.full(100, 0.5)), _constant_shift(0.25)).estimate
    assert est.value == 0.75
    assert est.upper - est.value == pytest.approx(math.hypot(0.1, Z95 * math.sqrt(0.75 * 0.25 / 100)), abs=1e-12)
