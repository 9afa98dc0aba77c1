"""Algorithm-dependent invariants (ADIs), ICOS paper §4.4, §5.4 and Table 5.

The nominal patterns of the model's last layer are learnt by a random forest trained on the
validation set's probability vectors to predict "the model is wrong" (Table 5: 100 models;
split criterion information gain ratio — scikit-learn offers entropy, i.e. information gain,
the closest criterion). A prediction violates the ADIs when the forest's hard vote (its
predicted class, scikit-learn's ``predict``) says "wrong".

The forest is exported to ONNX as the one ``TreeEnsembleClassifier`` node skl2onnx writes for it
(``zipmap=False``: the same attributes, thresholds rounded the same way; :func:`forest_onnx` builds them
with numpy, as skl2onnx's converter visits each node in Python, which took minutes and gigabytes for
forests of millions of nodes) and is only ever evaluated through
:class:`~invariants.onnx_session.OnnxSession`, never through scikit-learn, so a bundle holds no
pickled estimator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from invariants.fit_params import FitParams
from invariants.onnx_session import OnnxSession

__all__ = ["CRITERION", "DEFAULT_TARGET_OPSET", "AlgorithmInvariants"]

#: The forest's split criterion, the closest scikit-learn has to Table 5's (see above).
CRITERION = "entropy"
_DEFAULT = FitParams()

DEFAULT_TARGET_OPSET: Mapping[str, int] = {"": 17, "ai.onnx.ml": 3}
#: Rows each tree of the forest is grown on, at most (its bootstrap sample; scikit-learn's
#: ``max_samples``). A fully grown tree has about as many leaves as the errors it memorises: over the
#: validation part of a million-row reference table a forest of such trees is millions of nodes,
#: hundreds of MB of ONNX that take minutes and gigabytes to convert and stay in every agent serving
#: the bundle. Validation sets up to this size are sampled as the paper's forest samples them (all rows).
MAX_TREE_SAMPLES = 20_000
_INPUT = "x"
_LABEL = "label"
_CONSTANT_KEY = "icos.adi.constant"


def _constant_model(n_classes: int, answer: int) -> bytes:
    """A graph ``x[N, K] -> label[N] = answer`` for a training set holding a single class."""
    from onnx import TensorProto, helper

    shape = helper.make_node("Shape", [_INPUT], ["n"], start=0, end=1)
    fill = helper.make_node(
        "ConstantOfShape",
        ["n"],
        [_LABEL],
        value=helper.make_tensor("answer", TensorProto.INT64, [1], [int(answer)]),
    )
    graph = helper.make_graph(
        [shape, fill],
        "icos_adi_constant",
        [helper.make_tensor_value_info(_INPUT, TensorProto.FLOAT, [None, n_classes])],
        [helper.make_tensor_value_info(_LABEL, TensorProto.INT64, [None])],
    )
    # a fixed, widely supported pair: opset 17 (Shape with start/end needs >= 15) and IR version 8;
    # recent onnx releases default to an IR version older onnxruntime builds refuse
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model.producer_name = "icos-agent"
    entry = model.metadata_props.add()
    entry.key, entry.value = _CONSTANT_KEY, str(int(answer))
    return bytes(model.SerializeToString())


def _float32_thresholds(threshold: np.ndarray) -> np.ndarray:
    """scikit-learn's float64 thresholds as float32 ones that split float32 inputs the same way
    (``x <= t``): rounded down where rounding to nearest went up (skl2onnx's ``sklearn_threshold``)."""
    t = np.asarray(threshold, dtype=np.float64)
    f = t.astype(np.float32)
    return np.where(f.astype(np.float64) > t, np.nextafter(f, np.float32(-np.inf)), f)


def forest_onnx(forest: Any, n_classes: int, opset: Mapping[str, int]) -> bytes:
    """A fitted binary ``RandomForestClassifier`` (classes 0 and 1) as an ONNX graph ``x[N, K] ->
    label[N], probabilities[N, 2]``: one ``TreeEnsembleClassifier`` whose attributes are those of
    skl2onnx's converter (every tree's nodes in its order, leaves with the share of class 1 divided by the
    number of trees), built with numpy."""
    from onnx import TensorProto, helper

    trees = [e.tree_ for e in forest.estimators_]
    weight = 1.0 / len(trees)
    parts: dict[str, list[np.ndarray]] = {}

    def add(name: str, values: np.ndarray) -> None:
        parts.setdefault(name, []).append(values)

    for tree_id, tree in enumerate(trees):
        n = int(tree.node_count)
        ids = np.arange(n, dtype=np.int64)
        left, right = tree.children_left.astype(np.int64), tree.children_right.astype(np.int64)
        branch = (left > ids) | (right > ids)
        add("nodes_treeids", np.full(n, tree_id, dtype=np.int64))
        add("nodes_nodeids", ids)
        add("nodes_featureids", np.where(branch, tree.feature, 0).astype(np.int64))
        add("nodes_values", np.where(branch, _float32_thresholds(tree.threshold), 0.0).astype(np.float32))
        add("nodes_truenodeids", np.where(branch, left, 0))
        add("nodes_falsenodeids", np.where(branch, right, 0))
        add("nodes_modes", branch)
        leaves = ids[~branch]
        value = np.asarray(tree.value[leaves], dtype=np.float64).reshape(len(leaves), -1)
        total = value.sum(axis=1)
        factor = weight / np.where(total != 0.0, total, 1.0)
        add("class_treeids", np.full(len(leaves), tree_id, dtype=np.int64))
        add("class_nodeids", leaves)
        add("class_weights", (value[:, 1] * factor).astype(np.float32))
    joined = {k: np.concatenate(v) for k, v in parts.items()}
    modes = np.where(joined.pop("nodes_modes"), b"BRANCH_LEQ", b"LEAF").tolist()
    n_nodes, n_leaves = len(modes), len(joined["class_nodeids"])
    node = helper.make_node(
        "TreeEnsembleClassifier",
        [_INPUT],
        [_LABEL, "probabilities"],
        domain="ai.onnx.ml",
        name="TreeEnsembleClassifier",
        class_ids=[0] * n_leaves,
        class_nodeids=joined["class_nodeids"].tolist(),
        class_treeids=joined["class_treeids"].tolist(),
        class_weights=joined["class_weights"].tolist(),
        classlabels_int64s=[int(c) for c in forest.classes_],
        nodes_falsenodeids=joined["nodes_falsenodeids"].tolist(),
        nodes_featureids=joined["nodes_featureids"].tolist(),
        nodes_hitrates=[1.0] * n_nodes,
        nodes_missing_value_tracks_true=[0] * n_nodes,
        nodes_modes=modes,
        nodes_nodeids=joined["nodes_nodeids"].tolist(),
        nodes_treeids=joined["nodes_treeids"].tolist(),
        nodes_truenodeids=joined["nodes_truenodeids"].tolist(),
        nodes_values=joined["nodes_values"].tolist(),
        post_transform="NONE",
    )
    del joined
    graph = helper.make_graph(
        [node],
        "icos_adi_forest",
        [helper.make_tensor_value_info(_INPUT, TensorProto.FLOAT, [None, n_classes])],
        [
            helper.make_tensor_value_info(_LABEL, TensorProto.INT64, [None]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 2]),
        ],
    )
    opsets = [helper.make_opsetid("", opset.get("", 17)), helper.make_opsetid("ai.onnx.ml", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    model.producer_name = "icos-agent"
    return bytes(model.SerializeToString())


class AlgorithmInvariants:
    """A "model wrong" detector over probability vectors, held as ONNX bytes."""

    def __init__(self, onnx_bytes: bytes) -> None:
        self.onnx_bytes: bytes = bytes(onnx_bytes)
        self._session = OnnxSession(self.onnx_bytes)
        if len(self._session.inputs) != 1:
            raise ValueError(f"ADI model must have one input, it has {len(self._session.inputs)}")
        self._input = self._session.inputs[0]
        if self._input.onnx_type != "tensor(float)" or len(self._input.shape) != 2:
            raise ValueError(f"ADI model input must be float [N, K], got {self._input.onnx_type} {self._input.shape}")
        if _LABEL not in {o.name for o in self._session.outputs}:
            raise ValueError(f"ADI model has no {_LABEL!r} output")
        self.n_classes: int | None = self._input.shape[1]
        self.constant: bool | None = self._read_constant()

    @classmethod
    def fit(
        cls,
        probabilities: np.ndarray,
        wrong: np.ndarray,
        *,
        n_estimators: int = _DEFAULT.n_estimators,
        seed: int = _DEFAULT.seed,
        target_opset: Mapping[str, int] | None = None,
        n_jobs: int = 1,
    ) -> AlgorithmInvariants:
        """Train the forest (entropy criterion, ``n_estimators`` trees, each on a bootstrap sample of at
        most :data:`MAX_TREE_SAMPLES` rows) and convert it to ONNX.

        When ``wrong`` holds a single class (no wrong prediction, or only wrong ones) the
        result is a constant model answering that class.
        """
        opset = dict(target_opset if target_opset is not None else DEFAULT_TARGET_OPSET)
        probs = np.asarray(probabilities, dtype=np.float32)
        target = np.asarray(wrong).reshape(-1).astype(bool)
        if probs.ndim != 2 or probs.shape[1] == 0:
            raise ValueError(f"probabilities must be [N, K], got shape {probs.shape}")
        if probs.shape[0] != target.shape[0]:
            raise ValueError(f"{probs.shape[0]} probability vectors but {target.shape[0]} wrong/right flags")
        if probs.shape[0] == 0:
            raise ValueError("no data to fit the algorithm-dependent invariants")
        if not np.isfinite(probs).all():
            raise ValueError("probabilities contain NaN or infinite values")
        n_classes = int(probs.shape[1])
        if target.all() or not target.any():
            return cls(_constant_model(n_classes, int(target[0])))

        from sklearn.ensemble import RandomForestClassifier

        forest = RandomForestClassifier(
            n_estimators=n_estimators,
            criterion=CRITERION,
            random_state=seed,
            n_jobs=n_jobs,
            max_samples=MAX_TREE_SAMPLES if len(probs) > MAX_TREE_SAMPLES else None,
        )
        forest.fit(probs, target.astype(np.int64))
        return cls(forest_onnx(forest, n_classes, opset))

    @classmethod
    def from_onnx(cls, onnx_bytes: bytes) -> AlgorithmInvariants:
        """Load the ONNX bytes written by :attr:`onnx_bytes`."""
        return cls(onnx_bytes)

    def evaluate(self, probabilities: np.ndarray) -> np.ndarray:
        """``True`` where the forest's hard vote predicts a misprediction (bool [N])."""
        probs = np.asarray(probabilities, dtype=np.float32)
        if probs.ndim != 2:
            raise ValueError(f"probabilities must be [N, K], got shape {probs.shape}")
        if self.n_classes is not None and probs.shape[1] != self.n_classes:
            raise ValueError(f"probabilities have {probs.shape[1]} classes, the ADI model expects {self.n_classes}")
        if probs.shape[0] == 0:
            return np.zeros(0, dtype=bool)
        (label,) = self._session.run({self._input.name: np.ascontiguousarray(probs)}, [_LABEL])
        return np.asarray(label).reshape(-1).astype(bool)

    def __repr__(self) -> str:
        kind = f"constant {self.constant}" if self.constant is not None else "random forest"
        return f"AlgorithmInvariants({kind}, {self.n_classes} classes, {len(self.onnx_bytes)} bytes)"

    def _read_constant(self) -> bool | None:
        from onnx import load_model_from_string

        model = load_model_from_string(self.onnx_bytes)
        for entry in model.metadata_props:
            if entry.key == _CONSTANT_KEY:
                return entry.value not in ("0", "")
        return None
