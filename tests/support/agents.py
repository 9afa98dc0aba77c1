"""Agents started for a test or for a whole module (the conftest's ``agents`` and ``module_agents``):
served in-process (:meth:`Agents.serve`) or as ``icos-agent serve`` processes (:meth:`Agents.process`),
all stopped when the scope ends, the last started first. A module's ``agent`` fixture says only which
agent it wants; starting, waiting and stopping are done here once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.agent_process import AgentProcess
from tests.support.inprocess import RunningServer, start_server


class Agents:
    """The agents of one scope; ``directory(name)`` gives a fresh directory for a process's config and log."""

    def __init__(self, directory: Callable[[str], Path]) -> None:
        self._directory = directory
        self._stops: list[Callable[[], None]] = []

    def serve(self, app: Any, port: int | None = None) -> RunningServer:
        """``app`` served by uvicorn in a thread of the test process, once it accepts connections."""
        srv = start_server(app, port)
        self._stops.append(srv.stop)
        return srv

    def process(
        self,
        config: dict[str, Any],
        *,
        name: str = "agent",
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], Any] | None = None,
        graceful: bool = False,
        wait_for: str = "/v2/health/ready",
    ) -> AgentProcess:
        """``icos-agent serve`` with ``config`` in a fresh directory, once ``wait_for`` answers 200.
        At the end it is killed; ``graceful``: stopped with SIGTERM instead, and it must exit with 0."""
        proc = AgentProcess(self._directory(name), config, env=env, preexec_fn=preexec_fn).start(wait_for=wait_for)
        self._stops.append(lambda: _stop_process(proc, graceful))
        return proc

    def close(self) -> None:
        """Stop every agent, the last started first; the first failure (a graceful stop's exit status)
        is raised after all are stopped."""
        failure: BaseException | None = None
        while self._stops:
            try:
                self._stops.pop()()
            except Exception as exc:  # noqa: BLE001 - every agent is stopped before the first failure is raised
                failure = failure or exc
        if failure is not None:
            raise failure


def _stop_process(proc: AgentProcess, graceful: bool) -> None:
    if not graceful:
        proc.kill()
        return
    status = proc.terminate()
    assert status == 0, f"the agent exited with {status} on SIGTERM: {proc.log()[-3000:]}"
