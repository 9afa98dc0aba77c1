"""The request bodies of ``/openapi.json``.

The routes read their bodies raw (the V2 codec, the label parser and the observe decoder check them
with their own bounds and messages), so FastAPI cannot infer their schemas. They are declared here
and attached by path (:func:`declare_request_bodies`) so that the document tells a client what to
send, and API fuzzers (schemathesis) generate structured bodies that reach the decoders' depths.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.routing import BaseRoute

from agent.protocol import v2

_PARAMETERS: dict[str, Any] = {"type": "object", "additionalProperties": True}

#: A V2 tensor: JSON ``data`` (flat or nested), or ``parameters.binary_data_size`` with the binary extension.
TENSOR: dict[str, Any] = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {
            "type": "array",
            "maxItems": v2.MAX_RANK,
            "items": {"type": "integer", "minimum": 0, "maximum": v2.MAX_DIMENSION},
        },
        "datatype": {"type": "string", "enum": sorted(v2.DATATYPES)},
        "parameters": _PARAMETERS,
        "data": {"type": "array"},
    },
}

#: The Open Inference Protocol V2 inference request (``$request_input`` / ``$request_output``).
INFER_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "inputs": {"type": "array", "items": TENSOR},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "parameters": _PARAMETERS},
            },
        },
    },
}

#: Observe mode's plain JSON body (CloudEvents carry V2 requests and responses instead).
OBSERVE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "inputs": {"oneOf": [{"type": "array", "items": TENSOR}, {"type": "array", "items": {"type": "array"}}]},
        "probabilities": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "outputs": {"type": "array", "items": TENSOR},
        "metadata": _PARAMETERS,
    },
}

LABELS: dict[str, Any] = {
    "type": "object",
    "required": ["labels"],
    "properties": {
        "labels": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "label"],
                "properties": {
                    "id": {"type": "string", "description": "a prediction id, <request id>:<i>"},
                    "label": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]},
                },
            },
        }
    },
}

RELOAD: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"model_path": {"type": "string"}, "bundle_path": {"type": "string"}, "version": {"type": "string"}},
}


def _json_body(schema: dict[str, Any], *, required: bool = True) -> dict[str, Any]:
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


#: Path (as routed) → the ``openapi_extra`` of its POST operation.
BODIES: dict[str, dict[str, Any]] = {
    "/v2/models/{name}/infer": _json_body(INFER_REQUEST),
    "/v2/models/{name}/versions/{version}/infer": _json_body(INFER_REQUEST),
    "/v1/observe": _json_body(OBSERVE),
    "/v1/labels": _json_body(LABELS),
    "/v1/reload": _json_body(RELOAD, required=False),
}


def declare_request_bodies(routes: Iterable[BaseRoute]) -> int:
    """Attach :data:`BODIES` to the POST routes of ``routes``; returns how many were declared."""
    n = 0
    for route in routes:
        path = getattr(route, "path", None)
        methods = getattr(route, "methods", None) or set()
        if path in BODIES and "POST" in methods and hasattr(route, "openapi_extra"):
            route.openapi_extra = {**(route.openapi_extra or {}), **BODIES[path]}
            n += 1
    return n
