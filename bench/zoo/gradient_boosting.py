"""``lightgbm``: a LightGBM multiclass model (five classes) on generated numeric features, exported with
onnxmltools as users export it: one float input ``input`` ``[None, 20]``, outputs ``label`` and
``probabilities`` (``zipmap=False``).

Features from scikit-learn's ``make_classification`` (10 informative, 4 redundant, 6 noise features; 2 %
of the labels flipped), so the trees are accurate but not perfect. Training is single-threaded and
``deterministic``, so a seed gives the same trees. Shifts:

* ``scaled``: every feature multiplied by ``1 + 4 * strength`` (a unit change upstream);
* ``shifted``: every feature moved by ``1.5 * strength`` of its standard deviation (a calibration offset).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bench.zoo.core import (
    Shift,
    Split,
    ZooModel,
    cache_dir,
    graph_inputs,
    load_splits,
    save_bytes,
    save_splits,
    source_digest,
)

CLASSES = tuple(f"class_{i}" for i in range(5))
N_FEATURES = 20
SIZES = (4000, 1000, 1000)


def generate(seed: int, sizes: tuple[int, int, int]) -> dict[str, Split]:
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=sum(sizes),
        n_features=N_FEATURES,
        n_informative=10,
        n_redundant=4,
        n_classes=len(CLASSES),
        n_clusters_per_class=1,
        class_sep=1.0,
        flip_y=0.02,
        random_state=seed,
    )
    x, y = x.astype(np.float32), y.astype(np.int64)
    a, b = sizes[0], sizes[0] + sizes[1]
    parts = {"train": slice(0, a), "val": slice(a, b), "test": slice(b, None)}
    return {name: Split({"input": x[s]}, y[s]) for name, s in parts.items()}


def train(split: Split, seed: int) -> object:
    import lightgbm

    model = lightgbm.LGBMClassifier(
        n_estimators=60,
        min_child_samples=40,
        num_leaves=15,
        learning_rate=0.1,
        n_jobs=1,
        deterministic=True,
        force_row_wise=True,
        random_state=seed,
        verbose=-1,
    )
    model.fit(split.inputs["input"], split.y)
    return model


def export(model: object) -> bytes:
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    onx = convert_lightgbm(model, initial_types=[("input", FloatTensorType([None, N_FEATURES]))], zipmap=False)
    return onx.SerializeToString()


def scaled(split: Split, strength: float, seed: int) -> Split:
    del seed  # deterministic
    return split.with_inputs(input=(split.inputs["input"] * np.float32(1 + 4 * strength)).astype(np.float32))


def shifted_for(std: np.ndarray) -> Shift:
    def shifted(split: Split, strength: float, seed: int) -> Split:
        del seed  # deterministic
        return split.with_inputs(input=(split.inputs["input"] + np.float32(1.5 * strength) * std).astype(np.float32))

    return shifted


def build(workdir: str | os.PathLike[str], seed: int = 0, sizes: tuple[int, int, int] = SIZES) -> ZooModel:
    where = cache_dir(workdir, "lightgbm", seed, sizes, source_digest(__file__))
    splits = load_splits(where)
    path = where / "model.onnx"
    if splits is None or not path.is_file():
        splits = generate(seed, sizes)
        save_splits(where, splits)
        save_bytes(path, export(train(splits["train"], seed)))
    std = splits["train"].inputs["input"].std(axis=0).astype(np.float32)
    return ZooModel(
        name="lightgbm",
        kind="gradient_boosting",
        path=Path(path),
        inputs=graph_inputs(path.read_bytes()),
        classes=CLASSES,
        train=splits["train"],
        val=splits["val"],
        test=splits["test"],
        scores_output="probabilities",
        scores_kind="probabilities",
        shifts={"scaled": scaled, "shifted": shifted_for(std)},
    )
