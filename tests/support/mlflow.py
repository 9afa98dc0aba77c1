"""A real ``mlflow server`` (sqlite backend, proxied artifacts) on a loopback port."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from tests.support.ports import free_port, port_closed
from tests.support.requirements import require
from tests.support.waiting import http_ok, wait_until


class MlflowServer:
    """``mlflow server`` in its own process group, stopped by that group's id. It keeps its port and
    backend across :meth:`stop` and :meth:`start` (an outage and a recovery). Constructing one needs
    the ``mlflow`` requirement."""

    def __init__(self, root: Path, port: int | None = None, start_timeout: float = 180.0) -> None:
        self.binary: Path = require("mlflow")
        self.root = root
        self.port = free_port() if port is None else port
        self.uri = f"http://127.0.0.1:{self.port}"
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited: {self.log()[-2000:]}")
        return http_ok(f"{self.uri}/health", timeout=2)

    def start(self) -> None:
        cmd = [str(self.binary), "server", "--backend-store-uri", f"sqlite:///{self.root / 'backend.db'}"]
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
        if not wait_until(self._healthy, self.start_timeout, 0.5):
            self.stop()
            raise RuntimeError(f"mlflow server not healthy after {self.start_timeout} s: {self.log()[-2000:]}")

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
        wait_until(lambda: port_closed(self.port), 20, 0.2)
