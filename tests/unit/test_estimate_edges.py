"""The edges of the headline and interval paths: empty and one-prediction windows, the label-needing
estimators, the headline's choice and fallback, the reliability marks at their thresholds, Wilson's
interval of a single trial and the registry's decorator."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators import registry as estimators
from agent.estimation.estimators.prediction_powered import WITH_LABELS, prediction_powered_of_sums
from agent.estimation.estimators.registry import (
    ESTIMATORS,
    NEEDS_LABELS,
    RECOMMENDED_ESTIMATOR,
    REGISTRY,
    TABLE_HEADLINE,
    estimate_all,
    estimate_window,
    estimator_names,
    headline_estimator,
    headline_of,
    register_estimator,
    rogan_gladen,
    split_half_widths,
    trust_of,
    window_trust,
)
from agent.estimation.estimators.reliability import WIDE_INTERVAL, unreliable, weak_oracle
from agent.estimation.estimators.shift_aware import class_features, shift_aware, window_features
from agent.estimation.estimators.shift_calibration import ShiftCalibration
from agent.estimation.estimators.tree_ensemble import TreeEnsemble
from agent.estimation.intervals import Estimate, clip01, wilson
from agent.estimation.layout import (
    FULL_FEATURES,
    INPUTS_FEATURES,
    N_CELLS,
    N_CONF_BINS,
    N_PCA_BINS,
    REDUCED_FEATURES,
)
from agent.estimation.statistics.reference import InputReference
from agent.estimation.statistics.window import WindowStats


def _cal(**kw: object) -> EstimatorCalibration:
    base: dict[str, object] = dict(
        tpr=0.8, fpr=0.1, n_wrong=25, n_right=100, accuracy=0.75, avg_conf=0.8, atc_threshold=0.7
    )
    base.update(kw)
    return EstimatorCalibration(**base)  # type: ignore[arg-type]


def _window(conf: list[float]) -> WindowStats:
    c = np.asarray(conf, dtype=np.float64)
    return WindowStats.of_samples(np.zeros(len(c), dtype=np.int64), c, _cal().atc_threshold)


def test_headline_is_the_bundles_choice_else_the_recommended_estimator() -> None:
    assert headline_estimator(None) == RECOMMENDED_ESTIMATOR == "shift_aware"
    assert headline_estimator("") == RECOMMENDED_ESTIMATOR
    assert headline_estimator(TABLE_HEADLINE) == "doc"


def test_headline_falls_back_to_the_table_headline_and_never_to_a_weaker_estimator() -> None:
    doc, shift = Estimate(0.7, 0.6, 0.8, 10), Estimate(0.9, 0.8, 1.0, 10)
    assert headline_of({"doc": doc, "shift_aware": shift, "avg_conf": doc}, "shift_aware") == ("shift_aware", shift)
    assert headline_of({"doc": doc, "avg_conf": shift}, "shift_aware") == ("doc", doc)
    assert headline_of({"avg_conf": shift, "icos": shift}, "shift_aware") is None
    assert headline_of({}, "doc") is None


def test_an_empty_window_has_no_estimates_and_one_prediction_has_all_label_free_ones() -> None:
    empty = WindowStats.of_samples(np.zeros(0, dtype=np.int64), np.zeros(0), 0.7)
    assert estimate_all(empty, _cal()) == {}
    assert estimate_window(empty, _cal()).estimates == {} and window_trust(empty, _cal()) is None
    one = _window([0.9])
    est = estimate_all(one, _cal())
    assert set(est) == set(ESTIMATORS) - {"shift_aware"}  # no shift calibration in this bundle
    assert est["avg_conf"].value == pytest.approx(0.9) and est["avg_conf"].n == 1
    # a single outcome at 0.9 is right or wrong: ±1.96·0.3, clipped to [0, 1]
    assert (est["avg_conf"].lower, est["avg_conf"].upper) == pytest.approx((0.9 - 1.96 * 0.3, 1.0), abs=1e-3)
    window = estimate_window(one, _cal())
    assert window.stats is one and window.estimates == est and window.trust is None


def test_with_labels_needs_one_labeled_prediction() -> None:
    stats = _window([0.9, 0.8, 0.7])
    assert WITH_LABELS in NEEDS_LABELS and WITH_LABELS not in ESTIMATORS
    assert WITH_LABELS not in estimate_all(stats, _cal())
    labeled = stats + WindowStats.of_labeled_sample(np.array([0.9]), np.array([True]))
    # one label cannot estimate the correction's variance: the Wilson interval of that label alone
    one = estimate_all(labeled, _cal())[WITH_LABELS]
    assert labeled.lab_n == 1 and one.value == 1.0
    assert (one.lower, one.upper) == pytest.approx(wilson(1, 1), abs=1e-12)


def test_trust_of_reads_only_a_shift_aware_estimate() -> None:
    assert trust_of(None) is None
    assert trust_of(Estimate(0.5, 0.4, 0.6, 10)) is None


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    """Estimators registered by the test are removed after it."""
    before = dict(estimators.REGISTRY)
    yield
    estimators.REGISTRY.clear()
    estimators.REGISTRY.update(before)


@pytest.mark.usefixtures("scratch_registry")
def test_register_estimator_adds_once_and_marks_the_label_needing_ones() -> None:
    @register_estimator("test_labelled", needs_labels=True)
    def _labelled(stats: WindowStats, calibration: EstimatorCalibration) -> Estimate:
        return Estimate(0.5, 0.0, 1.0, stats.n)

    @register_estimator("test_free")
    def _free(stats: WindowStats, calibration: EstimatorCalibration) -> Estimate:
        return Estimate(0.25, 0.0, 1.0, stats.n)

    assert "test_labelled" in NEEDS_LABELS and "test_free" not in NEEDS_LABELS
    assert estimator_names()[-2:] == ("test_labelled", "test_free")
    assert estimator_names(label_free=True)[-1] == "test_free"
    assert "test_labelled" not in estimator_names(label_free=True)
    est = estimate_all(_window([0.9, 0.8]), _cal())
    assert "test_labelled" not in est and est["test_free"].value == 0.25
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("test_free")(_free)


@pytest.mark.usefixtures("scratch_registry")
def test_what_an_estimator_is_lives_in_its_spec_and_every_consumer_reads_it() -> None:
    """A toy estimator that rests on the oracle, stands in for nothing itself but falls back to ``doc``, and
    is the default headline of lowest rank: reliability marks, headline fallbacks, the headline's default and
    candidates and the fit's eligibility follow its spec, not its name."""
    from agent.estimation.estimators.registry import default_headline, estimator_specs, headline_candidates
    from agent.offline.calibration.estimators.headline_choice import ineligible

    @register_estimator("test_oracle_led", needs_oracle=True, fallback="doc", default_rank=-1)
    def _never(stats: WindowStats, calibration: EstimatorCalibration) -> Estimate | None:
        return None

    @register_estimator("test_model_led", needs_model=True, headline=False)
    def _half(stats: WindowStats, calibration: EstimatorCalibration) -> Estimate:
        return Estimate(0.5, 0.4, 0.6, stats.n)

    spec = estimator_specs()[-2]
    assert (spec.name, spec.needs_oracle, spec.fallback, spec.headline) == ("test_oracle_led", True, "doc", True)
    narrow = Estimate(0.5, 0.45, 0.55, 100)
    weak = _cal(tpr=0.3, fpr=0.2)
    assert "poorly" in str(unreliable("test_oracle_led", narrow, weak))
    assert unreliable("test_oracle_led", narrow, _cal()) is None
    assert unreliable("test_model_led", narrow, weak) is None
    assert list(ineligible(weak)) == ["icos", "icos_corrected", "test_oracle_led"] and ineligible(_cal()) == {}
    est = estimate_all(_window([0.9, 0.8]), _cal())
    assert "test_oracle_led" not in est and headline_of(est, "test_oracle_led") == ("doc", est["doc"])
    assert default_headline(estimator_names()) == "test_oracle_led"
    assert default_headline(ESTIMATORS) == RECOMMENDED_ESTIMATOR
    assert default_headline(headline_candidates(with_model=False)) == "test_oracle_led"
    assert "test_model_led" not in headline_candidates() and RECOMMENDED_ESTIMATOR in headline_candidates()
    assert RECOMMENDED_ESTIMATOR not in headline_candidates(with_model=False)
    assert default_headline([c for c in ESTIMATORS if c != RECOMMENDED_ESTIMATOR]) == "cbpe"


def test_a_headline_no_estimator_is_registered_under_falls_back_to_the_table_headline() -> None:
    doc = Estimate(0.7, 0.6, 0.8, 50)
    assert headline_of({"doc": doc}, "an_estimator_of_a_newer_fit") == (TABLE_HEADLINE, doc)
    assert headline_estimator(None, with_model=False) == TABLE_HEADLINE


def test_reliability_marks_start_strictly_above_their_thresholds() -> None:
    assert 0.5 - 0.3 == 0.2  # TPR − FPR exactly at the threshold: not weak
    assert not weak_oracle(_cal(tpr=0.5, fpr=0.3))
    assert weak_oracle(_cal(tpr=0.5, fpr=0.31))
    at = Estimate(0.5, 0.25, 0.25 + WIDE_INTERVAL, 100)
    assert unreliable("avg_conf", at, _cal()) is None
    wider = Estimate(0.5, 0.25, 0.76, 100)
    assert unreliable("avg_conf", wider, _cal()) == "its 95% interval is 0.51 wide"
    weak = _cal(tpr=0.3, fpr=0.2)
    assert "poorly (TPR 0.30, FPR 0.20" in str(unreliable("icos", at, weak))
    assert unreliable("doc", at, weak) is None  # a weak oracle says nothing of the confidence estimates


def test_wilson_interval_of_one_trial_and_of_none() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(1, 1)  # z²/(1 + z²) = 0.7934 below 1
    assert (lo, hi) == pytest.approx((1 / (1 + 1.959963984540054**2), 1.0), abs=1e-9)
    lo, hi = wilson(0, 1)
    assert (lo, hi) == pytest.approx((0.0, 1.959963984540054**2 / (1 + 1.959963984540054**2)), abs=1e-9)
    assert clip01(-0.1) == 0.0 and clip01(1.2) == 1.0 and clip01(0.3) == 0.3


def test_rogan_gladen_without_information_or_predictions() -> None:
    """TPR ≤ FPR (and an empty window) give [0, 1] around one minus the fail share."""
    assert rogan_gladen(0.3, 100, _cal(tpr=0.2, fpr=0.2)) == Estimate(0.7, 0.0, 1.0, 100)
    assert rogan_gladen(0.3, 0, _cal()) == Estimate(0.7, 0.0, 1.0, 0)
    # a fail share above TPR: accuracy below 0, clipped, its interval from the delta method around 0
    low = rogan_gladen(0.9, 100, _cal())
    assert low.value == 0.0 and low.lower == 0.0 and 0.0 < low.upper < 0.3
    # a fail share below FPR: accuracy past 1, clipped, and an interval below 1 (never [1, 1])
    high = rogan_gladen(0.0, 1000, _cal())
    assert high.value == 1.0 and high.upper == 1.0 and high.lower < 0.99


def test_few_calibration_errors_leave_no_zero_width_interval() -> None:
    """3 wrong predictions in 237, all of them failed by the oracle, and a window of 1,000 without a
    fail: the Wald variances of TPR (3 of 3) and of the window's fail share (0) are 0 and
    icos_corrected's estimate overshoots 1; every estimator calibrated on that split still gets an
    interval at least as wide as the split's own Wilson interval of its accuracy."""
    cal = EstimatorCalibration.fit(
        np.r_[np.full(3, 0.6), np.full(234, 0.999)],
        np.r_[np.zeros(3, bool), np.ones(234, bool)],
        np.r_[np.ones(3, bool), np.zeros(234, bool)],
    )
    stats = WindowStats.of_samples(np.zeros(1000, dtype=np.int64), np.full(1000, 0.999), cal.atc_threshold)
    below, above = split_half_widths(3, 237)
    assert below > 0.01 and above > 0.005
    for name, e in estimate_all(stats, cal).items():
        assert e.upper - e.lower > 0.0, (name, e)
        if REGISTRY[name].split_calibrated:
            assert e.value - e.lower >= below - 1e-12 or e.lower == 0.0, (name, e)
            assert e.upper - e.value >= above - 1e-12 or e.upper == 1.0, (name, e)


def _reference(class_conf: tuple[float, ...]) -> InputReference:
    return InputReference(
        center=(0.0,),
        scale=(1.0,),
        basis=(),
        pca_edges=(0.1, 0.2, 0.3),
        rule_label=(),
        rule_selected=(),
        leaf_ref=(),
        class_conf=class_conf,
    )


@pytest.mark.parametrize(
    ("class_conf", "counts", "conf_sums", "expected"),
    [
        # three classes, one never predicted: entropy ln 2 / ln 3 of the two halves, the largest share
        # 0.5, the largest share-weighted drop of class confidence 0.5 · (0.7 − 0.6); the unseen class
        # counts with its reference confidence (no drop)
        ((0.9, 0.7, 0.5), [2, 2, 0], [1.6, 1.2, 0.0], (math.log(2) / math.log(3), 0.5, 0.05)),
        # two classes: entropy of (3/4, 1/4) in bits; the second class rose above its reference
        ((0.9, 0.8), [3, 1], [2.4, 0.9], (0.8112781244591328, 0.75, 0.075)),
        # one class (a degenerate model) and one prediction: no entropy, all of the window in it
        ((0.9,), [1], [0.5], (0.0, 1.0, 0.4)),
    ],
)
def test_class_features_by_hand(
    class_conf: tuple[float, ...], counts: list[int], conf_sums: list[float], expected: tuple[float, float, float]
) -> None:
    stats = WindowStats(n=sum(counts), class_counts=counts, class_conf=conf_sums)
    got = class_features(stats, _reference(class_conf))
    assert got.tolist() == pytest.approx(list(expected), abs=1e-12)


def test_class_features_of_a_model_without_class_reference() -> None:
    """A bundle without per-class confidences (``class_conf`` empty): the three class features are 0."""
    assert class_features(WindowStats(n=3), _reference(())).tolist() == [0.0, 0.0, 0.0]


def _full_window() -> WindowStats:
    """Four predictions with every per-sample input: confidences in bins 2, 2, 3 (passes) and 1 (an
    ADI failure), TDI leaves 3 : 1, one PCA error in each bin, predicted classes 3 : 1. Its
    ``fails_by_family`` names only the ADI (as a window read from an older state may)."""
    cells = [0] * N_CELLS
    cells[2], cells[3], cells[3 * N_CONF_BINS + 1] = 2, 1, 1
    return WindowStats(
        n=4,
        fails=1,
        fails_by_family={"adi": 1},
        conf_sum=3.2,
        conf_sq_sum=2.6,
        cells=cells,
        n_ext=4,
        margin_sum=2.0,
        tdi_agree=3,
        tdi_covered=2,
        pca_sum=0.8,
        pca_bins=[1] * N_PCA_BINS,
        leaves=[3, 1],
        n_cls=4,
        class_counts=[3, 1],
        class_conf=[2.5, 0.7],
    )


def test_window_features_are_shares_of_the_window_by_hand() -> None:
    """Every feature is a share or a mean: by hand on four predictions, and unchanged when the window is
    doubled. Leaf total variation against the reference's 1 : 1 is ½(|¾ − ½| + |¼ − ½|) = ¼."""
    ref = InputReference(
        center=(0.0,),
        scale=(1.0,),
        basis=(),
        pca_edges=(0.1, 0.2, 0.3),
        rule_label=(0, 1),
        rule_selected=(True, False),
        leaf_ref=(0.5, 0.5),
        class_conf=(0.9, 0.8),
    )
    stats = _full_window()
    x, kind = window_features(stats, ref)
    assert kind == "full" and len(x) == len(FULL_FEATURES)
    got = dict(zip(FULL_FEATURES, x.tolist(), strict=True))
    bins = [0.0, 0.25, 0.5, 0.25, 0.0, 0.0]
    expected = {
        "mean_confidence": 0.8,
        "fail_idi": 0.0,
        "fail_tdi": 0.0,
        "fail_adi": 0.25,
        "tdi_agreement": 0.75,
        "tdi_coverage": 0.5,
        "tdi_leaf_distance": 0.25,
        "mean_pca_error": 0.2,
        "mean_margin": 0.5,
        **{f"pca_bin_{i}": 0.25 for i in range(N_PCA_BINS)},
    }
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name
    assert x[:N_CONF_BINS].tolist() == pytest.approx(bins, abs=1e-12)
    doubled, kind2 = window_features(stats + stats, ref)
    assert kind2 == "full" and doubled.tolist() == pytest.approx(x.tolist(), abs=1e-12)
    # without TDI rules in the reference there is no leaf distance
    flat = InputReference(
        center=(0.0,), scale=(1.0,), basis=(), pca_edges=(0.1, 0.2, 0.3), rule_label=(), rule_selected=(), leaf_ref=()
    )
    y, kind3 = window_features(stats, flat)
    assert kind3 == "inputs" and dict(zip(INPUTS_FEATURES, y.tolist(), strict=True))["tdi_leaf_distance"] == 0.0
    # an empty window: the reduced model's zeros
    z, kind4 = window_features(WindowStats(), ref)
    assert kind4 == "reduced" and z.tolist() == [0.0] * len(REDUCED_FEATURES)


def test_small_windows_by_hand() -> None:
    """Two predictions at 0.6 and 0.8: ``avg_conf`` 0.7 ± 1.96·√(0.02/2 + 0.4/4) (the unbiased variance
    of two values divides by 1). One prediction with its label: PPI's one-label Wilson interval, with
    the window's size, the label count and λ = 0 (no covariance from one label) reported; at z = 1 the
    Wilson interval of z = 1."""
    est = estimate_all(_window([0.6, 0.8]), _cal())["avg_conf"]
    assert est.lower == pytest.approx(0.7 - 1.959963984540054 * math.sqrt(0.01 + 0.1), abs=1e-12)
    one = prediction_powered_of_sums(1, 0.9, 0.81, 1, 0.9, 0.81, 1.0, 0.9)
    assert one is not None
    assert (one.value, one.lower, one.upper, one.n, one.n_labels, one.power) == pytest.approx(
        (1.0, *wilson(1, 1), 1, 1, 0.0), abs=1e-12
    )
    narrow = prediction_powered_of_sums(1, 0.9, 0.81, 1, 0.9, 0.81, 1.0, 0.9, z=1.0)
    assert narrow is not None and narrow.lower == pytest.approx(wilson(1, 1, z=1.0)[0], abs=1e-12)


def _wilson_var(x: float, n: float) -> float:
    z2 = 1.959963984540054**2
    p = (x + z2 / 2) / (n + z2)
    return p * (1 - p) / (n + z2)


def test_rogan_gladen_rate_variances_at_their_limits() -> None:
    """No right prediction in the calibration split: FPR's variance taken as 1/4. A fail share above
    TPR: accuracy below 0, clipped, the error share clipped to 1 in the delta method (TPR's term alone)
    and the interval around the clipped value."""
    no_right = rogan_gladen(0.7, 1_000_000, _cal(n_right=0))  # accuracy 0.1/0.7, error share 0.6/0.7
    acc, err = 0.1 / 0.7, 0.6 / 0.7
    var = (_wilson_var(0.7e6, 1e6) + err**2 * _wilson_var(20, 25) + acc**2 * 0.25) / 0.49
    assert no_right.upper - no_right.value == pytest.approx(1.959963984540054 * math.sqrt(var), abs=1e-9)
    low = rogan_gladen(0.9, 100, _cal())
    half = 1.959963984540054 * math.sqrt((_wilson_var(90, 100) + 1.0 * _wilson_var(20, 25)) / 0.49)
    assert low.upper == pytest.approx(half, abs=1e-12)


def test_shift_aware_without_a_trust_model_reports_no_trust() -> None:
    forest = TreeEnsemble(init=0.0, rate=1.0, trees=())
    q = (0.05,) * 4
    cal = ShiftCalibration(forest, forest, forest, (0.5, 0.75, 0.9), q, q, q, _reference(()))
    assert shift_aware(_window([0.9, 0.8]), cal).trust is None
