"""A real MLServer on free loopback ports, run from its own virtual environment (``make mlserver-venv``):
the upstream of proxy-mode tests. Its models are trained and saved by MLServer's own interpreter, in the
format its scikit-learn runtime loads."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port
from tests.support.requirements import require
from tests.support.waiting import http_ok, wait_until

START_SECONDS = 120.0


def train_in_mlserver(script: str, *args: str) -> None:
    """Run ``script`` with MLServer's interpreter (``sys.argv[1:]`` = ``args``): it trains and saves a model."""
    python: Path = require("mlserver")
    subprocess.run([str(python), "-c", script, *args], check=True, timeout=300)


@contextmanager
def running_mlserver(root: Path, settings: Mapping[str, Mapping[str, Any]]) -> Iterator[str]:
    """MLServer serving ``root/<name>/`` for each model name in ``settings`` (its ``model-settings.json``);
    yields ``host:port`` of its HTTP endpoint once every model answers ready."""
    python: Path = require("mlserver")
    for name, model_settings in settings.items():
        (root / name).mkdir(exist_ok=True)
        (root / name / "model-settings.json").write_text(json.dumps({"name": name, **model_settings}))
    port = free_port()
    server = {
        "host": "127.0.0.1",
        "http_port": port,
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "parallel_workers": 0,
    }
    (root / "settings.json").write_text(json.dumps(server))
    log_path = root / "mlserver.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLSERVER_", "PYTHON"))}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(python.parent / "mlserver"), "start", str(root)],
            cwd=root,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        url = f"http://127.0.0.1:{port}"
        try:

            def ready() -> bool:
                if proc.poll() is not None:
                    pytest.fail(f"MLServer exited ({proc.returncode}): {log_path.read_text()[-2000:]}")
                return all(http_ok(f"{url}/v2/models/{name}/ready", timeout=2) for name in settings)

            if not wait_until(ready, START_SECONDS, 0.5):
                pytest.fail(f"MLServer not ready in {START_SECONDS:g} s: {log_path.read_text()[-2000:]}")
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
