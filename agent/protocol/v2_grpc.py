"""The V2 protocol's gRPC messages (``inference.ModelInferRequest`` / ``ModelInferResponse``) to and
from the agent's :class:`~agent.protocol.inference.InferRequest` and ``InferResponse``.

A request message is decoded straight into named tensors (raw contents without a copy, typed contents
element by element into their numpy dtype, never through Python lists, their count checked against
the declared shape first) and the answer is encoded straight into a message: nothing passes through
an HTTP body. The checks are those of the HTTP codec (:mod:`agent.protocol.inference` holds them),
plus what only a message can get wrong (raw contents that do not match the inputs, typed contents of
the wrong length or field), with messages naming the tensor.

A request that sent raw contents is answered with ``raw_output_contents`` (what Triton answers and
``tritonclient`` reads); one that sent typed contents gets typed contents, unless an output is FP16
(which the protocol carries only raw).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from agent.protocol.grpc_stubs import open_inference_grpc_pb2 as pb
from agent.protocol.inference import (
    DATATYPES,
    InferRequest,
    InferResponse,
    ProtocolError,
    RequestedOutput,
    Tensor,
    check_parameters,
    check_request_id,
    check_shape,
    decode_bytes_elements,
)

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


def _typed_values(name: str, datatype: str, shape: list[int], contents: pb.InferTensorContents) -> np.ndarray:
    """Typed contents as an array of the datatype, their count checked against the shape first."""
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise ProtocolError(
            "datatype", f"tensor {name!r}: {datatype} has no typed contents; send it in raw_input_contents"
        )
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise ProtocolError(
            "shape_mismatch",
            f"tensor {name!r}: its shape needs {count} {datatype} values, contents.{field} holds {len(values)}",
        )
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out.reshape(shape)
    try:
        return np.fromiter(values, dtype=DATATYPES[datatype], count=count).reshape(shape)
    except (OverflowError, ValueError) as exc:
        raise ProtocolError(
            "data", f"tensor {name!r}: contents.{field} holds a value outside {datatype}: {exc}"
        ) from None


def _raw_values(name: str, datatype: str, shape: list[int], data: bytes, i: int) -> np.ndarray:
    """Raw contents as an array of the datatype (no copy for numbers), their size checked first."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return decode_bytes_elements(name, memoryview(data), count).reshape(shape)
    size = count * DATATYPES[datatype].itemsize
    if len(data) != size:
        raise ProtocolError(
            "shape_mismatch",
            f"tensor {name!r}: shape {shape} of {datatype} needs {size} bytes, "
            f"raw_input_contents[{i}] holds {len(data)}",
        )
    return np.frombuffer(data, dtype=DATATYPES[datatype]).reshape(shape)


def decode_infer_request(msg: pb.ModelInferRequest, max_elements: int | None) -> InferRequest:
    """The :class:`InferRequest` of a request message, checked as the HTTP codec checks a body: the id,
    the parameters, every tensor's declared shape (before its contents are read), duplicate names, and
    what only a message can get wrong (raw contents that do not match the inputs, typed contents of the
    wrong length or field). A request with raw contents is answered with raw contents."""
    raw = msg.raw_input_contents
    if raw and len(raw) != len(msg.inputs):
        raise ProtocolError("raw_contents", f"raw_input_contents holds {len(raw)} entries for {len(msg.inputs)} inputs")
    rid = check_request_id(msg.id or None)
    params = check_parameters(parameters_of(msg.parameters))
    inputs: list[Tensor] = []
    seen: set[str] = set()
    for i, t in enumerate(msg.inputs):
        name = t.name
        if not name:
            raise ProtocolError("malformed_message", f"inputs[{i}] has no name")
        if name in seen:
            raise ProtocolError("duplicate_tensor", f"tensor {name!r} appears twice in 'inputs'")
        seen.add(name)
        if t.datatype not in DATATYPES:
            raise ProtocolError("datatype", f"tensor {name!r}: datatype {t.datatype!r} is not supported")
        shape = check_shape(name, list(t.shape), max_elements)
        tensor_params = parameters_of(t.parameters)
        if tensor_params:  # none: nothing to check (nor a message to build)
            tensor_params = check_parameters(tensor_params, f"tensor {name[:100]!r}: 'parameters'")
        if raw:
            if t.HasField("contents"):
                raise ProtocolError(
                    "raw_contents", f"tensor {name!r} has typed contents although the request uses raw_input_contents"
                )
            data = _raw_values(name, t.datatype, shape, raw[i], i)
        else:
            data = _typed_values(name, t.datatype, shape, t.contents)
        inputs.append(Tensor(name, t.datatype, shape, data, tensor_params, binary=bool(raw)))
    if not inputs:
        raise ProtocolError("malformed_message", "request has no inputs")
    outputs: list[RequestedOutput] | None = None
    if msg.outputs:
        outputs = []
        requested: set[str] = set()
        for o in msg.outputs:
            out_name = o.name
            if out_name in requested:
                raise ProtocolError("duplicate_tensor", f"output {out_name[:100]!r} is requested twice")
            requested.add(out_name)
            outputs.append(RequestedOutput(out_name, True))
    return InferRequest(rid, params, inputs, outputs, True, bool(raw), msg.model_name, msg.model_version or None)


def encode_infer_response(resp: InferResponse, raw: bool) -> pb.ModelInferResponse:
    """The ``ModelInferResponse`` of an answer: raw contents when ``raw`` (or when an output is FP16,
    which only travels raw), else typed contents."""
    msg = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version or "", id=resp.id or "")
    _set_parameters(msg.parameters, {k: v for k, v in resp.parameters.items() if isinstance(v, str | int | float)})
    raw = raw or any(t.datatype not in CONTENTS_FIELD for t in resp.outputs)
    for t in resp.outputs:
        out = msg.outputs.add(name=t.name, datatype=t.datatype, shape=list(t.data.shape))
        _set_parameters(out.parameters, {k: v for k, v in t.parameters.items() if k != "binary_data_size"})
        if t.datatype == "BYTES":
            if raw:
                msg.raw_output_contents.append(t.bytes_wire())
            else:
                out.contents.bytes_contents.extend(t.bytes_elements())
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
