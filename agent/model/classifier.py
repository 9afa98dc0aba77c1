"""The ONNX classifier runtime: load a model, discover its tensors, validate inputs, predict.

Accepted models:

* a single float output of logits (softmax is applied) or of probabilities;
* scikit-learn models converted by skl2onnx, as they come: with ZipMap (``output_probability``, a
  sequence of ``{class: probability}`` maps, the converter's default) or without (``probabilities``);
* any model whose score output is named by ``scores_output`` (with ``scores_kind`` saying whether it
  holds ``logits`` or ``probabilities``; ``auto`` decides from the graph and the values).

All ONNX execution goes through :class:`invariants.onnx_session.OnnxSession`.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypedDict, Unpack

import numpy as np

from agent.errors import UserError
from agent.model.graph import with_outputs
from agent.model.inputs import Inputs, InputSpec, InvalidInput, Signature, prepare
from agent.model.views import FeatureView, default_view
from invariants.onnx_session import OnnxLoadError, OnnxSession, TensorInfo

ScoresKind = Literal["auto", "logits", "probabilities"]

#: What a model takes: inputs by name, or one array for a single-input model.
Batch = Inputs | Mapping[str, np.ndarray] | np.ndarray

__all__ = ["Batch", "InvalidInput", "ModelLoadError", "OnnxClassifier", "Prediction"]


class ClassifierOptions(TypedDict, total=False):
    """The keyword options of :class:`OnnxClassifier`, written once for :meth:`OnnxClassifier.load` to pass
    on (their defaults are the constructor's)."""

    name: str | None
    scores_output: str | None
    scores_kind: ScoresKind
    classes: list[str] | None
    max_batch: int
    decision_threshold: float | None
    view: FeatureView | None


class ModelLoadError(UserError, ValueError):
    """The model file is missing, not ONNX, or not a classifier this runtime understands."""


@dataclass(frozen=True)
class Prediction:
    """Class probabilities float32 ``[N, K]`` and the predicted classes int64 ``[N]`` (indices into the
    model's classes; true labels are never called so here); ``extra``: the model's extra outputs the
    feature view reads (an embedding), by tensor name."""

    probabilities: np.ndarray
    predicted: np.ndarray
    extra: Mapping[str, np.ndarray] = field(default_factory=dict)

    @staticmethod
    def concatenate(parts: Sequence[Prediction]) -> Prediction:
        extra = {k: np.concatenate([p.extra[k] for p in parts]) for k in parts[0].extra} if parts else {}
        return Prediction(
            np.concatenate([p.probabilities for p in parts]), np.concatenate([p.predicted for p in parts]), extra
        )

    def take(self, index: np.ndarray | slice) -> Prediction:
        return Prediction(
            self.probabilities[index], self.predicted[index], {k: v[index] for k, v in self.extra.items()}
        )

    @property
    def confidences(self) -> np.ndarray:
        """Probability of the predicted class per sample (the top-class probability under argmax)."""
        return label_confidences(self.probabilities, self.predicted)


def predicted_classes_of(probabilities: np.ndarray, decision_threshold: float | None = None) -> np.ndarray:
    """Predicted class indices ``[N]`` from probabilities ``[N, K]``.

    ``decision_threshold`` applies to binary models only: class 1 when its probability is at least the
    threshold (a binary model tuned for recall or precision rarely decides at 0.5). ``None`` (or more
    than two classes) is argmax, which for two classes is the threshold 0.5 up to ties.
    """
    p = np.asarray(probabilities)
    if decision_threshold is None or p.ndim != 2 or p.shape[1] != 2:
        return p.argmax(axis=1).astype(np.int64)
    return (p[:, 1] >= decision_threshold).astype(np.int64)


def label_confidences(probabilities: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The probability the model gave its predicted class, per sample: what the confidence-based
    estimators read (the top-class probability when labels are argmax, not under a threshold)."""
    p = np.asarray(probabilities)
    idx = np.asarray(labels, dtype=np.int64).reshape(-1, 1)
    return np.take_along_axis(p, idx, axis=1)[:, 0] if len(p) else np.zeros(0, dtype=p.dtype)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _producer_ops(model_bytes: bytes) -> dict[str, str]:
    """Map output tensor name -> op type of the node that produces it (for logits detection)."""
    import onnx

    graph = onnx.load_from_string(model_bytes).graph
    produced: dict[str, str] = {}
    for node in graph.node:
        for out in node.output:
            produced[out] = node.op_type
    return {o.name: produced.get(o.name, "") for o in graph.output}


def scores_as_probabilities(s: np.ndarray, kind: str) -> np.ndarray:
    """float32 scores ``[N, K]`` (K ≥ 2) → probabilities: kept when ``kind`` says probabilities (or, for
    ``auto``, when every row is non-negative and sums to 1), else a softmax of the logits."""
    if kind == "probabilities":
        return s
    # the ufuncs' reductions themselves: ``s.min()`` and the like add a Python call each (request path)
    if kind == "auto" and np.minimum.reduce(s, axis=None) >= 0 and float(np.abs(s.sum(axis=1) - 1.0).max()) <= 1e-3:
        return s
    # softmax(s) in place: the same float32 operations without the temporaries
    z = s - np.maximum.reduce(s, axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= np.add.reduce(z, axis=1, keepdims=True)
    return z


def prepare_batch(
    x: np.ndarray, input_shape: tuple[int, ...], max_batch: int, dtype: np.dtype | None = None
) -> np.ndarray:
    """Validate a batch and bring it to ``[N, *input_shape]`` (and ``dtype`` when given).

    Accepts ``[N, *input_shape]``, flattened ``[N, prod(input_shape)]``, any ``[N, ...]`` with the
    same number of values per sample (e.g. ``N×H×W`` for one channel), or one sample without the
    batch dimension. Raises :class:`InvalidInput` naming the problem.
    """
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiub":
        raise InvalidInput("dtype", f"input dtype {arr.dtype} is not numeric")
    if arr.dtype.kind == "b":
        raise InvalidInput("dtype", "input dtype bool is not accepted; send numbers")
    if arr.shape == input_shape:
        arr = arr[None, ...]
    if arr.ndim < 1 or arr.shape[0] == 0:
        raise InvalidInput("empty", "input batch is empty")
    n = arr.shape[0]
    if n > max_batch:
        raise InvalidInput("too_large", f"batch of {n} samples exceeds the limit of {max_batch}")
    per_sample = math.prod(arr.shape[1:]) if arr.ndim > 1 else 1
    n_features = math.prod(input_shape)
    if per_sample != n_features:
        raise InvalidInput(
            "shape",
            f"input shape {list(arr.shape)} does not fit the model input {[-1, *input_shape]} "
            f"({per_sample} values per sample, expected {n_features})",
        )
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).reshape(n, -1).any(axis=1).sum())
        raise InvalidInput(
            "non_finite", f"input holds NaN or Inf values (or values beyond the {arr.dtype} range) in {bad} sample(s)"
        )
    out = arr.reshape((n, *input_shape))
    if dtype is not None and out.dtype != dtype:
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            if out.min() < info.min or out.max() > info.max:
                raise InvalidInput("dtype", f"input values do not fit the model's {dtype}")
        out = out.astype(dtype)
    return np.ascontiguousarray(out)


def read_model_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of an ONNX file (:class:`ModelLoadError` when it is missing, a directory or unreadable)."""
    p = Path(path)
    if p.is_dir():
        raise ModelLoadError(f"model file {p} is a directory, not an ONNX file")
    if not p.is_file():
        raise ModelLoadError(f"model file not found: {p}")
    try:
        return p.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"cannot read model file {p}: {exc.strerror or exc}") from None


def onnx_problem(model_bytes: bytes) -> str | None:
    """Why ``model_bytes`` is not an ONNX model, in a few words; ``None`` when it parses as one (with a
    graph). Meant for an error path: it parses the whole model."""
    import onnx

    try:
        model = onnx.load_from_string(model_bytes)
    except Exception as exc:  # protobuf's DecodeError, and whatever else a damaged file provokes
        return f"it does not parse as one: {type(exc).__name__}"
    if not model.graph.output:
        return "it has no graph outputs"
    return None


class OnnxClassifier:
    """A classifier loaded from an ONNX file, ready for batch prediction.

    Its inputs are what the graph declares (:attr:`signature`: one or several named inputs of any
    numeric or string type, dynamic dimensions allowed); batches are :class:`~agent.model.inputs.Inputs`
    (:meth:`prepare`). ``view`` is the feature view the invariants read (:mod:`agent.model.views`; by
    default the raw inputs of a single numeric input); its extra outputs (an embedding) come from the same
    session run. Thread-safe: ``predict`` may be called concurrently from a thread pool.
    """

    def __init__(
        self,
        model_bytes: bytes,
        *,
        path: str | None = None,
        name: str | None = None,
        scores_output: str | None = None,
        scores_kind: ScoresKind = "auto",
        classes: list[str] | None = None,
        max_batch: int = 4096,
        decision_threshold: float | None = None,
        view: FeatureView | None = None,
    ) -> None:
        self.model_bytes = model_bytes
        self.path = path
        self.sha256 = sha256_bytes(model_bytes)
        self.name = name or (Path(path).stem if path else "model")
        self.max_batch = max_batch
        #: Binary models: probability of class 1 from which it is predicted (None: argmax), from the bundle.
        self.decision_threshold: float | None = decision_threshold
        self.session = self._session(model_bytes)
        self.signature = Signature(tuple(_input_spec(i) for i in self.session.inputs))
        self._zipmap = False
        #: class names in the order of a ZipMap output's keys (None for tensor outputs)
        self.zipmap_classes: list[str] | None = None
        self.scores_output, self.scores_kind = self._pick_scores(scores_output, scores_kind)
        self.view = view if view is not None else default_view(self.signature)
        self._extra = self.view.extra_outputs
        if self._extra:
            self.session = self._session(with_outputs(model_bytes, self._extra))
        probe = self.predict_prepared(probe_inputs(self.signature, self.session))
        self.n_classes = int(probe.probabilities.shape[1])
        if self.n_classes < 2:
            raise ModelLoadError(
                f"output {self.scores_output!r} has {self.n_classes} column(s); a classifier needs >= 2"
            )
        if classes is not None and len(classes) != self.n_classes:
            raise ModelLoadError(f"{len(classes)} class names given but the model has {self.n_classes} classes")
        default = self.zipmap_classes or [str(i) for i in range(self.n_classes)]
        self.classes: list[str] = list(classes) if classes is not None else default

    def _session(self, model_bytes: bytes) -> OnnxSession:
        try:
            return OnnxSession(model_bytes)
        except OnnxLoadError as exc:
            raise ModelLoadError(load_error_remedy(str(exc).replace("in-memory model", self.path or "model"))) from exc

    def with_view(self, view: FeatureView) -> OnnxClassifier:
        """The same model reading ``view`` (a new session when the view needs extra outputs)."""
        return OnnxClassifier(
            self.model_bytes,
            path=self.path,
            name=self.name,
            scores_output=self.scores_output,
            scores_kind=self.scores_kind,  # type: ignore[arg-type]
            classes=self.classes,
            max_batch=self.max_batch,
            decision_threshold=self.decision_threshold,
            view=view,
        )

    def with_decision_threshold(self, decision_threshold: float | None) -> OnnxClassifier:
        """The same model (the same session) predicting with ``decision_threshold``; this one is unchanged."""
        other = copy.copy(self)
        other.decision_threshold = decision_threshold
        return other

    # -- the single input of models that have one (older callers) --------------------------------
    @property
    def input(self) -> TensorInfo:
        """The model's first input (its only one for single-input models)."""
        return self.session.inputs[0]

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape per sample of a single fixed-size input (refused for other models)."""
        spec = self.signature.single
        if spec is None or not spec.fixed:
            raise ModelLoadError(f"model {self.name!r} has inputs {self.signature.names} of dynamic or several shapes")
        return tuple(int(d) for d in spec.shape if d is not None)

    @property
    def n_features(self) -> int:
        """Columns of the feature view."""
        return self.view.width or int(np.prod(self.input_shape))

    @classmethod
    def load(cls, path: str | os.PathLike[str], **options: Unpack[ClassifierOptions]) -> OnnxClassifier:
        return cls(read_model_file(path), path=str(path), **options)

    def _pick_scores(self, scores_output: str | None, scores_kind: ScoresKind) -> tuple[str, ScoresKind]:
        floats = [o for o in self.session.outputs if o.dtype.kind == "f"]
        maps = [o for o in self.session.outputs if _is_zipmap(o)]
        by_name = {o.name: o for o in self.session.outputs}
        if scores_output is not None:
            if scores_output not in by_name:
                raise ModelLoadError(
                    f"scores_output {scores_output!r} is not an output of the model (outputs: {', '.join(by_name)})"
                )
            chosen = scores_output
            if by_name[chosen].dtype.kind != "f" and not _is_zipmap(by_name[chosen]):
                raise ModelLoadError(
                    f"scores_output {scores_output!r} holds {by_name[chosen].onnx_type}, not class scores "
                    "(a float tensor [N, K] or a sequence of {class: probability} maps)"
                )
        elif "probabilities" in by_name and by_name["probabilities"].dtype.kind == "f":
            chosen = "probabilities"
        elif len(floats) == 1:
            chosen = floats[0].name
        elif not floats and len(maps) == 1:
            chosen = maps[0].name
        else:
            candidates = ", ".join(o.name for o in floats + maps) or "none"
            raise ModelLoadError(
                f"cannot tell which output holds the class scores (candidates: {candidates}); "
                "set scores_output (fit/check: --scores-output)"
            )
        self._zipmap = _is_zipmap(by_name[chosen])
        if self._zipmap:
            return chosen, "probabilities"  # ZipMap carries the classifier's predict_proba
        if scores_kind == "auto":
            producer = _producer_ops(self.model_bytes).get(chosen, "")
            if producer == "Softmax" or chosen == "probabilities":
                scores_kind = "probabilities"
        return chosen, scores_kind

    # -- inputs ---------------------------------------------------------------------------
    def prepare(self, x: Batch) -> Inputs:
        """Validate a batch and bring every input to the model's shape and dtype (see :func:`prepare`)."""
        if isinstance(x, Inputs):
            return x
        return prepare(self.signature, x, self.max_batch)

    def prepare_file(self, x: Batch) -> Inputs:
        """:meth:`prepare` for a whole data file (``fit``, ``check``, audits): ``max_batch`` bounds one
        request, not a file, whose predictions run in batches anyway."""
        if isinstance(x, Inputs):
            return x
        n = len(next(iter(x.values()))) if isinstance(x, Mapping) else len(x)
        return prepare(self.signature, x, max(1, n))

    def prepare_array(self, x: np.ndarray) -> np.ndarray:
        """A single-input model's batch validated and shaped (its only input's array)."""
        spec = self.signature.single
        if spec is None:
            raise InvalidInput("missing_input", f"the model takes {len(self.signature.inputs)} inputs; name each")
        return self.prepare(x)[spec.name]

    def features(self, x: Inputs | np.ndarray, prediction: Prediction | None = None) -> np.ndarray:
        """The feature view of prepared inputs, float32 ``[N, D]`` (what the invariants read); an embedding
        view reads it from ``prediction`` (the model runs again without it). A single-input model also
        takes its prepared array."""
        x = self._as_inputs(x)
        if self.view.extra_outputs:
            extra = prediction.extra if prediction is not None and prediction.extra else self.predict_prepared(x).extra
            return self.view.features(x, extra)
        return self.view.features(x)

    # -- prediction -----------------------------------------------------------------------
    def scores_to_probabilities(self, scores: np.ndarray) -> np.ndarray:
        s = np.asarray(scores, dtype=np.float32)
        if s.ndim == 1:
            s = s[:, None]
        if s.ndim != 2:
            s = s.reshape(len(s), -1)
        if s.shape[1] == 1:  # binary classifier with a single score column
            p1 = s[:, 0] if self.scores_kind == "probabilities" else 1.0 / (1.0 + np.exp(-s[:, 0]))
            return np.stack([1.0 - p1, p1], axis=1).astype(np.float32)
        return scores_as_probabilities(s, self.scores_kind)

    def _as_inputs(self, x: Inputs | np.ndarray) -> Inputs:
        """Prepared inputs, also a single-input model's prepared array."""
        if isinstance(x, Inputs):
            return x
        spec = self.signature.single
        if spec is None:
            raise InvalidInput("missing_input", f"the model takes {len(self.signature.inputs)} inputs; name each")
        return Inputs({spec.name: x})

    def predict_prepared(self, x: Inputs | np.ndarray) -> Prediction:
        out = self.session.run(self._as_inputs(x), [self.scores_output, *self._extra])
        scores = out[0]
        if self._zipmap:
            scores = self._zipmap_scores(scores)
        proba = self.scores_to_probabilities(scores)
        extra = dict(zip(self._extra, out[1:], strict=True)) if self._extra else {}
        return Prediction(proba, predicted_classes_of(proba, self.decision_threshold), extra)

    def predict(self, x: Batch) -> Prediction:
        return self.predict_prepared(self.prepare(x))

    def _zipmap_scores(self, rows: object) -> np.ndarray:
        """ZipMap's ``[{class: p, ...}, ...]`` as float32 ``[N, K]``, columns in the converter's class order
        (the order of the first map's keys, kept as :attr:`zipmap_classes`)."""
        seq = list(rows) if isinstance(rows, list | np.ndarray) else []
        if not seq:
            return np.zeros((0, len(self.zipmap_classes or ())), dtype=np.float32)
        keys = list(seq[0].keys())
        if self.zipmap_classes is None:
            self.zipmap_classes = [str(k) for k in keys]
        return np.array([[row[k] for k in keys] for row in seq], dtype=np.float32)

    def predict_proba(self, x: Batch) -> np.ndarray:
        """Probabilities of any number of samples (run in batches: audits pass whole data sets)."""
        return self.predict_batched(x).probabilities

    def predict_batched(self, x: Batch, batch_size: int | None = None) -> Prediction:
        """Predict a large batch in chunks (for offline work; by default as many samples as fit in
        :data:`~agent.model.inputs.BATCH_BYTES`, at most 512)."""
        inputs = self.prepare_file(x)
        batch_size = batch_size or self.signature.batch_rows(512)
        if len(inputs) <= batch_size:
            return self.predict_prepared(inputs)
        parts = [self.predict_prepared(b) for b in inputs.batches(batch_size)]
        return Prediction.concatenate(parts)

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": self.path,
            "sha256": self.sha256,
            "inputs": self.signature.to_list(),
            "scores_output": self.scores_output,
            "scores_kind": self.scores_kind,
            "classes": self.classes,
            "view": self.view.kind,
        }


def _input_spec(info: TensorInfo) -> InputSpec:
    """A graph input as an :class:`InputSpec` (refusing types no client can send)."""
    if info.dtype.kind not in "fiubO" or not info.onnx_type.startswith("tensor("):
        raise ModelLoadError(f"model input {info.name!r} has unsupported type {info.onnx_type}")
    if len(info.shape) < 1:
        raise ModelLoadError(f"model input {info.name!r} must have a batch dimension [N, ...], got a scalar")
    return InputSpec(info.name, info.dtype, tuple(info.shape[1:]))


def probe_inputs(signature: Signature, session: OnnxSession) -> Inputs:
    """A batch of one sample the model surely accepts (zeros, empty text; a dynamic dimension of the
    first size the model runs with among 1, 8, 32, 224), to learn the model's outputs."""
    last: Exception | None = None
    for size in (1, 8, 32, 224):
        arrays: dict[str, np.ndarray] = {}
        for spec in signature.inputs:
            shape = (1, *(size if d is None else d for d in spec.shape))
            if spec.is_string:
                arrays[spec.name] = np.full(shape, "", dtype=object)
            elif "mask" in spec.name.lower():
                arrays[spec.name] = np.ones(shape, dtype=spec.dtype)
            else:
                arrays[spec.name] = np.zeros(shape, dtype=spec.dtype)
        batch = Inputs(arrays)
        try:
            session.run(batch)
            return batch
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own error types; the next size may fit
            last = exc
            if signature.inputs and all(s.fixed for s in signature.inputs):
                break
    raise ModelLoadError(f"the model does not run on a zero batch of its own input shape: {last}")


def load_error_remedy(message: str) -> str:
    """An onnxruntime load error with the fix a user needs, where one is known."""
    if "locale" in message.lower():
        return (
            f"{message} (the model's string operators need the en_US.UTF-8 locale: install it, e.g. "
            "`apt-get install locales && locale-gen en_US.UTF-8`, as `make test` and the container image do)"
        )
    return message


def _is_zipmap(info: TensorInfo) -> bool:
    """A skl2onnx ZipMap output: ``seq(map(int64|string, tensor(float)))``."""
    return info.onnx_type.startswith("seq(map(")


def default_model_path() -> Path:
    """The shipped MNIST CNN (LeNet-style, 28×28 grey input in raw pixel scale 0..255)."""
    return Path(__file__).parent.parent / "shipped_models" / "mnist_cnn.onnx"
