"""Codec of the Open Inference Protocol V2 (KServe / Triton): JSON tensors and the binary tensor extension.

Requests and responses are JSON objects; with the binary tensor extension the body is the JSON
header (its length in the ``Inference-Header-Content-Length`` HTTP header) followed by the raw
little-endian tensor bytes, in the order of the tensors whose ``parameters`` carry
``binary_data_size``. ``BYTES`` elements are each prefixed by a 4-byte little-endian length.

Every problem with a body raises :class:`ProtocolError` with a bounded ``reason`` (for metrics) and a
message naming the offending tensor or field.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agent.protocol.inference import (
    DATATYPES,
    DEFAULT_MAX_ELEMENTS,
    MAX_DIMENSION,
    MAX_RANK,
    MAX_REQUEST_ID_BYTES,
    InferRequest,
    InferResponse,
    ProtocolError,
    RequestedOutput,
    Tensor,
    check_elements,
    check_parameters,
    check_request_id,
    check_shape_list,
    datatype_of,
    decode_bytes_elements,
    encode_bytes_elements,
    json_nodes,
    tensor,
)

#: The request, answer and tensor types and bounds are :mod:`agent.protocol.inference`'s; they are
#: importable from here too, beside the HTTP codec that reads and writes them.
__all__ = [
    "BINARY_CONTENT_TYPE",
    "DATATYPES",
    "DEFAULT_MAX_ELEMENTS",
    "HEADER_LENGTH",
    "JSON_CONTENT_TYPE",
    "MAX_DIMENSION",
    "MAX_RANK",
    "MAX_REQUEST_ID_BYTES",
    "InferRequest",
    "InferResponse",
    "ProtocolError",
    "RequestedOutput",
    "Tensor",
    "check_parameters",
    "check_request_id",
    "datatype_of",
    "decode_request",
    "decode_response",
    "decode_tensors",
    "encode_answer",
    "encode_body",
    "encode_bytes_elements",
    "encode_request",
    "encode_response",
    "error_body",
    "split_body",
    "tensor",
]

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_CONTENT_TYPE = "application/octet-stream"
JSON_CONTENT_TYPE = "application/json"

#: ``json.dumps(obj, separators=(",", ":"))`` without building an encoder per call (request path).
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))

#: A ``\uD800``–``\uDFFF`` escape in JSON text: only then can the parsed body hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")

# -- decoding ----------------------------------------------------------------------------------------


def split_body(body: bytes | bytearray, header_length: str | None) -> tuple[dict[str, Any], memoryview]:
    """Separate the JSON header from the binary payload and parse the JSON."""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise ProtocolError(
                "binary_header", f"{HEADER_LENGTH} must be an integer, got {header_length[:40]!r}"
            ) from None
        if n < 0 or n > len(body):
            raise ProtocolError("binary_header", f"{HEADER_LENGTH} is {n} but the body holds only {len(body)} bytes")
        head, payload = body[:n], memoryview(body)[n:]
    else:
        head, payload = body, memoryview(b"")
    if not head:
        raise ProtocolError("malformed_json", "request body is empty; expected a JSON object")
    try:
        obj = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError("malformed_json", f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("malformed_json", "body is not valid JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise ProtocolError("malformed_json", "body must be a JSON object")
    if _SURROGATE_ESCAPE.search(head) is not None:
        _refuse_lone_surrogates(obj)
    return obj, payload


def _refuse_lone_surrogates(obj: object) -> None:
    """JSON may escape a lone UTF-16 surrogate (``"\\ud800"``), which no UTF-8 encoder accepts: such a
    string would fail later, in the prediction store, a log line or a metric label, far from the
    request that brought it. Refuse the body here instead (only bodies with such an escape are walked)."""
    for item in json_nodes(obj):
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ProtocolError(
                    "malformed_json", "body holds a string that is not valid Unicode (a lone surrogate such as \\ud800)"
                ) from None


def _flatten_strings(name: str, data: object) -> list[bytes]:
    out: list[bytes] = []
    stack: list[object] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, str):
            out.append(item.encode())
        else:
            raise ProtocolError("data", f"tensor {name!r}: BYTES data must hold strings, found {type(item).__name__}")
    return out


def _json_data(name: str, datatype: str, shape: list[int], data: object) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        values = _flatten_strings(name, data if isinstance(data, list) else [data])
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
    else:
        if not isinstance(data, list):
            data = [data]
        try:
            # a value beyond the float range becomes ±inf here (and is refused as non-finite by the
            # model's input check) instead of warning
            with np.errstate(over="ignore"):
                arr = np.asarray(data, dtype=DATATYPES[datatype]).reshape(-1)
        except (ValueError, TypeError, OverflowError) as exc:
            msg = str(exc).splitlines()[0][:200]
            raise ProtocolError("data", f"tensor {name!r}: data is not a {datatype} array ({msg})") from None
    if arr.size != count:
        raise ProtocolError(
            "shape_mismatch", f"tensor {name!r}: shape {shape} needs {count} elements but data holds {arr.size}"
        )
    return arr.reshape(shape)


def decode_tensors(
    items: object, payload: memoryview, what: str, *, max_elements: int | None = DEFAULT_MAX_ELEMENTS
) -> tuple[list[Tensor], int]:
    """Decode a list of V2 tensors (``inputs`` or ``outputs``); returns them and the payload bytes used.

    A tensor whose shape holds more than ``max_elements`` elements is refused (413) before any
    allocation.
    """
    if not isinstance(items, list):
        raise ProtocolError("malformed_json", f"'{what}' must be a list of tensors")
    tensors: list[Tensor] = []
    offset = 0
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ProtocolError("malformed_json", f"{what}[{i}] must be an object")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ProtocolError("malformed_json", f"{what}[{i}] has no 'name'")
        if name in seen:
            raise ProtocolError("duplicate_tensor", f"tensor {name!r} appears twice in '{what}'")
        seen.add(name)
        datatype = item.get("datatype")
        if not isinstance(datatype, str):
            raise ProtocolError("malformed_json", f"tensor {name!r} has no 'datatype'")
        if datatype not in DATATYPES:
            raise ProtocolError("datatype", f"tensor {name!r}: datatype {datatype!r} is not supported")
        shape = check_shape_list(name, item.get("shape"))
        check_elements(name, shape, max_elements)
        params = check_parameters(item.get("parameters"), f"tensor {name[:100]!r}: 'parameters'")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ProtocolError("binary_header", f"tensor {name!r}: binary_data_size must be a non-negative int")
            if "data" in item:
                raise ProtocolError("binary_header", f"tensor {name!r} has both 'data' and binary_data_size")
            if offset + size > len(payload):
                raise ProtocolError(
                    "binary_data",
                    f"tensor {name!r}: binary_data_size {size} runs past the end of the body "
                    f"({len(payload) - offset} bytes left)",
                )
            buf = payload[offset : offset + size]
            offset += size
            count = math.prod(shape)
            if datatype == "BYTES":
                arr = decode_bytes_elements(name, buf, count).reshape(shape)
            else:
                dt = DATATYPES[datatype]
                if size != count * dt.itemsize:
                    raise ProtocolError(
                        "shape_mismatch",
                        f"tensor {name!r}: shape {shape} of {datatype} needs {count * dt.itemsize} bytes, "
                        f"binary_data_size is {size}",
                    )
                arr = np.frombuffer(buf, dtype=dt).reshape(shape)
            tensors.append(Tensor(name, datatype, shape, arr, params, binary=True))
        else:
            if "data" not in item:
                raise ProtocolError("malformed_json", f"tensor {name!r} has neither 'data' nor binary_data_size")
            tensors.append(Tensor(name, datatype, shape, _json_data(name, datatype, shape, item["data"]), params))
    return tensors, offset


def decode_request(
    body: bytes | bytearray,
    header_length: str | None = None,
    *,
    max_elements: int | None = DEFAULT_MAX_ELEMENTS,
    model_name: str = "",
    model_version: str | None = None,
) -> InferRequest:
    """Decode an inference request (JSON, or binary extension when ``header_length`` is given) to the
    model and version of its path.

    ``max_elements`` bounds the element count of every tensor (413 ``too_large`` beyond it).
    """
    obj, payload = split_body(body, header_length)
    rid = check_request_id(obj.get("id"))
    params = check_parameters(obj.get("parameters"))
    if "inputs" not in obj:
        raise ProtocolError("malformed_json", "request has no 'inputs'")
    inputs, used = decode_tensors(obj["inputs"], payload, "inputs", max_elements=max_elements)
    if not inputs:
        raise ProtocolError("malformed_json", "'inputs' is empty")
    if used != len(payload):
        raise ProtocolError(
            "binary_data", f"{len(payload) - used} bytes after the last binary tensor are not described by any input"
        )
    binary_default = bool(params.get("binary_data_output", False))
    outputs: list[RequestedOutput] | None = None
    if obj.get("outputs") is not None:
        raw = obj["outputs"]
        if not isinstance(raw, list):
            raise ProtocolError("malformed_json", "'outputs' must be a list")
        outputs = []
        requested: set[str] = set()
        for i, o in enumerate(raw):
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise ProtocolError("malformed_json", f"outputs[{i}] must be an object with a 'name'")
            if o["name"] in requested:
                # each output is answered once: a repeated name would multiply the response's size
                raise ProtocolError("duplicate_tensor", f"output {o['name'][:100]!r} is requested twice")
            requested.add(o["name"])
            op = o.get("parameters") or {}
            if not isinstance(op, dict):
                raise ProtocolError("malformed_json", f"outputs[{i}]: 'parameters' must be an object")
            outputs.append(RequestedOutput(o["name"], bool(op.get("binary_data", binary_default))))
    return InferRequest(
        rid, params, inputs, outputs, binary_default, header_length is not None, model_name, model_version
    )


def decode_response(body: bytes, header_length: str | None = None) -> InferResponse:
    """Decode an inference response (used by proxy mode and for CloudEvents)."""
    obj, payload = split_body(body, header_length)
    if "outputs" not in obj:
        raise ProtocolError("malformed_json", "response has no 'outputs'")
    outputs, _ = decode_tensors(obj["outputs"], payload, "outputs")
    params = obj.get("parameters") or {}
    return InferResponse(
        model_name=str(obj.get("model_name", "")),
        model_version=obj.get("model_version"),
        id=check_request_id(obj.get("id"), "the response's 'id'"),
        parameters=params if isinstance(params, dict) else {},
        outputs=outputs,
    )


# -- encoding ----------------------------------------------------------------------------------------


def _tensor_json(t: Tensor, binary: bool, chunks: list[bytes]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.data.shape)}
    params = {k: v for k, v in t.parameters.items() if k not in ("binary_data_size", "binary_data")}
    if binary:
        if t.datatype == "BYTES":
            raw = t.bytes_wire()
        else:
            raw = np.ascontiguousarray(t.data, dtype=DATATYPES[t.datatype]).tobytes()
        params["binary_data_size"] = len(raw)
        chunks.append(raw)
    else:
        flat = t.data.reshape(-1)
        if t.datatype == "BYTES":
            entry["data"] = t.bytes_texts()
        else:
            entry["data"] = flat.tolist()
    if params:
        entry["parameters"] = params
    return entry


def encode_body(
    head: dict[str, Any], tensors_key: str, tensors: Sequence[tuple[Tensor, bool]]
) -> tuple[bytes, dict[str, str]]:
    """Serialise ``head`` with ``tensors`` under ``tensors_key``; binary ones go after the JSON header."""
    chunks: list[bytes] = []
    head = dict(head)
    head[tensors_key] = [_tensor_json(t, binary, chunks) for t, binary in tensors]
    text = _COMPACT_JSON.encode(head).encode()
    if not chunks:
        return text, {"content-type": JSON_CONTENT_TYPE}
    return b"".join([text, *chunks]), {
        "content-type": BINARY_CONTENT_TYPE,
        HEADER_LENGTH.lower(): str(len(text)),
    }


def encode_response(
    model_name: str,
    model_version: str | None,
    request_id: str | None,
    outputs: Sequence[tuple[Tensor, bool]],
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """An inference response; each output is ``(tensor, binary)``. Returns body and HTTP headers."""
    head: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        head["model_version"] = model_version
    if request_id is not None:
        head["id"] = request_id
    if parameters:
        head["parameters"] = dict(parameters)
    return encode_body(head, "outputs", outputs)


def encode_answer(resp: InferResponse) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers of an answer, each output binary or JSON as its ``binary`` says."""
    return encode_response(
        resp.model_name, resp.model_version, resp.id, [(t, t.binary) for t in resp.outputs], resp.parameters
    )


def encode_request(
    inputs: Sequence[Tensor],
    *,
    binary: bool,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    outputs: Sequence[RequestedOutput] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """An inference request (proxy mode forwards requests re-encoded with this)."""
    head: dict[str, Any] = {}
    if request_id is not None:
        head["id"] = request_id
    if parameters:
        head["parameters"] = dict(parameters)
    if outputs is not None:
        head["outputs"] = [{"name": o.name, "parameters": {"binary_data": o.binary}} for o in outputs]
    return encode_body(head, "inputs", [(t, binary) for t in inputs])


def error_body(message: str) -> bytes:
    """The V2 error object ``{"error": "..."}``."""
    return json.dumps({"error": message}).encode()
