"""Per-sample metadata cannot multiply a request's size: its bounds hold under a memory limit.

A fixed-width bytes array of N values costs N × the longest value; one 2 MiB string among 1,024
empty ones (a 2 MiB body) asked for 2 GiB. The check runs in a subprocess whose address space is
limited to what it has plus 1 GiB, so a regression fails this test instead of the test runner.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent.model.classifier import default_model_path

SCRIPT = r"""
import json, resource, sys

from agent.config.settings import load_settings
from agent.errors import ClientError
from agent.dataplane.admission import attach_metadata, split_inputs
from agent.judging.runtime import load_runtime
from agent.protocol import v2

settings = load_settings(
    None, mode="serve", model={"name": "mnist", "path": sys.argv[1]}, bundle={"path": sys.argv[2]}
)
rt = load_runtime(settings)
assert "form" in rt.metadata_fields, rt.metadata_fields
form = ["x" * (2 << 20)] + [""] * 1023
body = json.dumps({"inputs": [
    {"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 784},
    {"name": "form", "shape": [1024], "datatype": "BYTES", "data": form},
]}).encode()
req = v2.decode_request(body, None, max_elements=rt.max_elements)
with open("/proc/self/status") as f:
    vm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
soft = vm_kib * 1024 + (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (soft, resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    split = split_inputs(rt, req.inputs, req.parameters)
    attach_metadata(split, 1)
    print(json.dumps({"accepted": True}))
except ClientError as exc:
    print(json.dumps({"status": exc.status, "reason": exc.reason, "error": str(exc)}))
except MemoryError:
    print(json.dumps({"memory_error": True}))
"""


def test_one_long_metadata_value_among_many_is_refused_before_allocating(mnist_bundle_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(default_model_path()), str(mnist_bundle_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result.get("status") == 413, result
    assert result["reason"] == "metadata_too_large"
    assert "server.max_metadata_value_bytes" in result["error"]
