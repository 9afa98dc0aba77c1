"""Algorithm-dependent invariants: the random forest over probability vectors, run via ONNX (ICOS §4.4)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from sklearn.ensemble import RandomForestClassifier

from invariants.adi import AlgorithmInvariants
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
    assert opsets[""] == 17 and 1 <= opsets["ai.onnx.ml"] <= 3  # skl2onnx takes the lowest opset that suffices
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
