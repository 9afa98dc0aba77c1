"""What the agent says about itself and its model, the same over HTTP and gRPC: V2 server metadata
and the model metadata of serve mode (proxy mode adds the upstream's, :mod:`agent.dataplane.proxy`)."""

from __future__ import annotations

from typing import Any

from agent import __version__
from agent.dataplane.admission import OUTPUT_LABEL, OUTPUT_PROBABILITIES, OUTPUT_VERDICT
from agent.judging.runtime import Runtime
from agent.model.inputs import InputSpec

#: The server's name and protocol extensions in V2 server metadata (HTTP and gRPC).
SERVER_NAME = "icos-agent"
SERVER_EXTENSIONS = ("binary_tensor_data", "icos_verdict")


def server_metadata() -> dict[str, Any]:
    """The V2 server metadata object."""
    return {"name": SERVER_NAME, "version": __version__, "extensions": list(SERVER_EXTENSIONS)}


def _shape_and_type(spec: InputSpec) -> dict[str, Any]:
    return {"datatype": spec.datatype, "shape": [-1, *(-1 if d is None else d for d in spec.shape)]}


def model_metadata_of(rt: Runtime) -> dict[str, Any]:
    """The V2 model metadata object of the agent's own model description."""
    k = len(rt.classes)
    inputs = [
        {"name": spec.name if (rt.input_name or len(rt.signature.inputs) > 1) else "input", **_shape_and_type(spec)}
        for spec in rt.signature.inputs
    ]
    for f in sorted(rt.metadata_fields):
        inputs.append({"name": f, "datatype": "BYTES", "shape": [-1]})
    return {
        "name": rt.name,
        "versions": [rt.version],
        "platform": "onnxruntime_onnx" if rt.classifier is not None else f"icos_{rt.mode}",
        "inputs": inputs,
        "outputs": [
            {"name": OUTPUT_PROBABILITIES, "datatype": "FP32", "shape": [-1, k]},
            {"name": OUTPUT_LABEL, "datatype": "INT64", "shape": [-1]},
            {"name": OUTPUT_VERDICT, "datatype": "BYTES", "shape": [-1]},
        ],
        "parameters": {
            "icos_mode": rt.mode,
            "icos_model_sha256": rt.model_sha256,
            "icos_metadata_fields": ",".join(sorted(rt.metadata_fields)),
            "icos_classes": ",".join(rt.classes),
        },
    }
