"""Models of other inputs than one numeric tensor, built and exported with skl2onnx for the audit tests:
a text classifier (``TfidfVectorizer`` + ``LogisticRegression``, one string input) and a table classifier
(``ColumnTransformer`` of numeric and categorical string columns, one input per column), each with a CSV
of its inputs and labels; and a token-id model (ids and an attention mask of a dynamic length) built with
onnx's helpers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pandas as pd
from onnx import TensorProto, helper

POSITIVE = ("good", "great", "excellent", "lovely", "happy", "wonderful", "superb", "enjoyable")
NEGATIVE = ("bad", "awful", "terrible", "poor", "sad", "horrible", "boring", "dreadful")
NEUTRAL = ("the", "movie", "was", "really", "quite", "plot", "actors", "and", "film", "story", "music", "ending")


def reviews(n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """``n`` short reviews (neutral words and two or three of one sentiment) and their labels (1: positive)."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for i in range(n):
        y = i % 2
        words = list(rng.choice(NEUTRAL, int(rng.integers(5, 9))))
        words += list(rng.choice(POSITIVE if y else NEGATIVE, int(rng.integers(2, 4))))
        rng.shuffle(words)
        text = " ".join(words)
        texts.append(text[0].upper() + text[1:] + ".")
        labels.append(y)
    return texts, np.asarray(labels, dtype=np.int64)


def text_classifier(directory: Path) -> tuple[Path, Path]:
    """``text.onnx`` (input ``text``: string ``[N, 1]``) and ``text.csv`` (columns ``text``, ``label``)."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import StringTensorType
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    texts, y = reviews(600, seed=0)
    pipe = Pipeline([("tfidf", TfidfVectorizer()), ("clf", LogisticRegression(max_iter=1000))]).fit(texts, y)
    onx = convert_sklearn(
        pipe,
        initial_types=[("text", StringTensorType([None, 1]))],
        options={id(pipe): {"zipmap": False}},
        target_opset=17,
    )
    model = directory / "text.onnx"
    model.write_bytes(onx.SerializeToString())
    test_texts, test_y = reviews(200, seed=1)
    data = directory / "text.csv"
    pd.DataFrame({"text": test_texts, "label": test_y}).to_csv(data, index=False)
    return model, data


def _people(n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "age": np.round(rng.normal(40, 12, n), 1).astype(np.float32),
            "income": np.round(rng.normal(52.5, 15, n), 2).astype(np.float32),
            "city": rng.choice(["paris", "rome", "oslo", "lima"], n),
            "plan": rng.choice(["basic", "plus"], n),
        }
    )
    score = (df.age - 40) / 12 + (df.income - 52.5) / 15 + np.where(df.city == "rome", 1.5, 0.0)
    score += np.where(df.plan == "plus", -0.8, 0.0) + rng.normal(0, 0.3, n)
    return df, (score > 0.3).to_numpy().astype(np.int64)


def table_classifier(directory: Path) -> tuple[Path, Path]:
    """``table.onnx`` (inputs ``age``, ``income``: float ``[N, 1]``; ``city``, ``plan``: string ``[N, 1]``)
    and ``table.csv`` (those columns and ``label``)."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    train, y = _people(800, seed=0)
    columns = ColumnTransformer(
        [
            ("num", StandardScaler(), ["age", "income"]),
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["city", "plan"]),
        ]
    )
    pipe = Pipeline([("columns", columns), ("clf", LogisticRegression(max_iter=1000))]).fit(train, y)
    types = [
        ("age", FloatTensorType([None, 1])),
        ("income", FloatTensorType([None, 1])),
        ("city", StringTensorType([None, 1])),
        ("plan", StringTensorType([None, 1])),
    ]
    onx = convert_sklearn(pipe, initial_types=types, options={id(pipe): {"zipmap": False}}, target_opset=17)
    model = directory / "table.onnx"
    model.write_bytes(onx.SerializeToString())
    test, test_y = _people(300, seed=1)
    data = directory / "table.csv"
    test.assign(label=test_y).to_csv(data, index=False)
    return model, data


def token_model(vocab: int = 50, hidden: int = 8, classes: int = 3) -> bytes:
    """``input_ids``/``attention_mask`` ``[N, L]`` (``L`` dynamic) → embedding → masked mean → dense+tanh →
    dense → softmax."""
    rng = np.random.default_rng(0)
    emb = helper.make_tensor("emb", TensorProto.FLOAT, [vocab, 6], rng.normal(size=(vocab, 6)).ravel())
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [6, hidden], rng.normal(size=(6, hidden)).ravel())
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [hidden, classes], rng.normal(size=(hidden, classes)).ravel())
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
        [
            emb,
            w1,
            w2,
            helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
            helper.make_tensor("axes2", TensorProto.INT64, [1], [2]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def token_data(n: int = 120, length: int = 12, vocab: int = 50, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids below ``vocab`` of random lengths (at least 3), zero-padded to ``length``, with their mask."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (n, length)).astype(np.int64)
    lengths = rng.integers(3, length + 1, n)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    return {"input_ids": ids * mask, "attention_mask": mask}
