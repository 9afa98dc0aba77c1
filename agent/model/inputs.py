"""A model's inputs as the model declares them (:class:`Signature`) and one batch of them (:class:`Inputs`).

A deployed classifier takes one or several named inputs of any ONNX type: a float image, one column
per table feature (numbers, or strings for categories and free text, as skl2onnx exports a
``ColumnTransformer``), token ids and an attention mask of a dynamic sequence length (as every BERT
export). :func:`prepare` validates a batch against the signature and brings each input to the model's
dtype and shape; everything downstream (the model, the feature view, the perturbations of ``fit``)
reads :class:`Inputs`, an immutable mapping of name → array with one row per sample.

A model with a single input also takes a bare array (and, when its dimensions are fixed, a batch
flattened to ``[N, prod(shape)]``), as it always did.
"""

from __future__ import annotations

import functools
import math
from collections.abc import ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.errors import ClientError

#: V2 datatype names of the numpy dtypes a model input can have.
_V2: dict[tuple[str, int], str] = {
    ("b", 1): "BOOL",
    ("u", 1): "UINT8",
    ("u", 2): "UINT16",
    ("u", 4): "UINT32",
    ("u", 8): "UINT64",
    ("i", 1): "INT8",
    ("i", 2): "INT16",
    ("i", 4): "INT32",
    ("i", 8): "INT64",
    ("f", 2): "FP16",
    ("f", 4): "FP32",
    ("f", 8): "FP64",
}


class InvalidInput(ClientError, ValueError):
    """A batch the model cannot take. ``reason`` is a short, bounded label for metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, status=413 if reason == "too_large" else 400, reason=reason)


#: Bytes of inputs in one batch of offline work (fit, check, audits): 16 MiB.
BATCH_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, numpy dtype (``object`` for strings) and shape per sample (``None`` for
    a dynamic dimension)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]

    # Read for every request: computed once (the spec is frozen).
    @functools.cached_property
    def is_string(self) -> bool:
        return self.dtype.kind in "OUS"

    @functools.cached_property
    def datatype(self) -> str:
        """The V2 datatype of this input (``BYTES`` for strings)."""
        return "BYTES" if self.is_string else _V2[(self.dtype.kind, self.dtype.itemsize)]

    @functools.cached_property
    def fixed(self) -> bool:
        """Whether every dimension (but the batch's) is fixed."""
        return all(d is not None for d in self.shape)

    @functools.cached_property
    def size(self) -> int | None:
        """Values per sample (None with a dynamic dimension)."""
        return math.prod(d for d in self.shape if d is not None) if self.fixed else None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": [-1 if d is None else d for d in self.shape]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> InputSpec:
        datatype = str(d["datatype"])
        dtype = np.dtype(object) if datatype == "BYTES" else np.dtype(_DTYPES[datatype])
        return cls(str(d["name"]), dtype, tuple(None if int(x) < 0 else int(x) for x in d["shape"]))


_DTYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}


@dataclass(frozen=True)
class Signature:
    """The inputs of a model, in the graph's order."""

    inputs: tuple[InputSpec, ...]

    @property
    def names(self) -> list[str]:
        return [i.name for i in self.inputs]

    def get(self, name: str) -> InputSpec | None:
        return self._by_name.get(name)

    @functools.cached_property
    def _by_name(self) -> dict[str, InputSpec]:
        """The inputs by name (the first of a repeated name), for :meth:`get` on the request path."""
        out: dict[str, InputSpec] = {}
        for i in self.inputs:
            out.setdefault(i.name, i)
        return out

    def batch_rows(self, limit: int = 256, target_bytes: int = BATCH_BYTES) -> int:
        """Samples per batch of offline work: ``limit``, fewer for large fixed-size samples so that one
        batch of inputs stays near ``target_bytes`` (the model's activations grow with it: a batch of 256
        images of 3×224×224 would hold gigabytes of them)."""
        per_sample = sum((s.size or 0) * (s.dtype.itemsize if not s.is_string else 0) for s in self.inputs)
        return max(1, min(limit, target_bytes // per_sample)) if per_sample else limit

    @property
    def single(self) -> InputSpec | None:
        """The input of a single-input model (None for several)."""
        return self.inputs[0] if len(self.inputs) == 1 else None

    def to_list(self) -> list[dict[str, Any]]:
        return [i.to_dict() for i in self.inputs]

    @classmethod
    def from_list(cls, items: Sequence[Mapping[str, Any]]) -> Signature:
        return cls(tuple(InputSpec.from_dict(d) for d in items))

    @classmethod
    def of_array(cls, name: str, shape: Sequence[int | None], dtype: np.dtype | str = "float32") -> Signature:
        """The signature of a single numeric input (bundles written before signatures were kept)."""
        return cls((InputSpec(name, np.dtype(dtype), tuple(shape)),))


class Inputs(Mapping[str, np.ndarray]):
    """One batch of a model's inputs: arrays by input name, each with the batch's ``n`` rows first."""

    __slots__ = ("_arrays", "n")

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._arrays = dict(arrays)
        sizes = {k: len(v) for k, v in self._arrays.items()}
        if len(set(sizes.values())) > 1:
            raise InvalidInput("shape", f"inputs hold different numbers of samples: {sizes}")
        self.n = next(iter(sizes.values()), 0)

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        """The number of *samples* (not of inputs: iterate for the names)."""
        return self.n

    # The mixins of ``Mapping`` go through ``__getitem__`` per name: the dictionary's own views are read
    # on the request path (onnxruntime's feeds, the reservoir, the rules' inputs).
    def __contains__(self, name: object) -> bool:
        return name in self._arrays

    def keys(self) -> KeysView[str]:
        return self._arrays.keys()

    def values(self) -> ValuesView[np.ndarray]:
        return self._arrays.values()

    def items(self) -> ItemsView[str, np.ndarray]:
        return self._arrays.items()

    def get(self, name: str, default: Any = None) -> Any:
        return self._arrays.get(name, default)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self._arrays.items())
        return f"Inputs({shapes})"

    @property
    def nbytes(self) -> int:
        return sum(int(getattr(v, "nbytes", 0)) for v in self._arrays.values())

    def take(self, index: np.ndarray | slice) -> Inputs:
        """The samples at ``index`` (an index array or a slice)."""
        return Inputs({k: v[index] for k, v in self._arrays.items()})

    def batches(self, size: int) -> Iterator[Inputs]:
        for start in range(0, self.n, size):
            yield self.take(slice(start, start + size))

    def replace(self, name: str, values: np.ndarray) -> Inputs:
        """The same batch with input ``name`` replaced (a perturbation)."""
        return Inputs({**self._arrays, name: values})

    @staticmethod
    def concatenate(parts: Sequence[Inputs]) -> Inputs:
        """Batches one after the other (inputs of a dynamic length are padded with zeros to the longest)."""
        if len(parts) == 1:
            return parts[0]
        out: dict[str, np.ndarray] = {}
        for name in parts[0]:
            arrays = [p[name] for p in parts]
            if arrays[0].ndim >= 2 and len({a.shape[1:] for a in arrays}) > 1:
                width = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
                arrays = [_pad(a, width) for a in arrays]
            out[name] = np.concatenate(arrays)
        return Inputs(out)


def _pad(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros((len(a), *shape), dtype=a.dtype)
    out[(slice(None), *(slice(0, d) for d in a.shape[1:]))] = a
    return out


def _strings(name: str, arr: np.ndarray) -> np.ndarray:
    """Text values as an object array of ``str`` (bytes are read as UTF-8)."""
    if arr.dtype.kind == "U":
        return arr.astype(object)
    flat = arr.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    for i, v in enumerate(flat):
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInput("data", f"input {name!r}: value {i} is not UTF-8 text") from None
        elif not isinstance(v, str):
            if v is None or (isinstance(v, float) and math.isnan(v)):
                v = ""
            elif isinstance(v, int | float | np.number):
                v = str(v)
            else:
                raise InvalidInput("data", f"input {name!r}: value {i} is {type(v).__name__}, not text")
        out[i] = v
    return out.reshape(arr.shape)


def _fit_shape(spec: InputSpec, arr: np.ndarray, single: bool) -> np.ndarray:
    """``arr`` ``[N, ...]`` in the input's shape ``[N, *spec.shape]``: exact (dynamic dimensions free), or,
    for an input whose dimensions are fixed, any layout with the same number of values per sample."""
    n = arr.shape[0]
    per = arr.shape[1:]
    if per == spec.shape:  # the common case, without the loop below
        return arr
    if len(per) == len(spec.shape) and all(d is None or d == p for d, p in zip(spec.shape, per, strict=True)):
        return arr
    want = [-1, *(-1 if d is None else d for d in spec.shape)]
    if spec.fixed:
        size = math.prod(per) if per else 1
        if size == spec.size:
            return arr.reshape((n, *(d for d in spec.shape if d is not None)))
        what = f"{size} values per sample, expected {spec.size}"
    else:
        what = f"rank {len(per) + 1}, expected {len(spec.shape) + 1}"
    label = "input" if single else f"input {spec.name!r}"
    raise InvalidInput("shape", f"{label} shape {list(arr.shape)} does not fit the model input {want} ({what})")


def _fit_dtype(spec: InputSpec, arr: np.ndarray, single: bool) -> np.ndarray:
    label = "input" if single else f"input {spec.name!r}"
    if spec.is_string:
        if arr.dtype.kind not in "OUS":
            raise InvalidInput("dtype", f"{label} holds {arr.dtype} values; the model takes text")
        return _strings(spec.name, arr)
    kind = arr.dtype.kind
    if kind not in "fiub" or kind == "O":
        raise InvalidInput("dtype", f"{label} dtype {arr.dtype} is not numeric")
    if kind == "b" and spec.dtype.kind != "b":
        raise InvalidInput("dtype", f"{label}: dtype bool is not accepted; send numbers")
    if kind == "f" and not np.logical_and.reduce(np.isfinite(arr), axis=None):  # ``.all()`` without its Python call
        bad = int((~np.isfinite(arr)).reshape(len(arr), -1).any(axis=1).sum())
        raise InvalidInput(
            "non_finite", f"{label} holds NaN or Inf values (or values beyond the {arr.dtype} range) in {bad} sample(s)"
        )
    if arr.dtype == spec.dtype:
        return arr
    if spec.dtype.kind in "iub" and arr.size:
        if arr.dtype.kind == "f" and not np.array_equal(arr, np.round(arr)):
            raise InvalidInput("dtype", f"{label} holds fractions; the model takes {spec.dtype}")
        if spec.dtype.kind != "b":
            info = np.iinfo(spec.dtype)
            if arr.min() < info.min or arr.max() > info.max:
                raise InvalidInput("dtype", f"{label} values do not fit the model's {spec.dtype}")
    if spec.dtype.kind == "f" and arr.dtype.kind == "f" and arr.size:
        with np.errstate(over="ignore"):
            out = arr.astype(spec.dtype)
        if not np.isfinite(out).all():
            raise InvalidInput("non_finite", f"{label} holds values beyond the model's {spec.dtype} range")
        return out
    return arr.astype(spec.dtype)


def prepare(signature: Signature, batch: Mapping[str, Any] | np.ndarray, max_batch: int) -> Inputs:
    """Validate a batch and bring every input to the model's dtype and shape; raises
    :class:`InvalidInput` naming the problem. ``batch``: the inputs by name, or, for a single-input model,
    one array (also a single sample without its batch dimension)."""
    single = signature.single
    if isinstance(batch, Mapping):
        given = dict(batch)
    elif single is not None:
        given = {single.name: batch}
    else:
        raise InvalidInput(
            "missing_input", f"the model takes {len(signature.inputs)} inputs ({', '.join(signature.names)}); name each"
        )
    unknown = [k for k in given if signature.get(k) is None]
    if unknown:
        raise InvalidInput(
            "unknown_input", f"unknown input {unknown[0]!r}; the model's inputs are {', '.join(signature.names)}"
        )
    missing = [s.name for s in signature.inputs if s.name not in given]
    if missing:
        raise InvalidInput(
            "missing_input", f"missing input {missing[0]!r}; the model's inputs are {', '.join(signature.names)}"
        )
    out: dict[str, np.ndarray] = {}
    n: int | None = None
    for spec in signature.inputs:
        arr = np.asarray(given[spec.name]) if not isinstance(given[spec.name], np.ndarray) else given[spec.name]
        if spec.fixed and arr.shape == spec.shape:
            arr = arr[None, ...]  # one sample without its batch dimension
        if arr.ndim < 1 or arr.shape[0] == 0:
            raise InvalidInput("empty", "input batch is empty")
        if arr.shape[0] > max_batch:
            raise InvalidInput("too_large", f"batch of {arr.shape[0]} samples exceeds the limit of {max_batch}")
        if n is not None and arr.shape[0] != n:
            raise InvalidInput("shape", f"input {spec.name!r} has {arr.shape[0]} samples, the others {n}")
        n = arr.shape[0]
        arr = _fit_shape(spec, arr, single is not None)
        out[spec.name] = np.ascontiguousarray(_fit_dtype(spec, arr, single is not None))
    return Inputs(out)


def datatype_of(dtype: np.dtype) -> str:
    """The V2 datatype of a numpy dtype (``BYTES`` for text)."""
    d = np.dtype(dtype)
    return "BYTES" if d.kind in "OUS" else _V2[(d.kind, d.itemsize)]


def rule_values(batch: Inputs, names: frozenset[str] | set[str]) -> dict[str, np.ndarray]:
    """The values IDI rules read of named inputs (``{input: city, ...}``): one value per sample of each
    (``[N]``; an ``[N, 1]`` column flattened), passed to the oracle with the metadata."""
    out: dict[str, np.ndarray] = {}
    for name in names:
        if name in batch:
            arr = batch[name]
            out[name] = arr.reshape(batch.n, -1)[:, 0] if arr.ndim > 1 else arr
    return out
