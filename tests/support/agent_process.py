"""``icos-agent serve`` as a real process (``python -m agent serve --config ...``) on a free port, for
tests of what only a process shows: signals, crashes, restarts, threads, file descriptors, limits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.support.metrics import Scrape, scrape
from tests.support.ports import free_port
from tests.support.waiting import wait_http_ready


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without ``ICOS_AGENT_*`` overrides (a developer's must not leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICOS_AGENT_")}
    env.update(extra or {})
    return env


class AgentProcess:
    """``icos-agent serve`` in a subprocess with ``config`` (its ``server.host``/``port`` set here);
    stdout and stderr (JSON logs) go to ``<directory>/agent-<port>.log``. A context manager that kills
    it on exit."""

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
        self.env = clean_env(env)
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0, wait_for: str = "/v2/health/ready") -> AgentProcess:
        """Start it (again, on the same port and config) and wait until ``wait_for`` answers 200 (an
        agent in proxy mode is not ready while its upstream is not: wait for ``/v2/health/live`` then)."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent", "serve", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=self.preexec_fn,
            )
        try:
            wait_http_ready(f"{self.url}{wait_for}", timeout)
        except TimeoutError:
            self.kill()
            raise RuntimeError(f"agent did not start: {self.log()[-3000:]}") from None
        return self

    def run(self, *args: str, timeout: float = 60.0) -> int:
        """Run ``icos-agent serve --config ... *args`` to its end (a start that must fail, ``--check``)
        and return its exit status; its output is in :meth:`log`."""
        with self.log_path.open("ab") as log:
            proc = subprocess.run(
                [sys.executable, "-m", "agent", "serve", "--config", str(self.config_path), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                timeout=timeout,
                check=False,
            )
        return proc.returncode

    def __enter__(self) -> AgentProcess:
        return self if self.proc is not None else self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def scrape(self) -> Scrape:
        return scrape(self.url)

    def metrics(self) -> dict[str, float]:
        """Unlabelled samples and ``name{k=v,...}`` keys of the labelled ones (see :meth:`Scrape.flat`)."""
        return self.scrape().flat()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM (a graceful stop) and its exit status."""
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
