"""A real ``mlflow server`` for the integration tests (sqlite backend, proxied artifacts, loopback)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from conftest import free_port

MLFLOW_BIN = Path(sys.executable).with_name("mlflow")


class MlflowServer:
    """``mlflow server`` in its own process group, stopped by that group's id. It keeps its port and
    backend across :meth:`stop` and :meth:`start` (an outage and a recovery)."""

    def __init__(self, root: Path, port: int | None = None, start_timeout: float = 180.0) -> None:
        self.root = root
        self.port = free_port() if port is None else port
        self.uri = f"http://127.0.0.1:{self.port}"
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cmd = [str(MLFLOW_BIN), "server", "--backend-store-uri", f"sqlite:///{self.root / 'backend.db'}"]
        cmd += ["--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--workers", "1"]
        with (self.root / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.root,
                env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server not healthy after {self.start_timeout} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None
        # uvicorn's worker runs in the same group; wait until the port is free again
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.2)
