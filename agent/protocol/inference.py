"""The Open Inference Protocol's request and answer as the agent holds them, whatever the wire: named
tensors, the request id and parameters, the outputs asked for; and the bounds every decoder checks
before it stores, echoes or allocates anything a client sent.

The HTTP codec (:mod:`agent.protocol.v2`: JSON and the binary tensor extension) and the gRPC codec
(:mod:`agent.protocol.v2_grpc`) decode their wire format into :class:`InferRequest` and encode
:class:`InferResponse` back; nothing between the two knows which wire a request came on.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from agent.errors import ClientError

#: V2 datatype → numpy dtype (little-endian, as the binary extension specifies).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}

#: Default bound on the elements of one tensor, checked on its declared shape before anything is allocated.
DEFAULT_MAX_ELEMENTS = 1 << 24


#: Largest dimension and rank a shape may declare (V2 shapes are int64; numpy and every consumer
#: downstream assume far less). Checked beside the element count, so ``[0, 10**30]`` is refused too.
MAX_DIMENSION = (1 << 31) - 1
MAX_RANK = 32


#: Longest request id, in UTF-8 bytes. The id is stored with every prediction of the request (its
#: predictions are ``<id>:<index>``) and echoed in the answer, so it is bounded before anything else;
#: a longer one is refused with 400 ``id_too_long``. A UUID takes 36 bytes.
MAX_REQUEST_ID_BYTES = 256
#: Bounds on a request's (and each tensor's) ``parameters``: at most this many entries, their keys and
#: string values together at most :data:`MAX_PARAMETER_BYTES` bytes (413 ``parameters_too_large``).
#: Parameters are forwarded upstream and IDI metadata is read from them; real clients send a handful.
MAX_PARAMETERS = 64
MAX_PARAMETER_BYTES = 16 * 1024

_KIND_SIZE_TO_DATATYPE = {(dt.kind, dt.itemsize): name for name, dt in DATATYPES.items() if name != "BYTES"}


class ProtocolError(ClientError, ValueError):
    """A malformed V2 body. ``reason`` is a short bounded label; ``status`` the HTTP status to answer."""

    def __init__(self, reason: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


def datatype_of(arr: np.ndarray) -> str:
    """The V2 datatype name of a numpy array (object/str/bytes arrays are ``BYTES``)."""
    if arr.dtype.kind in "OSU":
        return "BYTES"
    try:
        return _KIND_SIZE_TO_DATATYPE[(arr.dtype.kind, arr.dtype.itemsize)]
    except KeyError as exc:
        raise ValueError(f"numpy dtype {arr.dtype} has no V2 datatype") from exc


@dataclass
class Tensor:
    """A named tensor: numpy data of the V2 ``datatype`` (``BYTES`` as an object array of ``bytes``).

    ``binary``: on a request, whether it came as binary data; on an answer, whether HTTP encodes it
    as binary data (the binary tensor extension) rather than JSON numbers."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)
    binary: bool = False
    #: A BYTES tensor of a few known values: its elements as codes into a :class:`Vocabulary` (``data`` holds
    #: the same elements), so that the encoders write it without a Python step per element.
    coded: tuple[np.ndarray, Vocabulary] | None = None

    def bytes_wire(self) -> bytes:
        """The length-prefixed serialisation of a BYTES tensor (:func:`encode_bytes_elements`)."""
        if self.coded is not None:
            return self.coded[1].wire(self.coded[0])
        return encode_bytes_elements(self.data)

    def bytes_elements(self) -> list[bytes]:
        """A BYTES tensor's elements as ``bytes``, in order."""
        if self.coded is not None:
            return self.coded[1].elements(self.coded[0]).tolist()  # type: ignore[no-any-return]
        return [v if isinstance(v, bytes) else str(v).encode() for v in self.data.reshape(-1).tolist()]

    def bytes_texts(self) -> list[str]:
        """A BYTES tensor's elements as text (UTF-8, invalid bytes replaced), as JSON answers carry them."""
        if self.coded is not None:
            return self.coded[1].texts(self.coded[0]).tolist()  # type: ignore[no-any-return]
        return [
            v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in self.data.reshape(-1).tolist()
        ]


#: Up to this many elements, :meth:`Vocabulary.wire` joins each code's bytes (fewer steps than the table's).
SMALL_CODES = 16


class Vocabulary:
    """The few values a coded BYTES tensor takes (e.g. the oracle's verdicts), each encoded once: a
    tensor of ``n`` codes becomes its elements, its text or its length-prefixed wire form in a few numpy
    operations, whatever ``n``."""

    def __init__(self, values: tuple[bytes, ...]) -> None:
        self.values = values
        self._elements = np.array(values, dtype=object)
        self._texts = np.array([v.decode("utf-8", "replace") for v in values], dtype=object)
        wire = [len(v).to_bytes(4, "little") + v for v in values]
        width = max((len(w) for w in wire), default=0)
        self._table = np.zeros((len(values), width), dtype=np.uint8)
        for i, w in enumerate(wire):
            self._table[i, : len(w)] = np.frombuffer(w, dtype=np.uint8)
        self._lengths = np.array([len(w) for w in wire], dtype=np.int64)
        self._columns = np.arange(width)
        self._wire = wire

    def elements(self, codes: np.ndarray) -> np.ndarray:
        """The elements of ``codes``, an object array of ``bytes``."""
        return self._elements[np.asarray(codes, dtype=np.intp).reshape(-1)]  # type: ignore[no-any-return]

    def texts(self, codes: np.ndarray) -> np.ndarray:
        """The elements of ``codes`` as text, an object array of ``str``."""
        return self._texts[np.asarray(codes, dtype=np.intp).reshape(-1)]  # type: ignore[no-any-return]

    def wire(self, codes: np.ndarray) -> bytes:
        """:func:`encode_bytes_elements` of :meth:`elements`: each code's row of the table, cut to its length."""
        c = np.asarray(codes, dtype=np.intp).reshape(-1)
        if len(c) <= SMALL_CODES:  # a few elements: joined, without the numpy steps
            return b"".join([self._wire[i] for i in c.tolist()])
        return self._table[c][self._columns < self._lengths[c][:, None]].tobytes()


@dataclass
class RequestedOutput:
    name: str
    binary: bool


@dataclass
class InferRequest:
    """A decoded inference request. ``outputs`` is ``None`` when the client asked for every output;
    ``binary_output`` is the default encoding of the outputs (HTTP), ``used_binary`` whether the inputs
    came as binary data (HTTP's extension, gRPC's raw contents), which is how the answer is sent."""

    id: str | None
    parameters: dict[str, Any]
    inputs: list[Tensor]
    outputs: list[RequestedOutput] | None
    binary_output: bool
    used_binary: bool
    #: The model and version addressed (the HTTP path's, the gRPC message's); ``None``: any version.
    model_name: str = ""
    model_version: str | None = None

    def input(self, name: str) -> Tensor | None:
        for t in self.inputs:
            if t.name == name:
                return t
        return None


@dataclass
class InferResponse:
    """An inference answer: each output's :attr:`Tensor.binary` says how HTTP encodes it."""

    model_name: str
    model_version: str | None
    id: str | None
    parameters: dict[str, Any]
    outputs: list[Tensor]

    def output(self, name: str) -> Tensor | None:
        for t in self.outputs:
            if t.name == name:
                return t
        return None


def check_request_id(rid: object, what: str = "'id'") -> str | None:
    """A request id (``None`` when absent), refused unless a string of at most :data:`MAX_REQUEST_ID_BYTES`."""
    if rid is None:
        return None
    if not isinstance(rid, str):
        raise ProtocolError("malformed_json", f"{what} must be a string")
    size = len(rid.encode("utf-8", "surrogatepass"))
    if size > MAX_REQUEST_ID_BYTES:
        raise ProtocolError(
            "id_too_long", f"{what} has {size} bytes; the limit is {MAX_REQUEST_ID_BYTES} (UTF-8 bytes)"
        )
    return rid


def json_nodes(value: object) -> Iterator[object]:
    """Every node of a decoded JSON value: objects, their keys and values, arrays, their items, scalars.

    Walked with a stack rather than by recursion, so that a deeply nested body cannot exhaust Python's
    stack; a caller that stops early (a bound crossed) leaves the rest unwalked."""
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        yield item


def check_parameters(params: object, what: str = "'parameters'") -> dict[str, Any]:
    """Request or tensor ``parameters`` (``{}`` when absent), refused (413 ``parameters_too_large``) past
    :data:`MAX_PARAMETERS` entries or :data:`MAX_PARAMETER_BYTES` bytes of keys and strings, nested
    values included (walked with a bounded stack)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ProtocolError("malformed_json", f"{what} must be an object")
    if len(params) > MAX_PARAMETERS:
        raise ProtocolError(
            "parameters_too_large", f"{what} has {len(params)} entries; the limit is {MAX_PARAMETERS}", status=413
        )
    if not params:
        return params
    if not any(isinstance(v, dict | list) for v in params.values()):
        # flat (the common case): the walk below, without it; its bound on values cannot be crossed
        size = 0
        for k, v in params.items():
            size += len(k) if isinstance(k, str) else 8
            size += len(v) if isinstance(v, str) else 8
        if size > MAX_PARAMETER_BYTES:
            _too_large(what)
        return params
    size, items = 0, 0
    for item in json_nodes(params):
        items += 1
        if isinstance(item, str):
            size += len(item)
        elif not isinstance(item, dict | list):
            size += 8
        if size > MAX_PARAMETER_BYTES or items > 4 * MAX_PARAMETERS:
            _too_large(what)
    return params


def _too_large(what: str) -> NoReturn:
    raise ProtocolError(
        "parameters_too_large",
        f"{what} holds more than {MAX_PARAMETER_BYTES} bytes or {4 * MAX_PARAMETERS} values",
        status=413,
    )


def check_shape_list(name: str, raw: object) -> list[int]:
    """A declared shape: a list of at most :data:`MAX_RANK` non-negative integers."""
    if not isinstance(raw, list):
        raise _not_integers(name, raw)
    negative = False
    for d in raw:  # one pass (every request decodes one), the checks in the same order
        if not isinstance(d, int) or isinstance(d, bool):
            raise _not_integers(name, raw)
        negative = negative or d < 0
    if len(raw) > MAX_RANK:
        raise ProtocolError("shape", f"tensor {name[:100]!r}: shape has {len(raw)} dimensions, more than {MAX_RANK}")
    if negative:
        raise ProtocolError("shape", f"tensor {name[:100]!r}: shape {raw} has a negative dimension"[:300])
    return list(raw)


def _not_integers(name: str, raw: object) -> ProtocolError:
    return ProtocolError("shape", f"tensor {name[:100]!r}: shape must be a list of integers, got {raw!r}"[:300])


def decode_bytes_elements(name: str, buf: memoryview, count: int) -> np.ndarray:
    if count * 4 > len(buf):  # every element has a 4-byte length prefix: check before allocating
        raise ProtocolError(
            "binary_data", f"tensor {name!r}: {len(buf)} bytes cannot hold {count} BYTES elements"[:300]
        )
    out = np.empty(count, dtype=object)
    pos, end = 0, len(buf)
    for i in range(count):
        if pos + 4 > end:
            raise ProtocolError("binary_data", f"tensor {name!r}: BYTES data ends inside element {i}")
        size = int.from_bytes(buf[pos : pos + 4], "little")
        pos += 4
        if pos + size > end:
            raise ProtocolError("binary_data", f"tensor {name!r}: BYTES element {i} runs past the data")
        out[i] = bytes(buf[pos : pos + size])
        pos += size
    if pos != end:
        raise ProtocolError("binary_data", f"tensor {name!r}: {end - pos} extra bytes after {count} BYTES elements")
    return out


def encode_bytes_elements(values: np.ndarray) -> bytes:
    """Length-prefixed serialisation of a BYTES tensor (elements ``bytes`` or ``str``)."""
    parts: list[bytes] = []
    for v in values.reshape(-1).tolist():
        b = v if isinstance(v, bytes) else str(v).encode()
        parts.append(len(b).to_bytes(4, "little"))
        parts.append(b)
    return b"".join(parts)


def check_elements(name: str, shape: list[int], max_elements: int | None) -> None:
    """Too many elements is 413; a dimension past :data:`MAX_DIMENSION` (where a zero elsewhere keeps the
    count small, as in ``[0, 10**30]``) is a malformed shape, 400."""
    if max_elements is not None and math.prod(shape) > max_elements:
        raise ProtocolError(
            "too_large",
            f"tensor {name!r}: shape {shape} has more than {max_elements} elements (server.max_tensor_elements)"[:300],
            status=413,
        )
    if shape and max(shape) > MAX_DIMENSION:
        raise ProtocolError(
            "shape", f"tensor {name[:100]!r}: shape {shape} has a dimension larger than {MAX_DIMENSION}"[:300]
        )


def check_shape(name: str, raw: object, max_elements: int | None = DEFAULT_MAX_ELEMENTS) -> list[int]:
    """A tensor's declared shape, bounded in rank, dimension and element count: every decoder checks it
    before it sizes anything by it."""
    shape = check_shape_list(name, raw)
    check_elements(name, shape, max_elements)
    return shape


def tensor(name: str, data: np.ndarray, datatype: str | None = None) -> Tensor:
    """Wrap a numpy array as a tensor (datatype inferred unless given)."""
    dt = datatype or datatype_of(data)
    return Tensor(name, dt, list(data.shape), data)
