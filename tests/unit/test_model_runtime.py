"""The ONNX classifier runtime: output kinds, input validation, batch prediction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from skl2onnx import to_onnx
from sklearn.linear_model import LogisticRegression

from agent.model.classifier import InvalidInput, ModelLoadError, OnnxClassifier, default_model_path


def softmax(z: np.ndarray) -> np.ndarray:
    """Reference row-wise softmax."""
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _linear_model(softmax_out: bool, k: int = 3, d: int = 4) -> bytes:
    rng = np.random.default_rng(0)
    w = helper.make_tensor("W", TensorProto.FLOAT, [d, k], rng.normal(size=d * k).astype(np.float32).tolist())
    nodes = [helper.make_node("MatMul", ["x", "W"], ["z"])]
    out = "z"
    if softmax_out:
        nodes.append(helper.make_node("Softmax", ["z"], ["p"], axis=1))
        out = "p"
    graph = helper.make_graph(
        nodes,
        "lin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", d])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", k])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_shipped_cnn_logits_get_softmax() -> None:
    model = OnnxClassifier.load(default_model_path())
    assert model.input_shape == (1, 28, 28)
    assert model.n_classes == 10
    x = np.random.default_rng(0).uniform(0, 255, size=(5, 1, 28, 28)).astype(np.float32)
    pred = model.predict(x)
    assert pred.probabilities.shape == (5, 10)
    np.testing.assert_allclose(pred.probabilities.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(pred.predicted, pred.probabilities.argmax(axis=1))


def test_flattened_and_channel_less_inputs_are_reshaped() -> None:
    model = OnnxClassifier.load(default_model_path())
    x = np.random.default_rng(1).uniform(0, 255, size=(3, 1, 28, 28)).astype(np.float32)
    ref = model.predict(x).probabilities
    np.testing.assert_array_equal(model.predict(x.reshape(3, -1)).probabilities, ref)
    np.testing.assert_array_equal(model.predict(x.reshape(3, 28, 28)).probabilities, ref)
    np.testing.assert_array_equal(model.predict(x[0]).probabilities, ref[:1])
    # integer pixels are cast to the model's float input
    np.testing.assert_allclose(
        model.predict(x.astype(np.uint8)).probabilities,
        model.predict(x.astype(np.uint8).astype(np.float32)).probabilities,
    )


@pytest.mark.parametrize(
    ("x", "reason", "words"),
    [
        (np.zeros((2, 27, 28), np.float32), "shape", "does not fit"),
        (np.zeros((0, 784), np.float32), "empty", "empty"),
        (np.full((2, 784), np.nan, np.float32), "non_finite", "NaN"),
        (np.full((1, 784), np.inf, np.float64), "non_finite", "Inf"),
        (np.array([["a"] * 784]), "dtype", "not numeric"),
        (np.ones((1, 784), bool), "dtype", "bool"),
    ],
)
def test_bad_inputs_name_the_problem(x: np.ndarray, reason: str, words: str) -> None:
    model = OnnxClassifier.load(default_model_path())
    with pytest.raises(InvalidInput) as err:
        model.predict(x)
    assert err.value.reason == reason
    assert words in str(err.value)


def test_oversized_batch_refused() -> None:
    model = OnnxClassifier(default_model_path().read_bytes(), max_batch=4)
    with pytest.raises(InvalidInput) as err:
        model.predict(np.zeros((5, 784), np.float32))
    assert err.value.reason == "too_large"


def test_skl2onnx_label_and_probabilities() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1)
    clf = LogisticRegression(max_iter=500).fit(x, y)
    onx = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    model = OnnxClassifier(onx.SerializeToString())
    assert model.scores_output == "probabilities" and model.scores_kind == "probabilities"
    pred = model.predict(x)
    np.testing.assert_allclose(pred.probabilities, clf.predict_proba(x), atol=1e-5)
    assert (pred.predicted == clf.predict(x)).mean() > 0.99


def test_softmax_output_detected_from_graph_and_logits_otherwise() -> None:
    x = np.random.default_rng(2).normal(size=(6, 4)).astype(np.float32)
    probs = OnnxClassifier(_linear_model(True))
    logits = OnnxClassifier(_linear_model(False))
    assert probs.scores_kind == "probabilities"
    np.testing.assert_allclose(probs.predict(x).probabilities, logits.predict(x).probabilities, atol=1e-6)
    z = OnnxClassifier(_linear_model(False), scores_kind="logits").session.run({"x": x})[0]
    np.testing.assert_allclose(logits.predict(x).probabilities, softmax(z), atol=1e-6)


def test_scores_output_override_must_exist() -> None:
    with pytest.raises(ModelLoadError, match="not an output"):
        OnnxClassifier(_linear_model(False), scores_output="nope")


def test_load_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        OnnxClassifier.load(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not an onnx model")
    with pytest.raises(ModelLoadError, match="cannot load ONNX model"):
        OnnxClassifier.load(junk)
    with pytest.raises(ModelLoadError, match="class names"):
        OnnxClassifier(_linear_model(False), classes=["a", "b"])


def test_onnx_checker_accepts_shipped_models() -> None:
    for name in ("mnist_cnn.onnx", "digits_cnn.onnx"):
        onnx.checker.check_model(onnx.load(str(default_model_path().parent / name)))


@pytest.mark.parametrize("string_labels", [False, True], ids=["int-classes", "string-classes"])
def test_skl2onnx_default_export_with_zipmap(string_labels: bool) -> None:
    """skl2onnx's default (ZipMap on) gives a sequence of {class: probability} maps: read as probabilities,
    columns in the converter's class order, class names from its keys."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1)
    labels = np.array(["cat", "dog", "eel"])[y] if string_labels else y
    clf = LogisticRegression(max_iter=500).fit(x, labels)
    onx = to_onnx(clf, x[:1], target_opset={"": 17, "ai.onnx.ml": 3})  # ZipMap on, as most users export
    model = OnnxClassifier(onx.SerializeToString())
    assert model.scores_output == "output_probability" and model.scores_kind == "probabilities"
    assert model.classes == [str(c) for c in clf.classes_]
    pred = model.predict(x)
    np.testing.assert_allclose(pred.probabilities, clf.predict_proba(x), atol=1e-5)
    assert (np.asarray(model.classes)[pred.predicted] == clf.predict(x).astype(str)).mean() > 0.99


def test_scores_output_must_hold_scores() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 3)).astype(np.float32)
    clf = LogisticRegression(max_iter=200).fit(x, (x[:, 0] > 0).astype(np.int64))
    onx = to_onnx(clf, x[:1], target_opset={"": 17, "ai.onnx.ml": 3})
    with pytest.raises(ModelLoadError, match="not class scores"):
        OnnxClassifier(onx.SerializeToString(), scores_output="output_label")
