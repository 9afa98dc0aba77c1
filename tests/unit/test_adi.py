"""Algorithm-dependent invariants: the random forest over probability vectors, run via ONNX (ICOS §4.4)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from sklearn.ensemble import RandomForestClassifier

from invariants.adi import DEFAULT_TARGET_OPSET, MAX_TREE_SAMPLES, AlgorithmInvariants, forest_onnx
from invariants.fit_params import FitParams
from invariants.onnx_session import OnnxLoadError


def synthetic(n: int, k: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Probability vectors where low top-probability predictions are more often wrong."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(k, 0.4), size=n).astype(np.float32)
    wrong = probs.max(axis=1) + rng.normal(0.0, 0.12, n) < 0.6
    return probs, wrong


@pytest.fixture(scope="module")
def fitted() -> tuple[AlgorithmInvariants, RandomForestClassifier, np.ndarray, np.ndarray]:
    probs, wrong = synthetic(1200)
    adi = AlgorithmInvariants.fit(probs, wrong, seed=7)  # the fit's forest size
    trees = FitParams().n_estimators
    reference = RandomForestClassifier(n_estimators=trees, criterion="entropy", random_state=7, n_jobs=1)
    reference.fit(probs, wrong.astype(np.int64))
    return adi, reference, probs, wrong


def test_onnx_agrees_with_sklearn_on_training_data(
    fitted: tuple[AlgorithmInvariants, RandomForestClassifier, np.ndarray, np.ndarray],
) -> None:
    adi, reference, probs, _ = fitted
    got = adi.evaluate(probs)
    assert got.dtype == np.bool_ and got.shape == (probs.shape[0],)
    assert np.array_equal(got, reference.predict(probs).astype(bool))


def test_onnx_agrees_with_sklearn_on_unseen_data(
    fitted: tuple[AlgorithmInvariants, RandomForestClassifier, np.ndarray, np.ndarray],
) -> None:
    adi, reference, _, _ = fitted
    unseen, _ = synthetic(5000, seed=1)
    assert np.array_equal(adi.evaluate(unseen), reference.predict(unseen).astype(bool))


def test_ties_follow_sklearns_hard_vote() -> None:
    # with 2 and 10 trees many samples get an exact 50/50 vote; sklearn's predict picks "right"
    probs, wrong = synthetic(600, seed=2)
    unseen, _ = synthetic(3000, seed=3)
    for trees in (2, 10):
        adi = AlgorithmInvariants.fit(probs, wrong, n_estimators=trees, seed=0)
        reference = RandomForestClassifier(n_estimators=trees, criterion="entropy", random_state=0, n_jobs=1)
        reference.fit(probs, wrong.astype(np.int64))
        ties = np.isclose(reference.predict_proba(unseen)[:, 1], 0.5)
        assert ties.any()
        assert np.array_equal(adi.evaluate(unseen), reference.predict(unseen).astype(bool))


def test_the_forest_learns_the_pattern(
    fitted: tuple[AlgorithmInvariants, RandomForestClassifier, np.ndarray, np.ndarray],
) -> None:
    adi, _, _, _ = fitted
    unseen, truth = synthetic(3000, seed=4)
    predicted = adi.evaluate(unseen)
    majority = max(truth.mean(), 1 - truth.mean())
    assert (predicted == truth).mean() > majority + 0.1
    assert predicted[truth].mean() > 0.8 > 0.5 > predicted[~truth].mean()


def test_onnx_bytes_round_trip_and_opsets(
    fitted: tuple[AlgorithmInvariants, RandomForestClassifier, np.ndarray, np.ndarray],
) -> None:
    adi, _, probs, _ = fitted
    again = AlgorithmInvariants.from_onnx(adi.onnx_bytes)
    assert again.onnx_bytes == adi.onnx_bytes
    assert np.array_equal(again.evaluate(probs), adi.evaluate(probs))
    assert again.n_classes == 6 and again.constant is None
    model = onnx.load_model_from_string(adi.onnx_bytes)
    opsets = {o.domain: o.version for o in model.opset_import}
    assert opsets[""] == 17 and opsets["ai.onnx.ml"] == 1  # the lowest that suffices, as skl2onnx takes it
    assert [o.name for o in model.graph.output] == ["label", "probabilities"]
    assert "ZipMap" not in {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("answer", [False, True])
def test_a_single_class_gives_a_constant_model(answer: bool) -> None:
    probs, _ = synthetic(50)
    adi = AlgorithmInvariants.fit(probs, np.full(50, answer))
    assert adi.constant is answer
    unseen, _ = synthetic(20, seed=5)
    assert adi.evaluate(unseen).tolist() == [answer] * 20
    again = AlgorithmInvariants.from_onnx(adi.onnx_bytes)
    assert again.constant is answer
    assert again.evaluate(unseen).tolist() == [answer] * 20
    assert again.evaluate(unseen[:0]).shape == (0,)


def test_inputs_are_checked(fitted: tuple[AlgorithmInvariants, RandomForestClassifier, np.ndarray, np.ndarray]) -> None:
    adi, _, probs, wrong = fitted
    assert adi.evaluate(probs[:0]).shape == (0,)
    assert adi.evaluate(probs.astype(np.float64)[:5]).tolist() == adi.evaluate(probs[:5]).tolist()
    with pytest.raises(ValueError, match="the ADI model expects 6"):
        adi.evaluate(np.zeros((3, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=r"\[N, K\]"):
        adi.evaluate(np.zeros(6, dtype=np.float32))
    with pytest.raises(ValueError, match="wrong/right flags"):
        AlgorithmInvariants.fit(probs, wrong[:-1])
    with pytest.raises(ValueError, match="NaN"):
        AlgorithmInvariants.fit(np.full((4, 2), np.nan), np.array([0, 1, 0, 1]))
    with pytest.raises(OnnxLoadError):
        AlgorithmInvariants.from_onnx(b"not an onnx model")


@pytest.mark.parametrize(("n", "k"), [(1500, 6), (6000, 2)])
def test_the_forest_is_written_as_skl2onnx_writes_it(n: int, k: int) -> None:
    """The numpy converter gives the node skl2onnx's converter gives: every attribute equal (thresholds
    rounded down to float32 the same way, leaf weights the same), and the same outputs."""
    from onnx import helper
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    from invariants.onnx_session import OnnxSession

    probs, wrong = synthetic(n, k, seed=3)
    forest = RandomForestClassifier(n_estimators=12, criterion="entropy", random_state=0).fit(probs, wrong)
    ref = convert_sklearn(
        forest,
        initial_types=[("x", FloatTensorType([None, k]))],
        options={id(forest): {"zipmap": False}},
        target_opset=dict(DEFAULT_TARGET_OPSET),
    )
    mine = onnx.load_model_from_string(forest_onnx(forest, k, DEFAULT_TARGET_OPSET))
    (want,), (got,) = ref.graph.node, mine.graph.node
    assert (got.op_type, got.domain) == (want.op_type, want.domain)
    expected = {a.name: helper.get_attribute_value(a) for a in want.attribute}
    assert {a.name: helper.get_attribute_value(a) for a in got.attribute} == expected
    unseen, _ = synthetic(3000, k, seed=4)
    a = OnnxSession(ref.SerializeToString()).run({"x": unseen})
    b = OnnxSession(mine.SerializeToString()).run({"x": unseen})
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_each_tree_of_a_large_validation_set_sees_a_bounded_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above MAX_TREE_SAMPLES rows each tree grows on a bootstrap sample of that many: the forest's size
    (its ONNX bytes) stops growing with the validation set; below it, every row is drawn as before."""
    import invariants.adi as adi_module

    monkeypatch.setattr(adi_module, "MAX_TREE_SAMPLES", 1000)
    probs, wrong = synthetic(8000, seed=5)
    bounded = AlgorithmInvariants.fit(probs, wrong, n_estimators=5, seed=0)
    monkeypatch.setattr(adi_module, "MAX_TREE_SAMPLES", 100_000)
    whole = AlgorithmInvariants.fit(probs, wrong, n_estimators=5, seed=0)
    assert len(bounded.onnx_bytes) * 3 < len(whole.onnx_bytes)
    assert MAX_TREE_SAMPLES >= 10_000  # the validation sets of ordinary fits are not sampled
