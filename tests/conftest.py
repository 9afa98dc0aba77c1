"""Fixtures shared by the whole suite: the shipped MNIST CNN, its data split, a fitted bundle, and
helpers to run real agent servers on free loopback ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.data.datasets import Splits
from agent.data.datasets import mnist_splits as _mnist_splits
from agent.model.classifier import OnnxClassifier, default_model_path

#: IDI rules written into the shared bundle: a ``form`` metadata field (the ICOS paper's example).
MNIST_IDI_YAML = """\
rules:
  - name: lines-only
    when: {field: form, equals: lines}
    allowed_labels: [1, 4, 7]
"""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def mnist_model() -> OnnxClassifier:
    """The shipped MNIST CNN (input float32 [N, 1, 28, 28], pixels 0..255, 10 classes)."""
    return OnnxClassifier.load(default_model_path(), name="mnist")


@pytest.fixture(scope="session")
def mnist_splits() -> Splits:
    """MNIST-5k split into train 2,500 / validation 1,500 / test 1,000."""
    return _mnist_splits()


@pytest.fixture(scope="session")
def mnist_bundle_dir(
    tmp_path_factory: pytest.TempPathFactory, mnist_model: OnnxClassifier, mnist_splits: Splits
) -> Path:
    """A bundle fitted once per session for the shipped CNN (ADI with 30 trees; IDI on ``form``)."""
    from agent.data.files import Dataset
    from agent.offline.fit import fit_bundle
    from invariants.fit_params import FitParams

    root = tmp_path_factory.mktemp("mnist-bundle")
    idi = root / "idi.yaml"
    idi.write_text(MNIST_IDI_YAML)
    report = fit_bundle(
        mnist_model,
        Dataset(mnist_splits.train.x, mnist_splits.train.y),
        Dataset(mnist_splits.val.x, mnist_splits.val.y),
        idi_path=idi,
        params=FitParams(n_estimators=30),
    )
    out = root / "bundle"
    report.bundle.save(out)
    return out


@dataclass
class RunningServer:
    """A uvicorn server running an ASGI app in a thread on a real socket."""

    app: Any
    host: str
    port: int
    server: Any
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def hostport(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_server(app: Any, port: int | None = None, host: str = "127.0.0.1", timeout: float = 30.0) -> RunningServer:
    """Start ``app`` with uvicorn in a thread and wait until it accepts connections."""
    import uvicorn

    port = port or free_port()
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("server thread died during start")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"server on port {port} did not start within {timeout} s")
        time.sleep(0.01)
    return RunningServer(app, host, port, server, thread)


@pytest.fixture
def run_server() -> Iterator[Callable[..., RunningServer]]:
    """Factory: ``run_server(app)`` starts it; every server started is stopped after the test."""
    started: list[RunningServer] = []

    def _run(app: Any, port: int | None = None) -> RunningServer:
        srv = start_server(app, port)
        started.append(srv)
        return srv

    yield _run
    for srv in reversed(started):
        srv.stop()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def wait_http_ready(url: str, timeout: float = 20.0) -> None:
    """Poll ``GET url`` until it answers 200 (for servers started as subprocesses)."""

    def ok() -> bool:
        try:
            return httpx.get(url, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    if not wait_until(ok, timeout, 0.05):
        raise TimeoutError(f"{url} not ready within {timeout} s")


# -- the demo (tests/e2e), run once per session in its reduced mode ----------------------------------
DEMO_REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class DemoRun:
    state_dir: Path
    report_dir: Path
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """``python -m agent demo --quick --no-live`` with its state and report in a fresh directory."""
    root = tmp_path_factory.mktemp("demo")
    state, report = root / "state", root / "report"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICOS_AGENT_")}
    proc = subprocess.run(  # noqa: S603 - our own interpreter and module
        [
            sys.executable,
            "-m",
            "agent",
            "demo",
            "--quick",
            "--no-live",
            "--state-dir",
            str(state),
            "--report-dir",
            str(report),
        ],
        cwd=DEMO_REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return DemoRun(state, report, proc.returncode, proc.stdout, proc.stderr)
