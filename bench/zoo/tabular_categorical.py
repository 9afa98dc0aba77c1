"""``tabular_categorical``: a ``ColumnTransformer`` (StandardScaler on numeric columns, OneHotEncoder on
string columns) and a logistic regression, over generated customer rows.

Exported as users export a pipeline fed by a pandas DataFrame: ``skl2onnx.to_onnx(pipeline, frame[:1])``
makes one ONNX input per column, ``[None, 1]`` each, typed from the frame's dtypes: ``age`` FP64,
``income`` FP32, ``tenure_months`` INT64, ``city``, ``device`` and ``plan`` strings. Outputs ``label`` and
``probabilities`` (``zipmap=False``).

Each class has a linear score over the standardised numbers and a seeded effect per category; the label is
the class with the highest score plus Gumbel noise, so the logistic regression is the right model and the
noise alone keeps it from being perfect. ``city`` is the most informative string column, ``income`` the most
informative number. Shifts:

* ``unseen_category``: ``city``, with probability ``strength``, becomes a city the encoder never saw
  (``handle_unknown="ignore"`` encodes it as all zeros);
* ``scaled_numeric``: ``income`` multiplied by ``1 + strength`` (a unit changed upstream: twice the values at
  strength 1).
"""

from __future__ import annotations

import os
from pathlib import Path

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

CLASSES = ("stays", "downgrades", "upgrades", "churns")
CITIES = tuple(f"city_{c}" for c in "abcdefghijkl")
DEVICES = ("ios", "android", "web", "desktop")
PLANS = ("free", "basic", "pro", "enterprise")
NUMERIC = {"age": np.float64, "income": np.float32, "tenure_months": np.int64}
CATEGORICAL = {"city": CITIES, "device": DEVICES, "plan": PLANS}
SIZES = (3000, 1000, 1000)
#: Gumbel noise scale of the class scores: sets how far from perfect the right model can be.
NOISE = 0.4


class RowModel:
    """The seeded class scores: numeric weights and per-category effects, one row per class."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng([seed, 201])
        k = len(CLASSES)
        self.numeric_w = rng.normal(0, 1, (len(NUMERIC), k)) * np.array([[0.6], [1.4], [0.5]])
        self.effects = {
            name: rng.normal(0, scale, (len(values), k))
            for (name, values), scale in zip(CATEGORICAL.items(), (1.6, 0.5, 0.8), strict=True)
        }

    def rows(self, n: int, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], np.ndarray]:
        age = np.clip(rng.normal(40, 12, n), 18, 90)
        income = np.exp(rng.normal(3.6, 0.5, n))  # thousands
        tenure = rng.integers(0, 120, n)
        z = np.stack([(age - 40) / 12, (np.log(income) - 3.6) / 0.5, (tenure - 60) / 35], axis=1)
        scores = z @ self.numeric_w
        columns: dict[str, np.ndarray] = {
            "age": np.round(age, 1).astype(np.float64),
            "income": np.round(income, 2).astype(np.float32),
            "tenure_months": tenure.astype(np.int64),
        }
        for name, values in CATEGORICAL.items():
            idx = rng.integers(0, len(values), n)
            scores = scores + self.effects[name][idx]
            columns[name] = np.array(values, dtype=object)[idx]
        y = (scores + rng.gumbel(0, NOISE, scores.shape)).argmax(axis=1).astype(np.int64)
        return columns, y


def _as_inputs(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.reshape(-1, 1) for k, v in columns.items()}


def generate(rows: RowModel, n: int, rng: np.random.Generator) -> Split:
    """``n`` rows, resampled so that the classes are balanced (the scores alone favour some)."""
    want = balanced_labels(n, len(CLASSES), rng)
    need = np.bincount(want, minlength=len(CLASSES))
    picked: list[dict[str, np.ndarray]] = []
    labels: list[np.ndarray] = []
    for _ in range(50):
        if not need.any():
            break
        cols, y = rows.rows(4 * n, rng)
        keep = np.zeros(len(y), bool)
        for c in range(len(CLASSES)):
            keep[np.flatnonzero(y == c)[: need[c]]] = True
            need[c] -= int(min(need[c], (y == c).sum()))
        picked.append({k: v[keep] for k, v in cols.items()})
        labels.append(y[keep])
    if need.any():
        raise RuntimeError("could not draw balanced rows")
    y_all = np.concatenate(labels)
    order = rng.permutation(len(y_all))
    columns = {k: np.concatenate([p[k] for p in picked])[order] for k in picked[0]}
    return Split(_as_inputs(columns), y_all[order])


def frame(split: Split) -> object:
    import pandas as pd

    return pd.DataFrame({k: v[:, 0] for k, v in split.inputs.items()})


def train(train_split: Split) -> object:
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    pre = ColumnTransformer(
        [
            ("numeric", StandardScaler(), list(NUMERIC)),
            ("categorical", OneHotEncoder(handle_unknown="ignore"), list(CATEGORICAL)),
        ]
    )
    pipe = Pipeline([("pre", pre), ("clf", LogisticRegression(max_iter=2000))])
    pipe.fit(frame(train_split), train_split.y)
    return pipe


def export(pipeline: object, train_split: Split) -> bytes:
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    onx = to_onnx(pipeline, frame(train_split.take(slice(0, 1))), options={LogisticRegression: {"zipmap": False}})
    return onx.SerializeToString()


def unseen_category(split: Split, strength: float, seed: int) -> Split:
    rng = np.random.default_rng([seed, 11])
    city = split.inputs["city"].copy()
    hit = rng.random(len(city)) < strength
    city[hit, 0] = np.array([f"city_new_{i}" for i in rng.integers(0, 5, int(hit.sum()))], dtype=object)
    return split.with_inputs(city=city)


def scaled_numeric(split: Split, strength: float, seed: int) -> Split:
    del seed  # deterministic
    return split.with_inputs(income=(split.inputs["income"] * np.float32(1 + strength)).astype(np.float32))


def build(workdir: str | os.PathLike[str], seed: int = 0, sizes: tuple[int, int, int] = SIZES) -> ZooModel:
    where = cache_dir(workdir, "tabular_categorical", seed, sizes, source_digest(__file__))
    splits = load_splits(where)
    path = where / "model.onnx"
    if splits is None or not path.is_file():
        rows, rng = RowModel(seed), np.random.default_rng([seed, 202])
        splits = {part: generate(rows, n, rng) for part, n in zip(("train", "val", "test"), sizes, strict=True)}
        save_splits(where, splits)
        save_bytes(path, export(train(splits["train"]), splits["train"]))
    return ZooModel(
        name="tabular_categorical",
        kind="tabular",
        path=Path(path),
        inputs=graph_inputs(path.read_bytes()),
        classes=CLASSES,
        train=splits["train"],
        val=splits["val"],
        test=splits["test"],
        scores_output="probabilities",
        scores_kind="probabilities",
        shifts={"unseen_category": unseen_category, "scaled_numeric": scaled_numeric},
    )
