"""Model inputs as the model declares them, and the feature views the invariants read (real ONNX models:
the shipped MNIST CNN, and small multi-input graphs built here with onnx's helpers)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from agent.model.classifier import OnnxClassifier, default_model_path
from agent.model.graph import penultimate_tensor, with_outputs
from agent.model.inputs import Inputs, InputSpec, InvalidInput, Signature, prepare
from agent.model.view_choice import choose_view
from agent.model.views import (
    MAX_WIDTH,
    FeatureView,
    encode_inputs,
    hashed_text,
    hashed_tokens,
    make_view,
    pooled_image,
    project,
    view_of_bundle,
)


def token_model(vocab: int = 50, hidden: int = 8, classes: int = 3) -> bytes:
    """input_ids/attention_mask [N, L] (L dynamic) → embedding → masked mean → dense+tanh → dense → softmax."""
    rng = np.random.default_rng(0)
    emb = helper.make_tensor("emb", TensorProto.FLOAT, [vocab, 6], rng.normal(size=(vocab, 6)).ravel())
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [6, hidden], rng.normal(size=(6, hidden)).ravel())
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [hidden, classes], rng.normal(size=(hidden, classes)).ravel())
    one = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["e"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axes2"], ["m3"]),
        helper.make_node("Mul", ["e", "m3"], ["em"]),
        helper.make_node("ReduceSum", ["em", "axes"], ["s"], keepdims=0),
        helper.make_node("ReduceSum", ["m", "axes"], ["cnt"], keepdims=1),
        helper.make_node("Div", ["s", "cnt"], ["pooled"]),
        helper.make_node("MatMul", ["pooled", "w1"], ["h0"]),
        helper.make_node("Tanh", ["h0"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "w2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "tokens",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", "L"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", "L"]),
        ],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", classes])],
        [emb, w1, w2, one, helper.make_tensor("axes2", TensorProto.INT64, [1], [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def test_prepare_validates_each_named_input() -> None:
    sig = Signature(
        (
            InputSpec("age", np.dtype(np.float32), (1,)),
            InputSpec("city", np.dtype(object), (1,)),
        )
    )
    batch = prepare(sig, {"age": np.array([[30.0], [41.0]]), "city": np.array([["Oslo"], [b"Lyon"]], dtype=object)}, 8)
    assert batch.n == 2 and batch["age"].dtype == np.float32 and batch["city"].tolist() == [["Oslo"], ["Lyon"]]
    assert batch["city"].dtype == object
    with pytest.raises(InvalidInput, match="missing input 'city'"):
        prepare(sig, {"age": np.zeros((2, 1))}, 8)
    with pytest.raises(InvalidInput, match="unknown input 'town'"):
        prepare(sig, {"age": np.zeros((2, 1)), "city": np.array([["a"], ["b"]]), "town": np.zeros(2)}, 8)
    with pytest.raises(InvalidInput, match="2 samples, the others 3|has 3 samples") as info:
        prepare(sig, {"age": np.zeros((2, 1)), "city": np.array([["a"], ["b"], ["c"]])}, 8)
    assert info.value.reason == "shape"
    with pytest.raises(InvalidInput, match="takes text"):
        prepare(sig, {"age": np.zeros((2, 1)), "city": np.zeros((2, 1))}, 8)
    with pytest.raises(InvalidInput, match="exceeds the limit of 1") as big:
        prepare(sig, {"age": np.zeros((2, 1)), "city": np.array([["a"], ["b"]])}, 1)
    assert big.value.status == 413
    with pytest.raises(InvalidInput, match="not UTF-8"):
        prepare(sig, {"age": np.zeros((1, 1)), "city": np.array([[b"\xff"]], dtype=object)}, 8)


def test_dynamic_dimensions_and_integer_ranges() -> None:
    sig = Signature(
        (InputSpec("input_ids", np.dtype(np.int64), (None,)), InputSpec("attention_mask", np.dtype(np.int64), (None,)))
    )
    short = prepare(sig, {"input_ids": np.ones((2, 5), np.int32), "attention_mask": np.ones((2, 5))}, 8)
    assert short["input_ids"].dtype == np.int64 and short["input_ids"].shape == (2, 5)
    with pytest.raises(InvalidInput, match="fractions"):
        prepare(sig, {"input_ids": np.full((1, 3), 0.5), "attention_mask": np.ones((1, 3))}, 8)
    with pytest.raises(InvalidInput, match="rank 3"):
        prepare(sig, {"input_ids": np.ones((1, 3, 2)), "attention_mask": np.ones((1, 3))}, 8)
    longer = prepare(sig, {"input_ids": np.ones((1, 9)), "attention_mask": np.ones((1, 9))}, 8)
    both = Inputs.concatenate([short, longer])
    assert both["input_ids"].shape == (3, 9) and both["attention_mask"][:2, 5:].sum() == 0  # padded with zeros


def test_encoders() -> None:
    img = np.arange(2 * 3 * 20 * 30, dtype=np.float32).reshape(2, 3, 20, 30)
    pooled = pooled_image(img, channels_last=False)
    assert pooled.shape == (2, 3 * 8 * 8)
    assert pooled.mean() == pytest.approx(img.mean(), rel=0.02)  # area averages keep the mean
    nhwc = pooled_image(img.transpose(0, 2, 3, 1), channels_last=True)
    np.testing.assert_allclose(nhwc, pooled)
    texts = np.array([["the red car"], ["the red car"], ["a blue boat"]], dtype=object)
    h = hashed_text(texts)
    assert h.shape == (3, 64) and np.allclose(h[0], h[1]) and not np.allclose(h[0], h[2])
    assert np.linalg.norm(h, axis=1) == pytest.approx([1.0, 1.0, 1.0])
    ids = np.array([[5, 6, 0, 0], [5, 6, 7, 9]])
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]])
    t = hashed_tokens(ids, mask)
    assert t.sum(axis=1) == pytest.approx([1.0, 1.0]) and (t[0] > 0).sum() <= 2
    many = np.random.default_rng(1).integers(0, 5000, (6, 50))  # collisions and repeats: each token counted once
    keep = np.random.default_rng(2).random((6, 50)) < 0.7
    want = np.zeros((6, 64))
    for r, c in zip(*np.nonzero(keep), strict=True):
        want[r, (int(many[r, c]) * 2654435761 % (1 << 32)) % 64] += 1
    np.testing.assert_allclose(hashed_tokens(many, keep, width=64), want / want.sum(axis=1, keepdims=True), rtol=1e-6)
    x = np.random.default_rng(0).normal(size=(40, 1000)).astype(np.float32)
    p1, p2 = project(x, 256, seed=3), project(x, 256, seed=3)
    np.testing.assert_array_equal(p1, p2)
    assert p1.shape == (40, 256) and not np.array_equal(p1, project(x, 256, seed=4))
    # a random projection roughly keeps distances (Johnson-Lindenstrauss)
    d0, d1 = np.linalg.norm(x[0] - x[1]), np.linalg.norm(p1[0] - p1[1])
    assert 0.7 < d1 / d0 < 1.3


def test_views_of_a_table_with_categories_and_their_round_trip() -> None:
    sig = Signature(
        (
            InputSpec("age", np.dtype(np.float32), (1,)),
            InputSpec("city", np.dtype(object), (1,)),
            InputSpec("review", np.dtype(object), (1,)),
        )
    )
    view = make_view("raw", sig, inputs=encode_inputs("raw", sig, {"city": ["Oslo", "Lyon"]}))
    assert view.width == 1 + 3 + 65
    assert view.names[:4] == ("age", "city=Oslo", "city=Lyon", "city=(other)")
    batch = Inputs(
        {
            "age": np.array([[30.0], [41.0]], np.float32),
            "city": np.array([["Lyon"], ["Rome"]], dtype=object),
            "review": np.array([["fine"], ["awful, broken"]], dtype=object),
        }
    )
    f = view.features(batch)
    assert f.shape == (2, view.width) and f[:, 0].tolist() == [30.0, 41.0]
    assert f[0, 1:4].tolist() == [0, 1, 0] and f[1, 1:4].tolist() == [0, 0, 1]  # Rome is no category seen
    back = view_of_bundle(json.loads(json.dumps(view.to_dict())), list(view.names), sig)
    np.testing.assert_array_equal(back.features(batch), f)
    assert back == view


def test_wide_views_are_projected_and_mnist_keeps_its_pixels() -> None:
    big = Signature((InputSpec("image", np.dtype(np.float32), (3, 224, 224)),))
    pooled = make_view("pooled", big, inputs=encode_inputs("pooled", big))
    assert pooled.width == 192 and pooled.projected == 0
    raw = make_view("raw", big, inputs=encode_inputs("raw", big))
    assert raw.inputs[0].encoding == "pooled"  # a raw view of a 224x224 image would be 150,528 columns
    mnist = Signature((InputSpec("input", np.dtype(np.float32), (1, 28, 28)),))
    assert make_view("raw", mnist, inputs=encode_inputs("raw", mnist)).width == 784
    emb = make_view("embedding", mnist, embedding="h", embedding_width=1000)
    assert emb.width == MAX_WIDTH and emb.projected == MAX_WIDTH and emb.names[0] == "proj[0]"


def test_the_penultimate_layer_is_found_and_read_in_the_same_run() -> None:
    model_bytes = token_model()
    assert penultimate_tensor(model_bytes, "probabilities") == "hidden"
    cnn = OnnxClassifier.load(default_model_path())
    found = penultimate_tensor(cnn.model_bytes, cnn.scores_output)
    assert found is not None
    extended = onnx.load_from_string(with_outputs(cnn.model_bytes, [found]))
    assert [o.name for o in extended.graph.output][-1] == found
    tok = OnnxClassifier(model_bytes, name="tokens")
    assert tok.signature.names == ["input_ids", "attention_mask"] and tok.n_classes == 3
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 50, (12, 7))
    mask = (rng.uniform(size=(12, 7)) > 0.2).astype(np.int64)
    mask[:, 0] = 1
    train = tok.prepare({"input_ids": ids, "attention_mask": mask})
    view = choose_view(tok, train)
    assert view.kind == "embedding" and view.embedding == "hidden" and view.width == 8
    viewed = tok.with_view(view)
    pred = viewed.predict_prepared(train)
    feats = viewed.features(train, pred)
    assert feats.shape == (12, 8)
    np.testing.assert_allclose(pred.probabilities, tok.predict_prepared(train).probabilities, rtol=1e-6)
    # hashed instead: tokens as bags, the mask read with them
    hashed = choose_view(tok, train, "hashed")
    assert [v.encoding for v in hashed.inputs] == ["tokens", "skip"] and hashed.width == 65
    assert tok.with_view(hashed).features(train).shape == (12, 65)
    # a view that asks for a tensor the graph does not have
    with pytest.raises(ValueError, match="no tensor"):
        choose_view(tok, train, "embedding:nope")


def test_the_mnist_cnn_keeps_raw_pixels_by_default_and_offers_its_embedding() -> None:
    cnn = OnnxClassifier.load(default_model_path())
    x = cnn.prepare(np.zeros((4, 1, 28, 28), np.float32))
    view = choose_view(cnn, x)
    assert view.kind == "raw" and view.width == 784 and not view.names
    emb = choose_view(cnn, x, "embedding")
    assert emb.kind == "embedding" and 0 < emb.width <= MAX_WIDTH
    assert FeatureView.from_dict(emb.to_dict(), emb.names) == emb


def test_offline_batches_hold_about_16_mib_of_large_inputs() -> None:
    """fit, check and the audits run large images a few at a time: a batch of 256 images of 3×224×224
    would hold gigabytes of the network's activations."""
    from agent.model.inputs import BATCH_BYTES, Signature

    image = Signature.of_array("input", [3, 224, 224])
    assert image.batch_rows() == BATCH_BYTES // (3 * 224 * 224 * 4) == 27
    assert Signature.of_array("input", [1, 28, 28]).batch_rows() == 256
    assert Signature.of_array("input", [3, 4096, 4096]).batch_rows() == 1  # never none
    text = Signature.from_list([{"name": "text", "datatype": "BYTES", "shape": [-1, 1]}])
    assert text.batch_rows(512) == 512  # strings: no fixed size to bound by


def test_hashed_text_counts_every_ngram_in_its_crc32_bin_across_cache_clears(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch's counts (one ``bincount``, n-gram bins cached) are each text's character 2- and 3-grams, of
    its lower-cased text padded with a space, in bin ``crc32 % width``, L2-normalised: the encoding bundles
    were fitted with, whether a bin comes from the cache or is hashed again after the cache is emptied."""
    import zlib

    from agent.model import views

    texts = np.array([["Hello World"], ["héllo wörld \ud800"], [""], ["aa aa aa"], [b"bytes"]], dtype=object)

    def reference(width: int) -> np.ndarray:
        out = np.zeros((len(texts), width), np.float32)
        for i, value in enumerate(texts[:, 0]):
            t = f" {str(value).lower()} "
            for n in (2, 3):
                for j in range(len(t) - n + 1):
                    out[i, zlib.crc32(t[j : j + n].encode("utf-8", "surrogatepass")) % width] += 1.0
        norm = np.linalg.norm(out, axis=1, keepdims=True)
        return np.divide(out, norm, out=out, where=norm > 0)

    monkeypatch.setattr(views, "MAX_CACHED_GRAMS", 4)  # emptied at every batch past four n-grams
    for width in (64, 7, 64):
        for _ in range(2):  # hashed, then (partly) from the cache
            np.testing.assert_array_equal(hashed_text(texts, width), reference(width))
