"""Algorithm-dependent invariants (ADIs), ICOS paper §4.4, §5.4 and Table 5.

The nominal patterns of the model's last layer are learnt by a random forest trained on the
validation set's probability vectors to predict "the model is wrong" (Table 5: 100 models;
split criterion information gain ratio — scikit-learn offers entropy, i.e. information gain,
the closest criterion). A prediction violates the ADIs when the forest's hard vote (its
predicted class, scikit-learn's ``predict``) says "wrong".

The forest is exported to ONNX with skl2onnx (``zipmap=False``, explicit opsets) and is only
ever evaluated through :class:`~invariants.onnx_session.OnnxSession`, never through
scikit-learn, so a bundle holds no pickled estimator.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from invariants.fit_params import FitParams
from invariants.onnx_session import OnnxSession

__all__ = ["CRITERION", "DEFAULT_TARGET_OPSET", "AlgorithmInvariants"]

#: The forest's split criterion, the closest scikit-learn has to Table 5's (see above).
CRITERION = "entropy"
_DEFAULT = FitParams()

DEFAULT_TARGET_OPSET: Mapping[str, int] = {"": 17, "ai.onnx.ml": 3}
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
        """Train the forest (entropy criterion, ``n_estimators`` trees) and convert it to ONNX.

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

        from skl2onnx import convert_sklearn
        from skl2onnx.common.data_types import FloatTensorType
        from sklearn.ensemble import RandomForestClassifier

        forest = RandomForestClassifier(
            n_estimators=n_estimators, criterion=CRITERION, random_state=seed, n_jobs=n_jobs
        )
        forest.fit(probs, target.astype(np.int64))
        onnx_model = convert_sklearn(
            forest,
            initial_types=[(_INPUT, FloatTensorType([None, n_classes]))],
            options={id(forest): {"zipmap": False}},
            target_opset=opset,
        )
        return cls(bytes(onnx_model.SerializeToString()))

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
