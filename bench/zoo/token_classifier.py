"""``token_classifier``: a transformer-style text classifier over token ids, as BERT-like exports take them.

Inputs ``input_ids`` and ``attention_mask``, INT64 ``[batch, sequence]`` with both dimensions dynamic; the
graph (built with onnx helpers, opset 17): token embedding (``Gather``) → mean over the unmasked positions →
dense layer and ``Tanh`` (the value ``hidden``, the penultimate representation) → dense layer to the class
``logits`` (the one output). Trained here in numpy (softmax cross-entropy, Adam) on token sequences of
:class:`.topics.TopicCorpus` (four topics, 8 to 64 tokens), so it is a real classifier with no tokenizer.

Token ids: 0 padding, 1 unknown, ``2 ..`` the training vocabulary, then a block of ids never seen in training
(their embeddings stay at their random initial values), used by ``vocabulary_drift``. A split holds its
sequences padded to its longest; :func:`token_batches` yields batches padded to each batch's longest, as a
tokenizer with ``padding=True`` does. Shifts:

* ``token_substitution``: each real token, with probability ``strength``, replaced by a random token of the
  training vocabulary (noise, as from OCR or a wrong tokenizer);
* ``vocabulary_drift``: each topic token, with probability ``strength``, replaced by a token never seen in
  training (new words for the same things).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.zoo.core import (
    Split,
    ZooModel,
    balanced_labels,
    cache_dir,
    graph_inputs,
    load_splits,
    save_bytes,
    save_splits,
    source_digest,
)
from bench.zoo.topics import TopicCorpus

CLASSES = ("billing", "technical", "shipping", "account")
CORPUS = TopicCorpus(
    n_topics=len(CLASSES), n_common=300, n_per_topic=50, p_topic=0.15, p_confuse=0.05, min_len=8, max_len=64
)
PAD, UNK, FIRST_WORD = 0, 1, 2
#: Ids ``[NEW_IDS, VOCAB)`` are the unseen block of ``vocabulary_drift``, one per topic word.
NEW_IDS = FIRST_WORD + CORPUS.n_words
VOCAB = NEW_IDS + CORPUS.n_topics * CORPUS.n_per_topic
EMBED, HIDDEN = 32, 32
SIZES = (4000, 1000, 1000)


def encode(docs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Word-index sequences as ``input_ids`` and ``attention_mask``, padded to the longest."""
    length = max(len(d) for d in docs)
    ids = np.full((len(docs), length), PAD, np.int64)
    mask = np.zeros((len(docs), length), np.int64)
    for i, d in enumerate(docs):
        ids[i, : len(d)] = d + FIRST_WORD
        mask[i, : len(d)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def token_batches(split: Split, batch_size: int) -> Iterator[Split]:
    """Batches of ``split`` each padded to its own longest sequence (as tokenizers pad a batch)."""
    for batch in split.batches(batch_size):
        longest = int(batch.inputs["attention_mask"].sum(axis=1).max(initial=1))
        yield Split({k: np.ascontiguousarray(v[:, :longest]) for k, v in batch.inputs.items()}, batch.y)


def generate(n: int, rng: np.random.Generator) -> Split:
    y = balanced_labels(n, len(CLASSES), rng)
    return Split(encode(CORPUS.documents(y, rng)), y)


@dataclass
class Weights:
    embedding: np.ndarray  # [VOCAB, EMBED]
    w1: np.ndarray  # [EMBED, HIDDEN]
    b1: np.ndarray
    w2: np.ndarray  # [HIDDEN, K]
    b2: np.ndarray

    def arrays(self) -> list[np.ndarray]:
        return [self.embedding, self.w1, self.b1, self.w2, self.b2]


def _forward(w: Weights, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, ...]:
    m = mask[..., None].astype(np.float64)
    count = np.maximum(m.sum(axis=1), 1.0)
    pooled = (w.embedding[ids] * m).sum(axis=1) / count
    hidden = np.tanh(pooled @ w.w1 + w.b1)
    return pooled, hidden, hidden @ w.w2 + w.b2, m, count


def train(split: Split, seed: int, epochs: int = 6, batch_size: int = 64, lr: float = 0.01) -> Weights:
    """Softmax cross-entropy with Adam; every gradient written out (the graph is five tensors)."""
    rng = np.random.default_rng([seed, 401])
    k = len(CLASSES)
    w = Weights(
        rng.normal(0, 0.1, (VOCAB, EMBED)),
        rng.normal(0, 1 / np.sqrt(EMBED), (EMBED, HIDDEN)),
        np.zeros(HIDDEN),
        rng.normal(0, 1 / np.sqrt(HIDDEN), (HIDDEN, k)),
        np.zeros(k),
    )
    moments = [(np.zeros_like(a), np.zeros_like(a)) for a in w.arrays()]
    ids_all, mask_all = split.inputs["input_ids"], split.inputs["attention_mask"]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(split))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids, mask, y = ids_all[idx], mask_all[idx], split.y[idx]
            pooled, hidden, logits, m, count = _forward(w, ids, mask)
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            d_logits = p
            d_logits[np.arange(len(y)), y] -= 1.0
            d_logits /= len(y)
            d_pre = (d_logits @ w.w2.T) * (1.0 - hidden**2)
            d_pooled = d_pre @ w.w1.T
            d_emb = np.zeros_like(w.embedding)
            np.add.at(d_emb, ids, (d_pooled / count)[:, None, :] * m)
            grads = [d_emb, pooled.T @ d_pre, d_pre.sum(0), hidden.T @ d_logits, d_logits.sum(0)]
            step += 1
            for a, g, (m1, m2) in zip(w.arrays(), grads, moments, strict=True):
                m1 *= 0.9
                m1 += 0.1 * g
                m2 *= 0.999
                m2 += 0.001 * g * g
                a -= lr * (m1 / (1 - 0.9**step)) / (np.sqrt(m2 / (1 - 0.999**step)) + 1e-8)
    return w


def pooled_head_nodes(vectors: str) -> list[Any]:
    """The nodes from per-token ``vectors`` ``[N, T, E]`` to ``logits``: the mean over the tokens ``mask3``
    keeps (at least one), then MatMul/Add/Tanh (``hidden``, weights ``w1``/``b1``) and MatMul/Add (``w2``/``b2``);
    the graph provides ``axis1`` and ``one``."""
    from onnx import helper

    return [
        helper.make_node("Mul", [vectors, "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
        helper.make_node("Max", ["count", "one"], ["count_at_least_one"]),
        helper.make_node("Div", ["summed", "count_at_least_one"], ["pooled"]),
        helper.make_node("MatMul", ["pooled", "w1"], ["pre_hidden"]),
        helper.make_node("Add", ["pre_hidden", "b1"], ["pre_tanh"]),
        helper.make_node("Tanh", ["pre_tanh"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "w2"], ["pre_logits"]),
        helper.make_node("Add", ["pre_logits", "b2"], ["logits"]),
    ]


def export(w: Weights) -> bytes:
    """The graph: Gather → masked mean → MatMul/Add/Tanh (``hidden``) → MatMul/Add (``logits``)."""
    from onnx import TensorProto, checker, helper, numpy_helper

    def init(name: str, value: np.ndarray) -> TensorProto:
        return numpy_helper.from_array(np.asarray(value, np.float32 if value.dtype.kind == "f" else value.dtype), name)

    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["token_vectors"]),
        helper.make_node("Cast", ["attention_mask"], ["mask_float"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_float", "axis2"], ["mask3"]),
        *pooled_head_nodes("token_vectors"),
    ]
    inits = [
        init("embedding", w.embedding),
        init("w1", w.w1),
        init("b1", w.b1),
        init("w2", w.w2),
        init("b2", w.b2),
        numpy_helper.from_array(np.array([2], np.int64), "axis2"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    ]
    graph = helper.make_graph(
        nodes,
        "token_classifier",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(CLASSES)])],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8, producer_name="bench.zoo.token_classifier"
    )
    checker.check_model(model)
    return model.SerializeToString()


def _replace(split: Split, strength: float, rng: np.random.Generator, eligible: np.ndarray, new: np.ndarray) -> Split:
    ids = split.inputs["input_ids"].copy()
    hit = eligible & (rng.random(ids.shape) < strength)
    ids[hit] = new[hit]
    return split.with_inputs(input_ids=ids)


def token_substitution(split: Split, strength: float, seed: int) -> Split:
    rng = np.random.default_rng([seed, 21])
    ids = split.inputs["input_ids"]
    noise = rng.integers(FIRST_WORD, NEW_IDS, ids.shape)
    return _replace(split, strength, rng, split.inputs["attention_mask"] == 1, noise)


def vocabulary_drift(split: Split, strength: float, seed: int) -> Split:
    rng = np.random.default_rng([seed, 22])
    ids = split.inputs["input_ids"]
    topic = (ids >= FIRST_WORD + CORPUS.n_common) & (ids < NEW_IDS) & (split.inputs["attention_mask"] == 1)
    return _replace(split, strength, rng, topic, ids - (FIRST_WORD + CORPUS.n_common) + NEW_IDS)


def build(workdir: str | os.PathLike[str], seed: int = 0, sizes: tuple[int, int, int] = SIZES) -> ZooModel:
    where = cache_dir(
        workdir,
        "token_classifier",
        seed,
        sizes,
        source_digest(__file__, __file__.replace("token_classifier.py", "topics.py")),
    )
    splits = load_splits(where)
    path = where / "model.onnx"
    if splits is None or not path.is_file():
        rng = np.random.default_rng([seed, 402])
        splits = {part: generate(n, rng) for part, n in zip(("train", "val", "test"), sizes, strict=True)}
        save_splits(where, splits)
        save_bytes(path, export(train(splits["train"], seed)))
    return ZooModel(
        name="token_classifier",
        kind="tokens",
        path=Path(path),
        inputs=graph_inputs(path.read_bytes()),
        classes=CLASSES,
        train=splits["train"],
        val=splits["val"],
        test=splits["test"],
        scores_output="logits",
        scores_kind="logits",
        shifts={"token_substitution": token_substitution, "vocabulary_drift": vocabulary_drift},
        penultimate="hidden",
    )
