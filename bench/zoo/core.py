"""What every zoo entry is: a real ONNX classifier, its declared inputs, seeded splits and its shifts.

A :class:`ZooModel` holds the model file, the inputs read from the graph itself (so the declaration cannot
drift from the file), the class names, train/validation/test :class:`Split` s (one array per graph input,
strings as object arrays) and named shifts ``shift(split, strength, seed) -> split`` whose ``strength`` runs
from 0 (the split unchanged) to 1 (strong). Predictions go through :class:`invariants.onnx_session.OnnxSession`,
the project's one onnxruntime adapter.

Builders cache what is slow (training, export, generated data) in a work directory, keyed by the entry's
name, seed, split sizes and a hash of the source files that produce it: editing a generator or a training
loop rebuilds, a second build with the same arguments reads the cache.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from invariants.onnx_session import OnnxSession

#: ONNX tensor element types by number (onnx.TensorProto), as (onnxruntime type, numpy dtype, V2 datatype).
ELEM_TYPES: dict[int, tuple[str, np.dtype, str]] = {
    1: ("tensor(float)", np.dtype(np.float32), "FP32"),
    2: ("tensor(uint8)", np.dtype(np.uint8), "UINT8"),
    3: ("tensor(int8)", np.dtype(np.int8), "INT8"),
    4: ("tensor(uint16)", np.dtype(np.uint16), "UINT16"),
    5: ("tensor(int16)", np.dtype(np.int16), "INT16"),
    6: ("tensor(int32)", np.dtype(np.int32), "INT32"),
    7: ("tensor(int64)", np.dtype(np.int64), "INT64"),
    8: ("tensor(string)", np.dtype(object), "BYTES"),
    9: ("tensor(bool)", np.dtype(np.bool_), "BOOL"),
    10: ("tensor(float16)", np.dtype(np.float16), "FP16"),
    11: ("tensor(double)", np.dtype(np.float64), "FP64"),
    12: ("tensor(uint32)", np.dtype(np.uint32), "UINT32"),
    13: ("tensor(uint64)", np.dtype(np.uint64), "UINT64"),
}
ScoresKind = Literal["probabilities", "logits"]
Dim = int | str | None


@dataclass(frozen=True)
class InputSpec:
    """One graph input: its name, ONNX element type number and shape (a string for a dynamic dimension)."""

    name: str
    elem_type: int
    shape: tuple[Dim, ...]

    @property
    def onnx_type(self) -> str:
        """As onnxruntime names it, e.g. ``tensor(float)``."""
        return ELEM_TYPES[self.elem_type][0]

    @property
    def numpy_dtype(self) -> np.dtype:
        """The dtype onnxruntime takes (``object`` for strings)."""
        return ELEM_TYPES[self.elem_type][1]

    @property
    def v2_datatype(self) -> str:
        """The Open Inference Protocol V2 datatype (``BYTES`` for strings)."""
        return ELEM_TYPES[self.elem_type][2]


def graph_inputs(model: bytes) -> tuple[InputSpec, ...]:
    """The inputs of a serialized ONNX model (initializers listed as inputs by old exporters excluded)."""
    import onnx

    proto = onnx.load_from_string(model)
    inits = {i.name for i in proto.graph.initializer}
    specs = []
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims: list[Dim] = []
        for d in tt.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
        specs.append(InputSpec(vi.name, int(tt.elem_type), tuple(dims)))
    return tuple(specs)


@dataclass(frozen=True)
class Split:
    """Model inputs by graph input name (first axis: samples) and class indices ``y`` int64 ``[N]``."""

    inputs: dict[str, np.ndarray]
    y: np.ndarray

    def __post_init__(self) -> None:
        for name, arr in self.inputs.items():
            if len(arr) != len(self.y):
                raise ValueError(f"input {name!r} has {len(arr)} rows, labels {len(self.y)}")

    def __len__(self) -> int:
        return len(self.y)

    def take(self, index: np.ndarray | slice) -> Split:
        return Split({k: v[index] for k, v in self.inputs.items()}, self.y[index])

    def with_inputs(self, **arrays: np.ndarray) -> Split:
        """A copy with some inputs replaced (what a shift returns)."""
        return Split({**self.inputs, **arrays}, self.y)

    def batches(self, size: int) -> Iterator[Split]:
        for start in range(0, len(self), size):
            yield self.take(slice(start, start + size))


#: ``shift(split, strength, seed)``: the split with its inputs shifted; strength 0 leaves it unchanged.
Shift = Callable[[Split, float, int], Split]


def check_strength(strength: float) -> float:
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"shift strength must be in [0, 1], got {strength}")
    return float(strength)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


@dataclass(frozen=True)
class ZooModel:
    """A real classifier with the data it was built for.

    ``scores_output`` names the graph output that holds the class scores and ``scores_kind`` whether they
    are probabilities or logits; ``penultimate`` names a graph value holding the representation before the
    last dense layer, where the network has one.
    """

    name: str
    kind: str
    path: Path
    inputs: tuple[InputSpec, ...]
    classes: tuple[str, ...]
    train: Split
    val: Split
    test: Split
    scores_output: str
    scores_kind: ScoresKind
    shifts: Mapping[str, Shift]
    penultimate: str | None = None
    notes: str = ""
    #: Rows per onnxruntime run in :meth:`probabilities` (small for large images).
    batch_size: int = 256

    @property
    def onnx_bytes(self) -> bytes:
        return self.path.read_bytes()

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    def shift(self, split: Split, strength: float, seed: int = 0, kind: str | None = None) -> Split:
        """``split`` under the shift ``kind`` (default: the entry's first shift) at ``strength`` in [0, 1]."""
        name = kind if kind is not None else next(iter(self.shifts))
        if name not in self.shifts:
            raise KeyError(f"{self.name} has no shift {name!r}; it has {', '.join(self.shifts)}")
        return self.shifts[name](split, check_strength(strength), seed)

    @cached_property
    def session(self) -> OnnxSession:
        """The entry's onnxruntime session, made on first use."""
        from invariants.onnx_session import OnnxSession

        return OnnxSession(self.onnx_bytes)

    def probabilities(self, split: Split, batch_size: int | None = None) -> np.ndarray:
        """Class probabilities float32 ``[N, K]`` from onnxruntime, ``batch_size`` rows per run."""
        parts = []
        for batch in split.batches(batch_size or self.batch_size):
            (scores,) = self.session.run(batch.inputs, [self.scores_output])
            parts.append(softmax(scores) if self.scores_kind == "logits" else scores.astype(np.float32))
        return np.concatenate(parts) if parts else np.zeros((0, len(self.classes)), np.float32)

    def accuracy(self, split: Split) -> float:
        return float((self.probabilities(split).argmax(axis=1) == split.y).mean())


# -- the cache --------------------------------------------------------------------------------------------
def source_digest(*modules_files: str) -> str:
    """A short hash of source files: a change to a generator or a training loop invalidates the cache."""
    h = hashlib.sha256()
    for f in (__file__, *modules_files):
        h.update(Path(f).read_bytes())
    return h.hexdigest()[:12]


def cache_dir(workdir: str | os.PathLike[str], name: str, seed: int, sizes: tuple[int, ...], digest: str) -> Path:
    return Path(workdir) / f"{name}-s{seed}-{'x'.join(map(str, sizes))}-{digest}"


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _storable(arr: np.ndarray) -> np.ndarray:
    """Object string arrays as fixed-width unicode: an ``.npz`` then needs no pickle to read back."""
    return arr.astype(np.str_) if arr.dtype == object else arr


def _restored(arr: np.ndarray) -> np.ndarray:
    return arr.astype(object) if arr.dtype.kind == "U" else arr


def save_splits(directory: Path, splits: Mapping[str, Split]) -> None:
    for part, split in splits.items():
        arrays: dict[str, Any] = {"y": split.y, **{f"x.{k}": _storable(v) for k, v in split.inputs.items()}}

        def write(tmp: Path, arrays: dict[str, Any] = arrays) -> None:
            with open(tmp, "wb") as fh:
                np.savez(fh, **arrays)

        _atomic_write(directory / f"{part}.npz", write)


def load_splits(directory: Path, parts: tuple[str, ...] = ("train", "val", "test")) -> dict[str, Split] | None:
    """The cached splits, or ``None`` when any is missing."""
    if not all((directory / f"{p}.npz").is_file() for p in parts):
        return None
    out = {}
    for p in parts:
        with np.load(directory / f"{p}.npz", allow_pickle=False) as z:
            inputs = {k[2:]: _restored(z[k]) for k in z.files if k.startswith("x.")}
            out[p] = Split(inputs, z["y"])
    return out


def save_bytes(path: Path, data: bytes) -> None:
    _atomic_write(path, lambda tmp: tmp.write_bytes(data))


def balanced_labels(n: int, n_classes: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` class indices, as equal in count as possible, in a seeded random order."""
    return rng.permutation(np.arange(n) % n_classes).astype(np.int64)
