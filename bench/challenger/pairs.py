"""Model versions with known truth, built as users build them, grouped by data set ("families").

* ``mnist`` (development: the estimator's design was chosen on it): the shipped CNN, a narrower CNN, the
  shipped recipe with another seed and the shipped recipe retrained on drifted data (``models/``, trained
  by ``models/train.py``).
* ``digits`` (held out): the shipped digits CNN and a perceptron of about the same accuracy.
* ``tabular`` (held out): the estimator benchmark's skl2onnx MLP, the same pipeline with another seed,
  and the pipeline retrained on the training data plus a drifted copy (a third of the features offset
  by one standard deviation, noise of half a standard deviation), trained here in memory, seeded.

A pair is (champion, challenger); every pair also runs the other way round where both directions
are of interest, and ``identical`` pairs a model with itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from agent.model.classifier import OnnxClassifier
from bench.estimators.subjects import Subject, digits, mnist, tabular

#: The seeded challenger models (``python -m bench.challenger.models.train`` rebuilds them).
MODELS = Path(__file__).resolve().parent / "models"


@dataclass(frozen=True)
class Family:
    """A data set (the benchmark subject, whose model is the first version), its model versions and
    the (champion, challenger) pairs to compare."""

    subject: Subject
    versions: dict[str, OnnxClassifier]
    pairs: tuple[tuple[str, str], ...]
    held_out: bool


def _onnx(name: str) -> OnnxClassifier:
    return OnnxClassifier.load(MODELS / f"{name}.onnx", name=name)


def _mnist() -> Family:
    s = mnist()
    versions = {
        "cnn": s.model,
        "small": _onnx("mnist_small"),
        "seed2": _onnx("mnist_seed2"),
        "drift": _onnx("mnist_drift"),
    }
    pairs = (("cnn", "small"), ("small", "cnn"), ("cnn", "seed2"), ("cnn", "drift"), ("drift", "cnn"), ("cnn", "cnn"))
    return Family(s, versions, pairs, held_out=False)


def _digits() -> Family:
    s = digits()
    versions = {"cnn": s.model, "mlp": _onnx("digits_mlp")}
    return Family(s, versions, (("cnn", "mlp"), ("mlp", "cnn")), held_out=True)


def _pipeline(x: np.ndarray, y: np.ndarray, seed: int, hidden: int = 64) -> OnnxClassifier:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    pipe = make_pipeline(
        StandardScaler(), MLPClassifier(hidden_layer_sizes=(hidden,), alpha=1e-3, max_iter=400, random_state=seed)
    )
    pipe.fit(x, y)
    onx = convert_sklearn(
        pipe,
        initial_types=[("input", FloatTensorType([None, x.shape[1]]))],
        options={id(pipe.steps[-1][1]): {"zipmap": False}},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    return OnnxClassifier(onx.SerializeToString(), name=f"tabular_mlp_{seed}")


def _tabular() -> Family:
    s = tabular()
    rng = np.random.default_rng(11)
    std = s.train_x.std(axis=0)
    cols = rng.choice(s.train_x.shape[1], s.train_x.shape[1] // 3, replace=False)
    drifted = s.train_x + rng.normal(0.0, 0.5, s.train_x.shape).astype(np.float32) * std
    drifted[:, cols] += rng.choice([-1.0, 1.0], len(cols)).astype(np.float32) * std[cols]
    versions = {
        "mlp": s.model,
        "seed8": _pipeline(s.train_x, s.train_y, 8),
        "retrained": _pipeline(np.concatenate([s.train_x, drifted]), np.concatenate([s.train_y, s.train_y]), 7, 32),
    }
    pairs = (("mlp", "seed8"), ("mlp", "retrained"), ("retrained", "mlp"))
    return Family(s, versions, pairs, held_out=True)


FAMILIES = {"mnist": _mnist, "digits": _digits, "tabular": _tabular}


def with_model(subject: Subject, model: OnnxClassifier) -> Subject:
    """The same data set with another model (to fit that model's oracle as the benchmark does)."""
    return replace(subject, model=model)
