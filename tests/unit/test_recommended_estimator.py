"""Maths of the recommended ``shift_aware`` estimator: cells, input reference, additive window
statistics, the JSON tree ensemble, fitting on labelled windows and the interval."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import RECOMMENDED_ESTIMATOR, estimate_all
from agent.estimation.estimators.shift_aware import class_features, shift_aware, window_features
from agent.estimation.estimators.shift_calibration import ShiftCalibration
from agent.estimation.estimators.tree_ensemble import TreeEnsemble
from agent.estimation.layout import (
    CONF_EDGES,
    FULL_FEATURES,
    INPUTS_FEATURES,
    MEAN_CONFIDENCE,
    N_CELLS,
    N_CONF_BINS,
    REDUCED_FEATURES,
    cell_counts,
    cell_index,
    conf_bins,
)
from agent.estimation.statistics.reference import InputReference
from agent.estimation.statistics.window import SampleExtras, WindowStats
from agent.offline.calibration.estimators.shift_fitting import fit_shift_calibration
from agent.offline.calibration.judged import JudgedSet

D = 6
N_RULES = 5
RNG_TRAIN = np.random.default_rng(42)
TRAIN = RNG_TRAIN.normal(size=(400, D)) @ np.diag([3.0, 2.0, 1.0, 0.1, 0.1, 0.1])
TRAIN_RULES = RNG_TRAIN.integers(0, N_RULES, 400)


#: predicted classes and top-class probabilities of a clean calibration split (3 classes)
CLEAN_LABELS = np.array([0] * 50 + [1] * 30 + [2] * 20)
CLEAN_CONF = np.r_[np.full(50, 0.95), np.full(30, 0.9), np.full(20, 0.8)]


def _reference() -> InputReference:
    return InputReference.fit(
        TRAIN,
        TRAIN[:200],
        per_feature_scale=True,
        rule_label=[0, 1, 2, 0, 1],
        rule_selected=[True, True, False, True, False],
        train_rules=TRAIN_RULES,
        components=3,
        clean_labels=CLEAN_LABELS,
        clean_confidences=CLEAN_CONF,
        n_classes=3,
    )


def _cal(shift: ShiftCalibration | None) -> EstimatorCalibration:
    return EstimatorCalibration(
        tpr=0.8, fpr=0.05, n_wrong=20, n_right=480, accuracy=0.96, avg_conf=0.95, atc_threshold=0.6, shift=shift
    )


def _batch(n: int, acc: float, shift: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A synthetic judged batch: the larger ``shift``, the further the inputs move off the training
    manifold, the less confident the model and the more often the oracle fires."""
    y = rng.integers(0, 3, n)
    correct = rng.uniform(size=n) < acc
    labels = np.where(correct, y, (y + 1) % 3)
    conf = np.clip(
        np.where(correct, rng.beta(20, 1, n), rng.beta(4, 2, n)) - 0.3 * shift * rng.uniform(size=n), 0.34, 1
    )
    probs = np.zeros((n, 3))
    probs[np.arange(n), labels] = conf
    probs[np.arange(n), (labels + 1) % 3] = 1 - conf
    x = rng.normal(size=(n, D)) @ np.diag([3.0, 2.0, 1.0, 0.1, 0.1, 0.1])
    x[:, 3:] += shift * rng.normal(size=(n, 3))
    verdicts = np.where(rng.uniform(size=n) < np.where(correct, 0.05, 0.4), 2, 0)
    rules = rng.integers(0, N_RULES, n)
    return {
        "y": y,
        "correct": correct,
        "labels": labels,
        "conf": conf,
        "probs": probs,
        "x": x,
        "v": verdicts,
        "r": rules,
    }


def _judged(name: str, b: dict[str, np.ndarray], ref: InputReference) -> JudgedSet:
    extras = SampleExtras.compute(b["probs"], b["labels"], b["x"], b["r"], ref)
    return JudgedSet(name, b["v"], b["conf"], b["correct"], b["y"], extras)


def _stats(b: dict[str, np.ndarray], cal: EstimatorCalibration, full: bool = True) -> WindowStats:
    if not full:
        return WindowStats.from_batch(b["v"], b["conf"], cal)
    return WindowStats.from_batch(
        b["v"], b["conf"], cal, probabilities=b["probs"], labels=b["labels"], features=b["x"], tdi_rules=b["r"]
    )


@pytest.fixture(scope="module")
def fitted() -> ShiftCalibration:
    rng = np.random.default_rng(0)
    ref = _reference()
    clean = _judged("clean", _batch(500, 0.95, 0.0, rng), ref)
    shifted = [
        _judged(fam, _batch(400, acc, s, rng), ref)
        for fam in ("a", "b", "c", "d")
        for acc, s in ((0.9, 0.5), (0.75, 1.0), (0.6, 2.0), (0.45, 3.0))
    ]
    return fit_shift_calibration(clean, shifted, ref, n_windows=400, folds=2)


def test_cells_split_by_verdict_and_confidence() -> None:
    assert list(conf_bins(np.array([0.1, 0.6, 0.85, 0.95, 0.99, 0.999]))) == [0, 1, 2, 3, 4, 5]
    assert len(CONF_EDGES) + 1 == N_CONF_BINS
    idx = cell_index(np.array([0, 2, 3]), np.array([0.999, 0.5, 0.85]))
    assert list(idx) == [5, 2 * N_CONF_BINS, 3 * N_CONF_BINS + 2]
    counts = cell_counts(np.array([0, 0, 1]), np.array([0.99, 0.5, 0.7]))
    assert sum(counts) == 3 and len(counts) == N_CELLS


def test_tree_ensemble_matches_scikit_learn_and_round_trips_through_json() -> None:
    from sklearn.ensemble import GradientBoostingRegressor

    rng = np.random.default_rng(3)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    y = np.sin(x[:, 0]) + 0.5 * (x[:, 1] > 0) + 0.1 * rng.normal(size=300)
    ens = TreeEnsemble.fit(x, y, n_trees=40, seed=1)
    ref = GradientBoostingRegressor(n_estimators=40, max_depth=3, learning_rate=0.05, subsample=0.8, random_state=1)
    ref.fit(x, y)
    np.testing.assert_allclose(ens.predict(x), ref.predict(x), atol=1e-9)
    back = TreeEnsemble.from_dict(json.loads(json.dumps(ens.to_dict())))
    np.testing.assert_allclose(back.predict(x), ens.predict(x), atol=1e-12)
    assert back.predict(x[0]).shape == (1,)


def test_input_reference_scores_off_manifold_inputs_higher() -> None:
    ref = _reference()
    on = ref.pca_error(TRAIN[200:])
    off = TRAIN[200:].copy()
    off[:, 3:] += 2.0
    assert ref.pca_error(off).mean() > 3 * on.mean()
    assert len(ref.pca_edges) == 3 and list(ref.pca_edges) == sorted(ref.pca_edges)
    assert sum(ref.leaf_ref) == pytest.approx(1.0)
    back = InputReference.from_dict(json.loads(json.dumps(ref.to_dict())))
    np.testing.assert_allclose(back.pca_error(off), ref.pca_error(off))


def _direct_pca_error(ref: InputReference, f: np.ndarray) -> np.ndarray:
    """The definition: ``z = (f − center) / scale``, RMS of ``z − (z Bᵀ) B``, in float64."""
    z = (np.asarray(f, np.float64).reshape(len(f), -1) - np.asarray(ref.center)) / np.asarray(ref.scale)
    b = np.asarray(ref.basis, np.float64)
    r = z - (z @ b.T) @ b
    return np.sqrt((r * r).mean(axis=1))


@pytest.mark.parametrize("per_feature_scale", [False, True])
def test_pca_error_equals_its_definition(per_feature_scale: bool) -> None:
    """The global-scale (image) path computes the error through ‖z‖² − ‖Bz‖² in float32; it must
    agree with the definition in and far outside the training distribution, batch by batch."""
    rng = np.random.default_rng(5)
    train = rng.uniform(0, 255, (400, 49)) * (rng.uniform(size=49) > 0.3)  # pixel-like, some dead pixels
    ref = InputReference.fit(train, train[:100], per_feature_scale=per_feature_scale, components=8)
    live = np.concatenate([train[:50], 3.0 * train[50:80] + 40.0, rng.normal(0, 1, (20, 49))]).astype(np.float32)
    want = _direct_pca_error(ref, live)
    np.testing.assert_allclose(ref.pca_error(live), want, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(ref.pca_error(live.astype(np.float64)), want, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(ref.pca_error(live[:1]), want[:1], rtol=1e-4, atol=1e-7)
    assert ref.pca_error(live[:0]).shape == (0,)


@given(st.integers(1, 40), st.integers(1, 40), st.integers(0, 10_000))
@settings(max_examples=25, deadline=None)
def test_window_stats_are_additive_with_the_optional_inputs(n1: int, n2: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ref = _reference()
    cal = _cal(None)
    b1, b2 = _batch(n1, 0.8, 1.0, rng), _batch(n2, 0.6, 2.0, rng)
    both = {k: np.concatenate([b1[k], b2[k]]) for k in b1}

    def stats(b: dict[str, np.ndarray]) -> WindowStats:
        ex = SampleExtras.compute(b["probs"], b["labels"], b["x"], b["r"], ref)
        return WindowStats.of_samples(b["v"], b["conf"], cal.atc_threshold, ex, ref)

    a, b, ab = stats(b1), stats(b2), stats(both)
    s = a + b
    assert s.cells == ab.cells and s.leaves == ab.leaves and s.pca_bins == ab.pca_bins
    assert s.n_ext == ab.n_ext == n1 + n2 and s.tdi_agree == ab.tdi_agree and s.tdi_covered == ab.tdi_covered
    assert s.pca_sum == pytest.approx(ab.pca_sum) and s.margin_sum == pytest.approx(ab.margin_sum)
    assert s.n_cls == ab.n_cls == n1 + n2 and s.class_counts == ab.class_counts
    assert s.class_conf == pytest.approx(ab.class_conf)
    d = ab - b
    assert d.leaves == a.leaves and d.n_ext == a.n_ext and d.pca_bins == a.pca_bins
    assert d.class_counts == a.class_counts and d.class_conf == pytest.approx(a.class_conf)
    inplace = a.copy()
    inplace.add_in_place(b)
    assert inplace.class_counts == ab.class_counts and inplace.class_conf == pytest.approx(ab.class_conf)
    # an empty window adds like zero; dicts round-trip; old dicts without the new fields still load
    assert (WindowStats() + a).leaves == a.leaves
    assert WindowStats.from_dict(json.loads(json.dumps(ab.to_dict()))) == ab
    old = {
        k: v
        for k, v in ab.to_dict().items()
        if k in ("n", "fails", "fails_by_family", "conf_sum", "conf_sq_sum", "atc_above")
    }
    restored = WindowStats.from_dict(old)
    assert restored.n_ext == 0 and sum(restored.cells) == 0


def test_fit_recovers_accuracy_and_the_interval_covers(fitted: ShiftCalibration) -> None:
    assert fitted.families == ("a", "b", "c", "d") and fitted.lofo_mae >= 0
    assert list(fitted.q_full) == sorted(fitted.q_full, reverse=True)  # wider for lower accuracy
    rng = np.random.default_rng(7)
    cal = _cal(fitted)
    for acc, shift, tol in ((0.95, 0.0, 0.04), (0.6, 2.0, 0.1)):
        b = _batch(1000, acc, shift, rng)
        truth = float(b["correct"].mean())
        parts = shift_aware(_stats(b, cal), fitted)
        assert parts.model == "full" and set(parts.features) == set(FULL_FEATURES)
        assert abs(parts.estimate.value - truth) < tol
        assert parts.estimate.lower <= truth <= parts.estimate.upper


def test_without_the_optional_inputs_the_reduced_model_is_used(fitted: ShiftCalibration) -> None:
    rng = np.random.default_rng(8)
    cal = _cal(fitted)
    b = _batch(800, 0.95, 0.0, rng)
    reduced = _stats(b, cal, full=False)
    parts = shift_aware(reduced, fitted)
    assert parts.model == "reduced" and set(parts.features) == set(REDUCED_FEATURES)
    assert abs(parts.estimate.value - float(b["correct"].mean())) < 0.05
    # a window mixing batches with and without the inputs falls back as well
    mixed = reduced + _stats(_batch(100, 0.9, 0.5, rng), cal)
    assert window_features(mixed, fitted.reference)[1] == "reduced"
    assert shift_aware(mixed, fitted).model == "reduced"


def test_without_the_predicted_labels_the_inputs_model_is_used(fitted: ShiftCalibration) -> None:
    rng = np.random.default_rng(10)
    cal = _cal(fitted)
    b = _batch(800, 0.9, 0.5, rng)
    ex = SampleExtras.compute(b["probs"], b["labels"], b["x"], b["r"], fitted.reference)
    no_labels = WindowStats.of_samples(b["v"], b["conf"], cal.atc_threshold, replace(ex, label=None), fitted.reference)
    assert no_labels.n_ext == 800 and no_labels.n_cls == 0
    parts = shift_aware(no_labels, fitted)
    assert parts.model == "inputs" and set(parts.features) == set(INPUTS_FEATURES)
    assert abs(parts.estimate.value - float(b["correct"].mean())) < 0.1
    # one batch without labels in a window sends the whole window to the inputs model
    assert shift_aware(no_labels + _stats(_batch(50, 0.9, 0.5, rng), cal), fitted).model == "inputs"
    assert shift_aware(_stats(b, cal), fitted).model == "full"


def test_class_features_see_a_collapse_onto_one_class_but_not_a_change_of_class_mix() -> None:
    ref = _reference()
    assert ref.n_classes == 3 and ref.class_conf[0] > ref.class_conf[2]

    def stats(labels: np.ndarray, conf: np.ndarray) -> WindowStats:
        n = len(labels)
        ex = SampleExtras(np.ones(n), np.zeros(n, np.int64), np.ones(n, bool), np.ones(n, bool), np.zeros(n), labels)
        return WindowStats.of_samples(np.zeros(n, np.int8), conf, 0.5, ex, ref)

    clean = class_features(stats(CLEAN_LABELS, CLEAN_CONF), ref)
    # label shift: mostly class 0, at its usual confidence -> no confidence drop
    mix = class_features(stats(np.r_[np.zeros(90, np.int64), [1] * 5, [2] * 5], np.full(100, 0.95)), ref)
    # collapse: most inputs predicted as class 2 with a low confidence
    collapse = class_features(stats(np.r_[np.full(90, 2), [0] * 5, [1] * 5], np.full(100, 0.5)), ref)
    assert 0.9 < clean[0] <= 1.0 and clean[1] == pytest.approx(0.5)
    assert mix[2] <= 1e-9 < collapse[2] and collapse[1] == pytest.approx(0.9) and collapse[0] < clean[0]


def test_estimate_all_and_json_round_trip(fitted: ShiftCalibration) -> None:
    rng = np.random.default_rng(9)
    b = _batch(200, 0.9, 0.5, rng)
    assert RECOMMENDED_ESTIMATOR not in estimate_all(_stats(b, _cal(None)), _cal(None))
    cal = _cal(fitted)
    e = estimate_all(_stats(b, cal), cal)[RECOMMENDED_ESTIMATOR]
    assert 0 <= e.lower <= e.value <= e.upper <= 1 and e.n == 200
    back = EstimatorCalibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.shift is not None
    e2 = estimate_all(_stats(b, back), back)[RECOMMENDED_ESTIMATOR]
    assert e2.value == pytest.approx(e.value) and e2.upper == pytest.approx(e.upper)
    # bundles without a shift calibration, or with the older cell-table format, lose only this estimator
    base = {k: v for k, v in cal.to_dict().items() if k != "shift"}
    assert EstimatorCalibration.from_dict(base).shift is None
    assert EstimatorCalibration.from_dict({**base, "shift": {"p_id": [0.5] * 6, "d0": 0.1}}).shift is None
    # ... and so do those of the previous window-regression format (no class features, no inputs model)
    previous = {k: v for k, v in cal.to_dict()["shift"].items() if k not in ("inputs", "q_inputs")}  # type: ignore[union-attr]
    assert EstimatorCalibration.from_dict({**base, "shift": {**previous, "kind": "window_regression"}}).shift is None


def test_residual_target_adds_the_mean_confidence_and_older_bundles_predict_accuracy(
    fitted: ShiftCalibration,
) -> None:
    assert fitted.target == "residual"
    rng = np.random.default_rng(11)
    cal = _cal(fitted)
    x, kind = window_features(_stats(_batch(500, 0.8, 1.0, rng), cal), fitted.reference)
    assert kind == "full"
    tree_only = float(fitted.full.predict(x[None])[0])
    assert float(fitted.predict("full", x)[0]) == pytest.approx(tree_only + x[MEAN_CONFIDENCE])
    # the same trees read from a bundle written before the residual target predict accuracy directly
    older = {k: v for k, v in fitted.to_dict().items() if k != "target"}
    as_accuracy = ShiftCalibration.from_dict(json.loads(json.dumps(older)))
    assert as_accuracy.target == "accuracy"
    assert float(as_accuracy.predict("full", x)[0]) == pytest.approx(tree_only)
    assert ShiftCalibration.from_dict(json.loads(json.dumps(fitted.to_dict()))).target == "residual"
    with pytest.raises(ValueError, match="unknown shift calibration target"):
        ShiftCalibration.from_dict({**fitted.to_dict(), "target": "logit"})


def test_a_window_s_trust_comes_from_its_shift_aware_estimate(fitted: ShiftCalibration) -> None:
    """``estimate_window`` gives the trust signal of the same ``shift_aware`` computation as its
    estimate, equal to what ``window_trust`` computes on its own."""
    from agent.estimation.estimators.registry import ShiftAwareEstimate, estimate_window, window_trust

    assert fitted.trust is not None
    cal = _cal(fitted)
    stats = _stats(_batch(400, 0.7, 1.5, np.random.default_rng(9)), cal)
    window = estimate_window(stats, cal)
    sa = window.estimates["shift_aware"]
    assert isinstance(sa, ShiftAwareEstimate) and sa.trust is window.trust
    alone = window_trust(stats, cal)
    assert window.trust is not None and alone is not None
    assert window.trust.to_dict() == alone.to_dict()
    assert set(sa.to_dict()) == {"value", "lower", "upper", "n"}
