"""Helpers for fault tests: the agent as a real process (``python -m agent serve``) on a free port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from conftest import free_port, wait_http_ready
from prometheus_client.parser import text_string_to_metric_families


class AgentProcess:
    """``icos-agent serve`` in a subprocess; stderr (JSON logs) goes to ``<dir>/agent.log``."""

    def __init__(
        self,
        directory: Path,
        config: dict[str, Any],
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], Any] | None = None,
    ) -> None:
        """``preexec_fn`` runs in the child before the agent starts (e.g. to lower a resource limit)."""
        self.dir = directory
        self.port = free_port()
        cfg = dict(config)
        cfg["server"] = {"host": "127.0.0.1", "port": self.port, **cfg.get("server", {})}
        self.config_path = directory / f"agent-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg))
        self.log_path = directory / f"agent-{self.port}.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ICOS_AGENT_")}
        self.env.update(env or {})
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> AgentProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent", "serve", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=self.preexec_fn,
            )
        try:
            wait_http_ready(f"{self.url}/v2/health/ready", timeout)
        except TimeoutError:
            self.kill()
            raise RuntimeError(f"agent did not start: {self.log()[-3000:]}") from None
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metrics(self) -> dict[str, float]:
        """Unlabelled samples and ``name{k=v,...}`` keys of the labelled ones."""
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(httpx.get(f"{self.url}/metrics", timeout=10).text):
            for s in fam.samples:
                key = s.name + (
                    "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else ""
                )
                out[key] = s.value
        return out

    def terminate(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def threads(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise RuntimeError("no Threads line")

    def thread_names(self) -> dict[str, int]:
        """How many of the agent's threads have each OS-level name (``/proc/<pid>/task/*/comm``)."""
        names: dict[str, int] = {}
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                name = (task / "comm").read_text().strip()
            except OSError:  # the thread ended meanwhile
                continue
            names[name] = names.get(name, 0) + 1
        return names

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))


def infer_body(x: Any, verdict: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]
    }
    if verdict:
        body["outputs"] = [{"name": "label"}, {"name": "icos_verdict"}]
    return body
