"""A small gradient-boosted regression forest stored as plain JSON numbers (no pickle).

Fitted with scikit-learn's ``GradientBoostingRegressor`` (squared error), then kept as arrays per
tree (split feature, threshold, children, leaf value) and evaluated with numpy. scikit-learn
compares ``float32(x) <= threshold``; :meth:`TreeEnsemble.predict` does the same, so predictions
match ``GradientBoostingRegressor.predict`` up to float rounding of the sums.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tree:
    """One regression tree: ``left[i] == -1`` marks a leaf whose output is ``value[i]``."""

    feature: tuple[int, ...]
    threshold: tuple[float, ...]
    left: tuple[int, ...]
    right: tuple[int, ...]
    value: tuple[float, ...]

    def predict(self, x: np.ndarray) -> np.ndarray:
        feature, threshold = np.asarray(self.feature), np.asarray(self.threshold)
        left, right, value = np.asarray(self.left), np.asarray(self.right), np.asarray(self.value)
        node = np.zeros(len(x), dtype=np.int64)
        rows = np.arange(len(x))
        for _ in range(len(left)):
            inner = left[node] != -1
            if not inner.any():
                break
            go_left = x[rows, feature[node]] <= threshold[node]
            node = np.where(inner, np.where(go_left, left[node], right[node]), node)
        return np.asarray(value[node], dtype=np.float64)


@dataclass(frozen=True)
class TreeEnsemble:
    """``init + rate * Σ tree(x)`` over float32 features."""

    init: float
    rate: float
    trees: tuple[Tree, ...]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predictions for ``x`` [N, F] (or one row [F])."""
        arr = np.asarray(x, dtype=np.float32)
        one = arr.ndim == 1
        arr = arr.reshape(1, -1) if one else arr
        out = np.full(len(arr), self.init, dtype=np.float64)
        for t in self.trees:
            out += self.rate * t.predict(arr)
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "init": self.init,
            "rate": self.rate,
            "trees": [
                {
                    "feature": list(t.feature),
                    "threshold": list(t.threshold),
                    "left": list(t.left),
                    "right": list(t.right),
                    "value": list(t.value),
                }
                for t in self.trees
            ],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> TreeEnsemble:
        trees = []
        for t in d["trees"]:  # type: ignore[attr-defined]
            tree = Tree(
                feature=tuple(int(v) for v in t["feature"]),
                threshold=tuple(float(v) for v in t["threshold"]),
                left=tuple(int(v) for v in t["left"]),
                right=tuple(int(v) for v in t["right"]),
                value=tuple(float(v) for v in t["value"]),
            )
            if not len(tree.feature) == len(tree.threshold) == len(tree.left) == len(tree.right) == len(tree.value):
                raise ValueError("tree arrays of different lengths")
            trees.append(tree)
        return cls(float(d["init"]), float(d["rate"]), tuple(trees))  # type: ignore[arg-type]

    @classmethod
    def fit(
        cls,
        x: np.ndarray,
        y: np.ndarray,
        *,
        n_trees: int = 150,
        depth: int = 3,
        rate: float = 0.05,
        subsample: float = 0.8,
        seed: int = 0,
        sample_weight: Sequence[float] | np.ndarray | None = None,
    ) -> TreeEnsemble:
        """Fit with scikit-learn's gradient boosting (squared error) and keep the arrays."""
        from sklearn.ensemble import GradientBoostingRegressor

        gb = GradientBoostingRegressor(
            n_estimators=n_trees, max_depth=depth, learning_rate=rate, subsample=subsample, random_state=seed
        )
        gb.fit(np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.float64), sample_weight=sample_weight)
        init = float(np.asarray(gb.init_.predict(np.zeros((1, np.asarray(x).shape[1]), dtype=np.float32))).ravel()[0])
        trees = []
        for est in gb.estimators_[:, 0]:
            tr = est.tree_
            trees.append(
                Tree(
                    feature=tuple(int(max(f, 0)) for f in tr.feature),
                    threshold=tuple(float(t) for t in tr.threshold),
                    left=tuple(int(c) for c in tr.children_left),
                    right=tuple(int(c) for c in tr.children_right),
                    value=tuple(float(v) for v in tr.value[:, 0, 0]),
                )
            )
        return cls(init, rate, tuple(trees))
