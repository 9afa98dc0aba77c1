"""The agent (any ASGI app) served by uvicorn in a thread of the test process, on a real socket: the
tests reach its internals (``app.state.agent``) and talk to it over HTTP."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from tests.support.ports import free_port


@dataclass
class RunningServer:
    """A uvicorn server running an ASGI app in a thread."""

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
        """Shut down (lifespan included) and wait for the thread, at most 30 s."""
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_server(app: Any, port: int | None = None, host: str = "127.0.0.1", timeout: float = 30.0) -> RunningServer:
    """Start ``app`` with uvicorn in a thread and return once it accepts connections."""
    import uvicorn

    port = port or free_port(host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the server thread on port {port} died during start")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"server on port {port} did not start within {timeout} s")
        time.sleep(0.01)
    return RunningServer(app, host, port, server, thread)


def settle(server: RunningServer) -> None:
    """Record every prediction the agent has answered so far (its judge queue's flush: a barrier for
    work queued before the call); its windows and metrics count them afterwards."""
    server.app.state.agent.judge_queue.flush()
