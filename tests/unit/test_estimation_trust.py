"""The trust distance, the shrinkage toward the confidence estimate and the ``cbpe`` estimator."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import estimate_all
from agent.estimation.estimators.trust import (
    MIN_CALIBRATION_ERRORS,
    KindSupport,
    Trust,
    TrustModel,
    blend,
    confidence_base,
    confidence_offsets,
    ramp,
)
from agent.estimation.layout import N_CONF_BINS
from agent.estimation.statistics.window import WindowStats
from agent.offline.fit import fit_warnings
from exporters.prometheus import EstimatesCollector, Snapshot, WindowPoint


def _support(seed: int = 0) -> KindSupport:
    rng = np.random.default_rng(seed)
    windows = rng.normal(0.0, 1.0, (300, 4))
    clean = rng.normal(0.0, 0.02, (80, 4))  # clean windows of 1,000 samples: spread 0.02 ≈ 0.63/√1000
    return KindSupport.fit(windows, clean, np.full(80, 1000.0), rng)


def test_offsets_vanish_when_the_calibration_split_holds_too_few_errors() -> None:
    conf = np.full(500, 0.95)
    correct = np.ones(500, dtype=bool)
    correct[: MIN_CALIBRATION_ERRORS - 1] = False
    assert confidence_offsets(conf, correct) == (0.0,) * N_CONF_BINS


def test_offsets_measure_overconfidence_per_bin() -> None:
    conf = np.full(1000, 0.95)  # the 0.9–0.97 bin
    correct = np.arange(1000) % 5 != 0  # 80% right: 15 points overconfident
    off = confidence_offsets(conf, correct)
    pooled = 1000 * (0.8 - 0.95) / (1000 + 20)  # the split's offset, shrunk toward 0 by 20 pseudo-samples
    assert off[3] == pytest.approx((1000 * (0.8 - 0.95) + 20 * pooled) / (1000 + 20))
    assert all(v == pytest.approx(pooled) for i, v in enumerate(off) if i != 3)  # empty bins: the split's
    assert confidence_base([0, 0, 0, 0.5, 0.5, 0], 0.9, off) == pytest.approx(0.9 + 0.5 * off[3] + 0.5 * off[4])
    assert confidence_base([1.0], 0.7, ()) == 0.7


def test_thin_bins_of_an_underconfident_model_borrow_its_overall_offset() -> None:
    """A model right 90% of the time at 0.75 confidence is underconfident in its thin bins too: they
    borrow the split's +0.15 rather than fall to 0 (which put the CBPE-style estimate of such a model
    near raw confidence), but never claim an accuracy above 1."""
    conf = np.concatenate([np.full(950, 0.75), np.full(10, 0.85), np.full(40, 0.999)])
    correct = np.concatenate([np.arange(950) % 10 != 0, np.ones(10, dtype=bool), np.ones(40, dtype=bool)])
    off = confidence_offsets(conf, correct)  # bins: <0.6, 0.6–0.8, 0.8–0.9, 0.9–0.97, 0.97–0.995, ≥0.995
    assert off[1] == pytest.approx(0.15, abs=0.01)
    assert off[0] == pytest.approx(0.14, abs=0.01)  # an empty bin: the split's offset
    assert off[3] == pytest.approx(0.1)  # the split's offset, capped: accuracy ≤ 1 from confidence 0.9
    assert off[2] == pytest.approx((10 * 0.15 + 20 * 0.14) / 30, abs=0.01)  # 10 samples pulled toward it
    assert off[4] == pytest.approx(0.03) and off[5] == pytest.approx(0.005)  # capped: accuracy ≤ 1


def test_ramp() -> None:
    assert ramp(0.5, 1.0, 2.0) == 0.0
    assert ramp(1.5, 1.0, 2.0) == pytest.approx(0.5)
    assert ramp(3.0, 1.0, 2.0) == 1.0
    assert ramp(1.0, 1.0, 1.0) == 0.0 and ramp(1.1, 1.0, 1.0) == 1.0


def test_support_distance_is_small_inside_and_large_outside() -> None:
    sup = _support()
    inside = [sup.distance(np.array(p) * np.array(sup.scale)) for p in sup.points[:50]]
    assert np.median(inside) < 1.0
    assert sup.distance(np.full(4, 8.0)) > 2.0


def test_a_feature_constant_in_calibration_does_not_blow_up_the_distance() -> None:
    """A confidence bin an underconfident model never reached at fit (its share always 0) that a few
    live samples reach moves the window by a tenth of the other features' median spread per unit of
    that spread, not by millions: the distance stays readable and still says 'outside'."""
    rng = np.random.default_rng(0)
    windows = np.c_[rng.normal(0.0, 1.0, (300, 4)), np.zeros(300)]
    clean = np.c_[rng.normal(0.0, 0.02, (80, 4)), np.zeros(80)]
    sup = KindSupport.fit(windows, clean, np.full(80, 1000.0), rng)
    assert min(sup.scale) == pytest.approx(0.1 * float(np.median(sup.scale[:4])))
    moved = sup.distance(np.r_[np.array(sup.points[0][:4]) * np.array(sup.scale[:4]), 0.5])
    assert 1.0 < moved < 100.0


def test_a_table_feature_constant_in_training_does_not_blow_up_the_pca_error() -> None:
    """A pixel always 0 in the training split that a live sample sets to 2: its PCA error is a few
    standardised units (its scale is a tenth of the median spread), not 1e9 (a scale of 1e-9)."""
    from agent.estimation.statistics.reference import InputReference

    rng = np.random.default_rng(1)
    train = np.c_[rng.normal(0.0, 4.0, (500, 6)), np.zeros(500)]
    ref = InputReference.fit(train, train[:100], per_feature_scale=True, components=3)
    assert ref.scale[-1] == pytest.approx(0.1 * float(np.median(ref.scale[:6])))
    live = train[:10].copy()
    live[:, -1] = 2.0
    err = ref.pca_error(live)
    assert np.all(err > ref.pca_error(train[:10])) and float(err.max()) < 10.0


def test_drift_is_scaled_by_the_window_size() -> None:
    sup = _support()
    assert sup.drift(np.zeros(4), 1000) < sup.drift_q90 * 1.5
    shifted = np.array(sup.clean_mean) + 3 * sup.drift_q90 * np.array(sup.clean_spread) / math.sqrt(1000)
    assert sup.drift(shifted, 1000) == pytest.approx(3 * sup.drift_q90)
    assert sup.drift(shifted, 4000) == pytest.approx(2 * sup.drift(shifted, 1000))
    assert sup.drift(shifted, 1000) > 2 * sup.drift_q90


def _model(errors: int = 50) -> TrustModel:
    return TrustModel({"reduced": _support()}, q_clean=0.02, q_base=0.2, calibration_errors=errors)


def test_trust_keeps_the_learnt_correction_only_for_drifted_windows_inside_the_support() -> None:
    m = _model()
    clean = m.trust("reduced", np.zeros(4), 1000)
    assert clean.calibrated and clean.weight == 0.0  # looks like the calibration split: confidence
    drifted = m.trust("reduced", np.full(4, 0.3), 1000)
    assert drifted.calibrated and drifted.weight == 1.0  # shifted, inside the support: learnt
    far = m.trust("reduced", np.full(4, 8.0), 1000)
    assert not far.calibrated and far.weight == 0.0 and far.distance > 2.0
    # a calibration split with too few errors needs stronger evidence of drift before correcting
    sup = m.kinds["reduced"]
    mild = np.array(sup.clean_mean) + 1.5 * sup.drift_q90 * np.array(sup.clean_spread) / math.sqrt(1000)
    assert m.trust("reduced", mild, 1000).weight == pytest.approx(0.5)
    assert _model(errors=2).trust("reduced", mild, 1000).weight == 0.0


def test_blend_widens_the_interval_where_the_correction_is_dropped() -> None:
    m = _model()
    value, half = blend(0.7, 0.9, 0.05, Trust(0.5, True, 9.0, 1.0), m)
    assert (value, half) == (pytest.approx(0.7), pytest.approx(0.05))
    value, half = blend(0.7, 0.9, 0.05, Trust(0.5, True, 0.1, 0.0), m)
    assert (value, half) == (pytest.approx(0.9), pytest.approx(0.02))  # clean: the confidence's own error
    value, half = blend(0.7, 0.9, 0.05, Trust(3.0, False, 50.0, 0.0), m)
    # outside: its error under shift, widened in proportion to the distance beyond 2
    assert (value, half) == (pytest.approx(0.9), pytest.approx(0.2 * 3.0 / 2.0))
    assert blend(0.7, 0.9, 0.05, Trust(2.0, False, 50.0, 0.0), m)[1] == pytest.approx(0.2)
    value, half = blend(0.7, 0.9, 0.05, Trust(1.5, False, 50.0, 0.5), m)
    assert value == pytest.approx(0.8) and 0.05 < half < 0.2


def test_drift_counts_the_clean_split_own_sampling_error() -> None:
    rng = np.random.default_rng(3)
    clean = rng.normal(0.0, 0.02, (80, 4))
    small = KindSupport.fit(rng.normal(0.0, 1.0, (100, 4)), clean, np.full(80, 1000.0), rng, n_clean=150)
    x = np.array(small.clean_mean) + 0.01
    # a 150-sample split's mean is itself uncertain: a live window of 1000 is judged against both errors
    assert small.drift(x, 1000) == pytest.approx(
        small.drift(x, 1000, resample=True) * math.sqrt(1 / 1000 / (1 / 1000 + 1 / 150))
    )


def test_trust_model_round_trips_through_json() -> None:
    m = _model()
    back = TrustModel.from_dict(m.to_dict())
    x = np.array([0.3, -0.2, 0.1, 0.0])
    assert back.trust("reduced", x, 500) == m.trust("reduced", x, 500)


def test_cbpe_adds_the_calibration_offsets_and_old_bundles_read_without_them() -> None:
    rng = np.random.default_rng(1)
    conf = rng.uniform(0.5, 1.0, 2000)
    correct = rng.uniform(size=2000) < conf - 0.1  # overconfident by 0.1
    cal = EstimatorCalibration.fit(conf, correct, np.zeros(2000, dtype=bool))
    assert len(cal.conf_offsets) == N_CONF_BINS and max(cal.conf_offsets) < 0
    stats = WindowStats.of_samples(np.zeros(1000, dtype=np.int64), conf[:1000], cal.atc_threshold)
    est = estimate_all(stats, cal)
    assert est["cbpe"].value < est["avg_conf"].value - 0.05
    assert abs(est["cbpe"].value - correct[:1000].mean()) < abs(est["avg_conf"].value - correct[:1000].mean())
    old = {k: v for k, v in cal.to_dict().items() if k != "conf_offsets"}
    legacy = EstimatorCalibration.from_dict(old)
    assert legacy.conf_offsets == ()
    assert estimate_all(stats, legacy)["cbpe"].value == pytest.approx(est["avg_conf"].value)
    assert EstimatorCalibration.from_dict(cal.to_dict()) == cal


def test_fit_warns_when_the_calibration_split_holds_too_few_errors() -> None:
    conf = np.full(450, 0.99)
    correct = np.ones(450, dtype=bool)
    correct[:2] = False
    cal = EstimatorCalibration.fit(conf, correct, ~correct)  # an oracle that catches every error
    assert cal.too_few_errors
    (warning,) = fit_warnings(cal)
    assert "2 wrong prediction(s) of 450" in warning
    correct[:40] = False
    assert fit_warnings(EstimatorCalibration.fit(conf, correct, ~correct)) == []


def test_fit_warns_of_a_weak_oracle_and_reports_mark_what_it_cannot_tell() -> None:
    """An oracle whose TPR − FPR is below 0.2 gets a warning naming what helps; icos and icos_corrected
    are then marked unreliable, as is any estimate whose interval is wider than 0.5."""
    from agent.estimation.estimators.reliability import unreliable
    from agent.estimation.intervals import Estimate

    rng = np.random.default_rng(0)
    correct = rng.uniform(size=600) < 0.85
    fails = rng.uniform(size=600) < 0.2  # fires as often on right as on wrong predictions
    weak = EstimatorCalibration.fit(np.full(600, 0.9), correct, fails)
    (warning,) = fit_warnings(weak)
    assert "separates right from wrong predictions poorly" in warning and "--trees" in warning
    narrow = Estimate(0.8, 0.78, 0.82, 600)
    assert "oracle" in (unreliable("icos_corrected", narrow, weak) or "")
    assert unreliable("avg_conf", narrow, weak) is None
    assert "interval is 0.60 wide" in (unreliable("cbpe", Estimate(0.5, 0.2, 0.8, 50), weak) or "")


def test_trust_distance_is_exported_per_window() -> None:
    reg = CollectorRegistry()
    snap = Snapshot("m", "1", [], [WindowPoint("1h", 500, {}, 1.25), WindowPoint("count", 0, {}, None)])
    reg.register(EstimatesCollector(lambda: snap))
    text = generate_latest(reg).decode()
    assert 'icos_estimate_trust_distance{model="m",version="1",window="1h"} 1.25' in text
    assert 'window="count"} ' not in text.split("icos_estimate_trust_distance")[-1]
