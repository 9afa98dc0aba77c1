"""The agent's V2 gRPC messages load beside ``tritonclient.grpc``'s (same names, another pool) and
read each other's bytes: a user's process (or one pytest run) may import both, in either order."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import {first}, {second}
from tritonclient.grpc import service_pb2 as theirs
from agent.protocol.grpc_stubs import open_inference_grpc_pb2 as ours
req = ours.ModelInferRequest(model_name="m", id="r1")
req.inputs.add(name="x", datatype="FP32", shape=[1, 2])
req.raw_input_contents.append(b"\\0" * 8)
back = theirs.ModelInferRequest.FromString(req.SerializeToString())
assert (back.model_name, back.id, back.inputs[0].name, list(back.inputs[0].shape)) == ("m", "r1", "x", [1, 2])
answer = theirs.ModelInferResponse(model_name="m", id="r1")
answer.outputs.add(name="label", datatype="INT64", shape=[1])
assert ours.ModelInferResponse.FromString(answer.SerializeToString()).outputs[0].name == "label"
"""


@pytest.mark.parametrize(
    ("first", "second"),
    [("tritonclient.grpc", "agent.protocol.v2_grpc"), ("agent.protocol.v2_grpc", "tritonclient.grpc")],
)
def test_agent_stubs_load_beside_tritonclient(first: str, second: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(first=first, second=second)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
