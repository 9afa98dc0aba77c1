"""The V2 protocol's gRPC messages (``inference.ModelInferRequest`` / ``ModelInferResponse``) to and
from the binary-tensor form of its HTTP bodies.

The agent answers gRPC inference with the same path as HTTP (:meth:`AgentService.answer_infer`): a
request message becomes the JSON header plus raw tensor bytes that an HTTP client would have sent,
and the answer comes back as a message. Every check, limit, verdict and metric is thus the HTTP one;
what this module checks itself is what only the message can get wrong (raw contents that do not
match the inputs, typed contents of the wrong length or field), with messages naming the tensor.

Raw contents are copied once into the body; typed contents are converted element by element into
their numpy dtype (never through Python lists), their count checked against the declared shape first.
A request that sent raw contents is answered with ``raw_output_contents`` (what Triton answers and
``tritonclient`` reads); one that sent typed contents gets typed contents, unless an output is FP16
(which the protocol carries only raw).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from agent.protocol import v2
from agent.protocol.grpc_stubs import open_inference_grpc_pb2 as pb
from agent.protocol.v2 import DATATYPES, ProtocolError

#: The typed-contents field of each datatype (FP16 travels only as raw contents).
CONTENTS_FIELD: Mapping[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))


def parse_infer_request(data: bytes) -> pb.ModelInferRequest:
    """Parse a serialised ``ModelInferRequest`` (raises :class:`ProtocolError` on a malformed one)."""
    try:
        return pb.ModelInferRequest.FromString(data)
    except (DecodeError, RuntimeError) as exc:
        raise ProtocolError("malformed_message", f"ModelInferRequest is not a valid protobuf message: {exc}") from None


def parameters_of(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A protobuf parameter map as the JSON values of the HTTP protocol (unset values are dropped)."""
    out: dict[str, Any] = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        if which is not None:
            out[key] = getattr(p, which)
    return out


def _set_parameters(target: Any, params: Mapping[str, Any]) -> None:
    for key, value in params.items():
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            if value >= 1 << 63:  # past int64: only uint64 holds it
                p.uint64_param = value
            else:
                p.int64_param = value
        elif isinstance(value, float):
            p.double_param = value
        else:
            p.string_param = str(value)


def _typed_bytes(name: str, datatype: str, count: int, contents: pb.InferTensorContents) -> bytes:
    """The raw little-endian bytes of typed contents, their count checked against the shape first."""
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise ProtocolError(
            "datatype", f"tensor {name!r}: {datatype} has no typed contents; send it in raw_input_contents"
        )
    values = getattr(contents, field)
    if len(values) != count:
        raise ProtocolError(
            "shape_mismatch",
            f"tensor {name!r}: its shape needs {count} {datatype} values, contents.{field} holds {len(values)}",
        )
    if datatype == "BYTES":
        return b"".join(len(b).to_bytes(4, "little") + b for b in values)
    try:
        return np.fromiter(values, dtype=DATATYPES[datatype], count=count).tobytes()
    except (OverflowError, ValueError) as exc:
        raise ProtocolError(
            "data", f"tensor {name!r}: contents.{field} holds a value outside {datatype}: {exc}"
        ) from None


def request_body(msg: pb.ModelInferRequest, max_elements: int | None) -> tuple[bytes, str]:
    """The binary-tensor V2 body of a request message and its ``Inference-Header-Content-Length``.

    Every output is asked for in binary form (:func:`response_message` reads it back without JSON
    numbers). ``max_elements`` bounds each tensor's declared shape before its contents are read."""
    raw = msg.raw_input_contents
    if raw and len(raw) != len(msg.inputs):
        raise ProtocolError("raw_contents", f"raw_input_contents holds {len(raw)} entries for {len(msg.inputs)} inputs")
    inputs: list[dict[str, Any]] = []
    payloads: list[bytes] = []
    for i, t in enumerate(msg.inputs):
        name = t.name
        if not name:
            raise ProtocolError("malformed_message", f"inputs[{i}] has no name")
        if t.datatype not in DATATYPES:
            raise ProtocolError("datatype", f"tensor {name!r}: datatype {t.datatype!r} is not supported")
        shape = v2.check_shape(name, list(t.shape), max_elements)
        count = math.prod(shape)
        if raw:
            if t.HasField("contents"):
                raise ProtocolError(
                    "raw_contents", f"tensor {name!r} has typed contents although the request uses raw_input_contents"
                )
            data = raw[i]
            size = count * DATATYPES[t.datatype].itemsize
            if t.datatype != "BYTES" and len(data) != size:
                raise ProtocolError(
                    "shape_mismatch",
                    f"tensor {name!r}: shape {shape} of {t.datatype} needs {size} bytes, "
                    f"raw_input_contents[{i}] holds {len(data)}",
                )
        else:
            data = _typed_bytes(name, t.datatype, count, t.contents)
        params = parameters_of(t.parameters)
        params["binary_data_size"] = len(data)
        inputs.append({"name": name, "datatype": t.datatype, "shape": shape, "parameters": params})
        payloads.append(data)
    head: dict[str, Any] = {"inputs": inputs}
    if msg.id:
        head["id"] = msg.id
    params = parameters_of(msg.parameters)
    params["binary_data_output"] = True
    head["parameters"] = params
    if msg.outputs:
        head["outputs"] = [
            {"name": o.name, "parameters": {**parameters_of(o.parameters), "binary_data": True}} for o in msg.outputs
        ]
    text = _COMPACT_JSON.encode(head).encode()
    return b"".join([text, *payloads]), str(len(text))


def response_message(body: bytes, headers: Mapping[str, str], raw: bool) -> pb.ModelInferResponse:
    """The ``ModelInferResponse`` of a V2 answer body: raw contents when ``raw`` (or when an output is
    FP16, which only travels raw), else typed contents."""
    resp = v2.decode_response(body, headers.get(v2.HEADER_LENGTH.lower()))
    msg = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version or "", id=resp.id or "")
    _set_parameters(msg.parameters, {k: v for k, v in resp.parameters.items() if isinstance(v, str | int | float)})
    raw = raw or any(t.datatype not in CONTENTS_FIELD for t in resp.outputs)
    for t in resp.outputs:
        out = msg.outputs.add(name=t.name, datatype=t.datatype, shape=list(t.data.shape))
        _set_parameters(out.parameters, {k: v for k, v in t.parameters.items() if k != "binary_data_size"})
        if t.datatype == "BYTES":
            if raw:
                msg.raw_output_contents.append(v2.encode_bytes_elements(t.data))
            else:
                out.contents.bytes_contents.extend(
                    v if isinstance(v, bytes) else str(v).encode() for v in t.data.reshape(-1).tolist()
                )
        elif raw:
            msg.raw_output_contents.append(np.ascontiguousarray(t.data, dtype=DATATYPES[t.datatype]).tobytes())
        else:
            getattr(out.contents, CONTENTS_FIELD[t.datatype]).extend(t.data.reshape(-1).tolist())
    return msg


def metadata_message(meta: Mapping[str, Any]) -> pb.ModelMetadataResponse:
    """A ``ModelMetadataResponse`` of the V2 model metadata object (as the HTTP route answers it)."""
    msg = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
    for key in ("inputs", "outputs"):
        for t in meta[key]:
            getattr(msg, key).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
    return msg
