"""Decision trees evaluated as numpy arrays, with onnxruntime's exact semantics.

The oracle's TDI tree and ADI forest used to run in an onnxruntime session: exact, but one call
costs about 100 µs before the first comparison, more than a small CNN's own inference at batch 1.
:class:`TreeArrays` holds a forest as flat node arrays (feature, float32 threshold, true/false
child) and finds every sample's leaf in every tree with a fixed number of numpy calls, whatever the
depth, by the QuickScorer bit-vector method (Lucchese et al., SIGIR 2015): each tree starts with a
bit per leaf set; every node whose test fails clears the leaves of its true (left) subtree; the exit
leaf is the leftmost leaf still set.

Semantics are onnxruntime's ``BRANCH_LEQ`` on float32: ``x <= t`` compared in float32, a NaN goes to
the false child unless ``nodes_missing_value_tracks_true`` is set. :func:`forest_from_onnx` reads a
binary ``TreeEnsembleClassifier`` (what skl2onnx writes for the ADI forest) and
:meth:`ForestClassifier.predict` reproduces onnxruntime's label: the leaf weights summed tree after
tree in float32 (``np.cumsum`` adds sequentially, as onnxruntime's single-threaded loop does), then
``score > 0.5`` (``> 0`` when a weight is negative). Graphs in any other form are not compiled
(:func:`forest_from_onnx` returns None) and keep running in onnxruntime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ForestClassifier", "TreeArrays", "forest_from_onnx"]

_WORD = 64
_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class _Tree:
    """One tree in node-id order: ``true_child[i] < 0`` marks a leaf."""

    feature: np.ndarray
    threshold: np.ndarray  # float32
    true_child: np.ndarray
    false_child: np.ndarray
    nan_true: np.ndarray  # bool: a NaN input goes to the true child


class TreeArrays:
    """A forest compiled for :meth:`leaves`: the leaf node id of every sample in every tree.

    Build it from per-tree node arrays (:meth:`from_trees`); a leaf is a node whose true child is
    negative. Thresholds must already be float32 (the comparison is done in float32).
    """

    def __init__(self, trees: Sequence[_Tree]) -> None:
        if not trees:
            raise ValueError("a forest needs at least one tree")
        self.n_trees = len(trees)
        leaf_lists = [_leaves_in_order(t) for t in trees]
        self.words = max(1, max((len(leaves) + _WORD - 1) // _WORD for leaves in leaf_lists))
        width = self.words * _WORD
        feats: list[np.ndarray] = []
        thresholds: list[np.ndarray] = []
        nan_true: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        starts: list[int] = []
        #: [T, words * 64]: the node id of each tree's k-th leaf from the left (padding: -1)
        self.leaf_node = np.full((self.n_trees, width), -1, dtype=np.int64)
        offset = 0
        for ti, (tree, leaves) in enumerate(zip(trees, leaf_lists, strict=True)):
            self.leaf_node[ti, : len(leaves)] = leaves
            ordinal = {int(node): k for k, node in enumerate(leaves)}
            inner = np.flatnonzero(tree.true_child >= 0)
            tree_masks = np.empty((max(1, len(inner)), self.words), dtype=np.uint64)
            tree_masks[:] = _ONES
            for row, node in enumerate(inner):
                for leaf in _subtree_leaves(tree, int(tree.true_child[node])):
                    k = ordinal[leaf]
                    tree_masks[row, k // _WORD] &= ~np.uint64(1 << (k % _WORD))
            if len(inner) == 0:  # a lone leaf: one always-true test that clears nothing
                feats.append(np.zeros(1, dtype=np.int64))
                thresholds.append(np.full(1, np.inf, dtype=np.float32))
                nan_true.append(np.ones(1, dtype=bool))
            else:
                feats.append(tree.feature[inner].astype(np.int64))
                thresholds.append(tree.threshold[inner].astype(np.float32))
                nan_true.append(tree.nan_true[inner].astype(bool))
            masks.append(tree_masks)
            starts.append(offset)
            offset += len(tree_masks)
        self._feature = np.concatenate(feats)
        self._threshold = np.concatenate(thresholds)
        self._nan_true = np.concatenate(nan_true)
        self._any_nan_true = bool(self._nan_true.any())
        self._masks = np.concatenate(masks)  # [M, words]
        self._masks_1 = self._masks[:, 0].copy() if self.words == 1 else None
        self._starts = np.asarray(starts, dtype=np.intp)
        self.n_features = int(self._feature.max()) + 1

    @classmethod
    def from_trees(
        cls,
        trees: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    ) -> TreeArrays:
        """Trees as ``(feature, threshold_float32, true_child, false_child, nan_goes_true)`` arrays."""
        out = []
        for feature, threshold, true_child, false_child, nan_true in trees:
            thr = np.asarray(threshold)
            if thr.dtype != np.float32:
                raise ValueError(f"thresholds must be float32, got {thr.dtype}")
            out.append(
                _Tree(
                    np.asarray(feature, dtype=np.int64),
                    thr,
                    np.asarray(true_child, dtype=np.int64),
                    np.asarray(false_child, dtype=np.int64),
                    np.asarray(nan_true, dtype=bool),
                )
            )
        return cls(out)

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """Leaf node id (within its tree) of each sample in each tree, int64 ``[N, T]``."""
        x = np.asarray(x, dtype=np.float32)
        n = x.shape[0]
        if n == 0:
            return np.zeros((0, self.n_trees), dtype=np.int64)
        values = x[:, self._feature]  # [N, M] float32
        go_true = values <= self._threshold
        if self._any_nan_true:
            go_true |= np.isnan(values) & self._nan_true
        if self._masks_1 is not None:
            cleared = np.where(go_true, _ONES, self._masks_1)  # [N, M]
            alive = np.bitwise_and.reduceat(cleared, self._starts, axis=1)  # [N, T]
            ordinal = _lowest_bit(alive)
        else:
            cleared3 = np.where(go_true[:, :, None], _ONES, self._masks[None, :, :])  # [N, M, W]
            alive3 = np.bitwise_and.reduceat(cleared3, self._starts, axis=1)  # [N, T, W]
            word = (alive3 != 0).argmax(axis=2)
            first = np.take_along_axis(alive3, word[:, :, None], axis=2)[:, :, 0]
            ordinal = word * _WORD + _lowest_bit(first)
        return self.leaf_node[np.arange(self.n_trees), ordinal]


def _lowest_bit(words: np.ndarray) -> np.ndarray:
    """Index of the lowest set bit of each (non-zero) uint64."""
    low = words & (~words + np.uint64(1))
    return np.log2(low.astype(np.float64)).astype(np.int64)  # exact: powers of two


def _leaves_in_order(tree: _Tree) -> list[int]:
    """Leaf node ids, true (left) subtrees first."""
    return _subtree_leaves(tree, 0)


def _subtree_leaves(tree: _Tree, root: int) -> list[int]:
    out: list[int] = []
    stack = [root]
    for _ in range(len(tree.true_child) + 1):  # bounded: each node is visited once
        if not stack:
            break
        node = stack.pop()
        if tree.true_child[node] < 0:
            out.append(node)
        else:
            stack.append(int(tree.false_child[node]))
            stack.append(int(tree.true_child[node]))
    return out


@dataclass(frozen=True)
class ForestClassifier:
    """A binary tree-ensemble classifier as arrays: its label equals onnxruntime's
    ``TreeEnsembleClassifier`` label bit for bit (see the module docstring)."""

    arrays: TreeArrays
    #: [T, max node id + 1] float32: the weight a tree's leaf adds to the score
    weight: np.ndarray
    labels: tuple[int, int]
    #: ``score > cutoff`` picks ``labels[1]``: 0.5 when every weight is >= 0, else 0
    cutoff: float

    #: The trees' node arrays, as given to :meth:`TreeArrays.from_trees`.
    trees: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]

    def tree(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Tree ``t``'s ``(feature, threshold, true_child, false_child, nan_goes_true)``."""
        return self.trees[t]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted labels, int64 ``[N]``."""
        return self.label_of_leaves(self.arrays.leaves(x))

    def label_of_leaves(self, leaves: np.ndarray) -> np.ndarray:
        """Labels from every tree's leaf node id (int ``[N, T]``, e.g. from a larger pass)."""
        contributions = self.weight[np.arange(self.weight.shape[0]), leaves]  # [N, T] float32
        if contributions.shape[0] == 0:
            return np.zeros(0, dtype=np.int64)
        score = np.cumsum(contributions, axis=1, dtype=np.float32)[:, -1]  # sequential float32 sum
        return np.where(score > np.float32(self.cutoff), self.labels[1], self.labels[0]).astype(np.int64)


def forest_from_onnx(onnx_bytes: bytes) -> ForestClassifier | None:
    """The ``label`` output of a one-node binary ``TreeEnsembleClassifier`` graph as a
    :class:`ForestClassifier`, or None when the graph has another form (then keep onnxruntime)."""
    import onnx
    from onnx import helper

    model = onnx.load_model_from_string(onnx_bytes)
    graph = model.graph
    if len(graph.node) != 1 or len(graph.input) != 1:
        return None
    node = graph.node[0]
    if node.op_type != "TreeEnsembleClassifier" or node.domain != "ai.onnx.ml":
        return None
    if list(node.input) != [graph.input[0].name] or not node.output or node.output[0] != "label":
        return None
    attrs: dict[str, Any] = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    allowed = {
        "class_ids", "class_nodeids", "class_treeids", "class_weights", "classlabels_int64s",
        "nodes_falsenodeids", "nodes_featureids", "nodes_hitrates", "nodes_missing_value_tracks_true",
        "nodes_modes", "nodes_nodeids", "nodes_treeids", "nodes_truenodeids", "nodes_values", "post_transform",
    }  # fmt: skip
    if set(attrs) - allowed or attrs.get("post_transform", b"NONE") not in (b"NONE", "NONE"):
        return None
    labels = [int(v) for v in attrs.get("classlabels_int64s", [])]
    class_ids = np.asarray(attrs.get("class_ids", []), dtype=np.int64)
    # onnxruntime's "binary case": two labels and every weight for one class id
    if len(labels) != 2 or len(class_ids) == 0 or len(set(class_ids.tolist())) != 1:
        return None
    tree_ids = np.asarray(attrs["nodes_treeids"], dtype=np.int64)
    node_ids = np.asarray(attrs["nodes_nodeids"], dtype=np.int64)
    feature = np.asarray(attrs["nodes_featureids"], dtype=np.int64)
    threshold = np.asarray(attrs["nodes_values"], dtype=np.float32)
    true_ids = np.asarray(attrs["nodes_truenodeids"], dtype=np.int64)
    false_ids = np.asarray(attrs["nodes_falsenodeids"], dtype=np.int64)
    modes = [m.decode() if isinstance(m, bytes) else str(m) for m in attrs["nodes_modes"]]
    nan_true = np.asarray(attrs.get("nodes_missing_value_tracks_true", [0] * len(modes)), dtype=bool)
    if not len(tree_ids) == len(node_ids) == len(feature) == len(threshold) == len(modes) == len(nan_true):
        return None
    if set(modes) - {"BRANCH_LEQ", "LEAF"} or not np.all(np.diff(tree_ids) >= 0):
        return None
    n_trees = int(tree_ids.max()) + 1
    if set(np.unique(tree_ids).tolist()) != set(range(n_trees)):
        return None
    is_leaf = np.array([m == "LEAF" for m in modes])
    trees = []
    width = 0
    for t in range(n_trees):
        sel = np.flatnonzero(tree_ids == t)
        ids = node_ids[sel]
        if sorted(ids.tolist()) != list(range(len(ids))):
            return None
        order = sel[np.argsort(ids)]
        leaf = is_leaf[order]
        true_c = np.where(leaf, -1, true_ids[order])
        false_c = np.where(leaf, -1, false_ids[order])
        inner = ~leaf
        if inner.any() and (true_c[inner].max() >= len(ids) or false_c[inner].max() >= len(ids)):
            return None
        trees.append((feature[order], threshold[order], true_c, false_c, nan_true[order]))
        width = max(width, len(ids))
    weight = np.zeros((n_trees, width), dtype=np.float32)
    seen = np.zeros((n_trees, width), dtype=bool)
    weights = np.asarray(attrs["class_weights"], dtype=np.float32)
    for t, n, w in zip(attrs["class_treeids"], attrs["class_nodeids"], weights, strict=True):
        if not (0 <= t < n_trees and 0 <= n < width) or seen[t, n]:
            return None  # two weights on one leaf would be added in another order
        seen[t, n] = True
        weight[t, n] = w
    cutoff = 0.5 if bool((weights >= 0).all()) else 0.0
    return ForestClassifier(TreeArrays.from_trees(trees), weight, (labels[0], labels[1]), cutoff, tuple(trees))
