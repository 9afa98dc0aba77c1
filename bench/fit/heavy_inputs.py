"""The inputs of :mod:`bench.fit.heavy`, generated here, seeded, in seconds.

* :func:`wide_token_model`: a text classifier over **2,048 integer values per row** (``input_ids``,
  INT32 ``[N, 2048]``: token ids padded with 0 to a fixed length, as exports of long-sequence text models
  take them) and :data:`WIDE_CLASSES` classes. The graph (onnx helpers, opset 17): token embedding
  (``Gather``, :data:`EMBED` values) → a per-position dense layer of ``position_width`` units with a
  residual (the cost and the activations of a real encoder grow with the sequence; 0 leaves it out) →
  mean over the non-padding positions → dense layer and ``Tanh`` (``hidden``) → dense layer to the class
  ``logits``. It is not trained: each class owns a random direction of the embedding space, its topic
  tokens point along it, and the last layer reads the directions back, so the model is a real classifier
  whose errors come from short, noisy and mixed documents (accuracy about 0.8).
* :func:`wide_token_rows`: labeled rows for it, the same seed giving the same rows.
* :func:`wide_table`: a reference table of ``n`` rows, :data:`TABLE_FEATURES` numeric feature columns,
  the predicted probabilities of :data:`TABLE_CLASSES` classes from a model that is right about 85% of
  the time, and the label (what ``icos-agent fit --reference`` reads).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.zoo.token_classifier import pooled_head_nodes

#: Values per row of the wide model's input.
WIDE_LENGTH = 2048
#: Classes of the wide model.
WIDE_CLASSES = 230
#: Token vocabulary: 0 padding, then common words, then each class's topic words.
COMMON_WORDS = 3000
TOPIC_WORDS = 12
VOCAB = 1 + COMMON_WORDS + WIDE_CLASSES * TOPIC_WORDS
EMBED = 64
HIDDEN = 96


@dataclass(frozen=True)
class WideRows:
    """Rows of the wide model: ``ids`` INT32 ``[n, WIDE_LENGTH]`` and their class indices ``y``."""

    ids: np.ndarray
    y: np.ndarray


def wide_token_rows(n: int, seed: int) -> WideRows:
    """``n`` documents of 32 to 2,048 tokens, classes balanced: a share of each document's tokens are its
    class's topic words (a fifth of the documents mix in a second class's), the rest common words."""
    rng = np.random.default_rng([seed, 2048])
    y = rng.permutation(np.arange(n) % WIDE_CLASSES).astype(np.int64)
    lengths = np.exp(rng.uniform(np.log(32), np.log(WIDE_LENGTH), n)).astype(np.int64)
    positions = np.arange(WIDE_LENGTH)[None, :]
    live = positions < lengths[:, None]
    common = 1 + np.minimum(rng.zipf(1.3, (n, WIDE_LENGTH)) - 1, COMMON_WORDS - 1)
    other = np.where(rng.uniform(size=n) < 0.2, rng.integers(0, WIDE_CLASSES, n), y)
    p_topic = rng.uniform(0.01, 0.08, n)[:, None]
    topic_of = np.where(rng.uniform(size=(n, WIDE_LENGTH)) < 0.6, y[:, None], other[:, None])
    topic = 1 + COMMON_WORDS + topic_of * TOPIC_WORDS + rng.integers(0, TOPIC_WORDS, (n, WIDE_LENGTH))
    ids = np.where(rng.uniform(size=(n, WIDE_LENGTH)) < p_topic, topic, common)
    return WideRows(np.where(live, ids, 0).astype(np.int32), y)


def wide_token_model(seed: int = 0, position_width: int = 128) -> bytes:
    """The serialized ONNX model (see the module docstring); ``position_width`` units per position."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng([seed, 4096])
    directions = rng.normal(size=(WIDE_CLASSES, EMBED))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    embedding = rng.normal(0.0, 0.05, (VOCAB, EMBED))
    embedding[0] = 0.0
    topic_ids = 1 + COMMON_WORDS + np.arange(WIDE_CLASSES * TOPIC_WORDS)
    embedding[topic_ids] += 4.0 * np.repeat(directions, TOPIC_WORDS, axis=0)
    w1 = rng.normal(0.0, 1.0, (EMBED, HIDDEN)) / np.sqrt(EMBED)
    # the last layer reads the class directions back through tanh's (nearly linear) range
    w2 = np.linalg.pinv(w1) @ directions.T * 6.0

    def f32(name: str, value: np.ndarray) -> TensorProto:
        return numpy_helper.from_array(np.asarray(value, np.float32), name)

    inits = [
        f32("embedding", embedding),
        f32("w1", w1 * 0.5),
        f32("b1", np.zeros(HIDDEN)),
        f32("w2", w2 * 2.0),
        f32("b2", np.zeros(WIDE_CLASSES)),
        numpy_helper.from_array(np.array([2], np.int64), "axis2"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        f32("one", np.array(1.0)),
        numpy_helper.from_array(np.array(0, np.int32), "pad"),
    ]
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["token_vectors"]),
        helper.make_node("Greater", ["input_ids", "pad"], ["is_token"]),
        helper.make_node("Cast", ["is_token"], ["mask_float"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_float", "axis2"], ["mask3"]),
    ]
    vectors = "token_vectors"
    if position_width > 0:  # a per-position feed-forward block with a residual, as an encoder layer has
        inits += [
            f32("wp1", rng.normal(0.0, 0.02, (EMBED, position_width))),
            f32("wp2", rng.normal(0.0, 0.02, (position_width, EMBED))),
        ]
        nodes += [
            helper.make_node("MatMul", ["token_vectors", "wp1"], ["ff_in"]),
            helper.make_node("Relu", ["ff_in"], ["ff_act"]),
            helper.make_node("MatMul", ["ff_act", "wp2"], ["ff_out"]),
            helper.make_node("Add", ["token_vectors", "ff_out"], ["encoded"]),
        ]
        vectors = "encoded"
    nodes += pooled_head_nodes(vectors)
    graph = helper.make_graph(
        nodes,
        "wide_tokens",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", WIDE_LENGTH])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", WIDE_CLASSES])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8, producer_name="bench.fit.heavy_inputs"
    )
    return bytes(model.SerializeToString())


#: Feature columns and classes of the wide table.
TABLE_FEATURES = 20
TABLE_CLASSES = 3


def wide_table(n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` rows: ``f00`` .. ``f19`` (some skewed, some integer; four of them decide the class), ``p_0`` ..
    ``p_2`` (a model's probabilities: the true scores seen through noise) and ``label`` (the true class,
    1% of them flipped at random)."""
    rng = np.random.default_rng([seed, 1_000_000])
    x = rng.normal(size=(n, TABLE_FEATURES)).astype(np.float32)
    x[:, 5:9] = np.exp(x[:, 5:9])  # skewed columns
    x[:, 15:] = np.round(x[:, 15:] * 3)  # integer-valued columns
    w = rng.normal(size=(TABLE_FEATURES, TABLE_CLASSES)).astype(np.float32)
    w[4:] = 0.0
    scores = np.clip(x, -3, 3) @ w * 3.0
    y = scores.argmax(axis=1)
    y = np.where(rng.uniform(size=n) < 0.01, rng.integers(0, TABLE_CLASSES, n), y)
    seen = scores + rng.normal(0.0, 1.5, scores.shape).astype(np.float32)
    p = np.exp(seen - seen.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out = {f"f{j:02d}": x[:, j] for j in range(TABLE_FEATURES)}
    out.update({f"p_{k}": p[:, k].astype(np.float32) for k in range(TABLE_CLASSES)})
    out["label"] = y.astype(np.int64)
    return out
