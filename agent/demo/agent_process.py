"""Start the real agent for the demo: ``python -m agent serve --config <state>/agent.yaml`` in a
subprocess on 127.0.0.1, wait until it is ready, and always stop it (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx
import yaml

from agent.config.settings import ADMIN_TOKEN_ENV, ENV_PREFIX
from agent.errors import UserError

MODEL_NAME = "mnist"
MODEL_VERSION = "1"
CONFIG_FILE = "agent.yaml"
LOG_FILE = "agent.log"
#: What a previous run left that would mix into this one: the saved estimate windows and the store
#: of predictions waiting for delayed labels.
STATE_FILES = tuple(
    f"{base}{ext}" for base in ("agent-state.sqlite3", "predictions.sqlite3") for ext in ("", "-wal", "-shm")
)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def agent_config(
    *,
    model_path: Path,
    bundle_dir: Path,
    state_dir: Path,
    reference: Path,
    port: int,
    count_window: int,
    quick: bool,
) -> dict[str, Any]:
    """The agent's settings for the demo (serve mode, audits on demand, MLflow in the state dir).

    Audits have a 24 h interval, so during the story they run only when the demo asks for them
    (``POST /v1/audits/{kind}``); the entries exist to set their parameters.
    """
    samples = 300 if quick else 1000
    return {
        "mode": "serve",
        "model": {"name": MODEL_NAME, "version": MODEL_VERSION, "path": str(model_path)},
        "bundle": {"path": str(bundle_dir)},
        "server": {"host": "127.0.0.1", "port": port, "graceful_timeout_seconds": 5},
        "windows": {"time": ["5m", "1h"], "count": count_window},
        "state_dir": str(state_dir),
        "log_level": "warning",
        "audits": {
            "reference": {"source": "reference", "path": str(reference)},
            "reservoir": {"size": 1000, "horizon": "1h"},
            "mlflow": {"experiment": "icos-agent"},
            "dscore": {"interval": "24h", "n": 3, "t": 5, "max_samples": samples},
            "mutation": {
                "interval": "24h",
                "k": 9000 if quick else 20000,  # 3-4 % of the pixels
                "repetitions": 2,
                "operators": ["IMP", "SGN", "DIG"],
                "max_samples": samples,
            },
            "metamorphic": {
                "interval": "24h",
                "data": {"source": "live", "min_samples": 100},
                "transformations": [
                    {"name": "shift", "max_pixels": 2},
                    {"name": "brightness", "delta": 0.1},
                    {"name": "contrast", "amount": 0.2},
                    {"name": "gaussian_noise", "sigma": 0.05},
                    {"name": "rotation", "max_degrees": 10},
                    {"name": "blur", "sigma": 0.7},
                ],
                "order": 1,
                "max_samples": samples,
            },
        },
    }


def write_config(path: Path, settings: Mapping[str, Any]) -> None:
    header = "# Written by `icos-agent demo`: the agent it starts uses exactly this file.\n"
    path.write_text(header + yaml.safe_dump(dict(settings), sort_keys=False), encoding="utf-8")


def _child_env(token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX) or k == "ICOS_AGENT_DEBUG"}
    env[ADMIN_TOKEN_ENV] = token
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the agent gets SIGTERM when the demo process dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class AgentProcess:
    """The agent as a subprocess; use as a context manager (stopped on exit, whatever happened)."""

    def __init__(self, config_path: Path, port: int, log_path: Path) -> None:
        self.config_path = config_path
        self.port = port
        self.log_path = log_path
        self.token = secrets.token_urlsafe(24)
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        self._log = self.log_path.open("ab")
        cmd = [sys.executable, "-m", "agent", "serve", "--config", str(self.config_path)]
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_child_env(self.token),
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
        )
        deadline = time.monotonic() + timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise UserError(f"the agent exited with status {code} while starting; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise UserError(f"the agent did not become ready within {timeout:.0f} s; see {self.log_path}")
            time.sleep(0.1)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (graceful: state flushed), SIGKILL after ``timeout`` s; the exit status."""
        proc, self.proc = self.proc, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
            code = proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> AgentProcess:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def clear_window_state(state_dir: Path) -> None:
    """Forget the windows and predictions a previous run saved, so the story starts from zero."""
    for name in STATE_FILES:
        (state_dir / name).unlink(missing_ok=True)
