"""The ports a serving agent listens on, bound before it starts: a port in use ends the start with one
line naming the port and the setting that moves it, before anything is loaded or said to be ready
(uvicorn would bind its port only after the application's start-up, once the agent had logged ready).

:func:`bind_listeners` binds ``server.port`` and ``server.admin_port`` (handed to uvicorn as sockets),
``server.metrics_port`` (handed to :class:`~agent.server.metrics_port.MetricsPortServer`) and holds
``server.grpc_port`` too: gRPC binds its port itself, so the socket held here is let go just before the
gRPC server binds it (:meth:`Listeners.release_grpc`), within the same start.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field

from agent.config.settings import ENV_PREFIX, AgentSettings
from agent.errors import UserError

#: Command-line flags that set a port (the others are set in the config or the environment).
FLAGS = {"server.port": "--port"}


class PortUnavailable(UserError):
    """A port the agent is configured to listen on cannot be bound."""


def _how_to_change(setting: str) -> str:
    env = ENV_PREFIX + setting.upper().replace(".", "__")
    flag = FLAGS.get(setting)
    return f"{flag} or {env}" if flag else f"{setting} in the config or {env}"


def listen(host: str, port: int, setting: str = "server.port") -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when the host is), as uvicorn would bind it;
    :class:`PortUnavailable` naming ``setting`` and how to change it when the port cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        raise _unavailable(host, port, setting, exc) from None
    sock.set_inheritable(True)
    return sock


def _unavailable(host: str, port: int, setting: str, exc: OSError) -> PortUnavailable:
    how = _how_to_change(setting)
    if exc.errno == errno.EADDRINUSE:
        return PortUnavailable(f"port {port} ({setting}) is in use on {host}: choose another with {how}")
    if exc.errno == errno.EACCES:
        return PortUnavailable(
            f"port {port} ({setting}) needs privileges this process lacks: choose one above 1023 with {how}"
        )
    if exc.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME, socket.EAI_NODATA):
        host_env = ENV_PREFIX + "SERVER__HOST"
        return PortUnavailable(
            f"cannot listen on {host}:{port}: {host} is not an address of this machine; "
            f"set server.host (--host or {host_env})"
        )
    return PortUnavailable(f"cannot listen on {host}:{port} ({setting}): {exc.strerror or exc}")


def port_in_use_error(host: str, port: int, setting: str) -> PortUnavailable:
    """The error of a port found in use by a server that binds it itself (gRPC)."""
    return _unavailable(host, port, setting, OSError(errno.EADDRINUSE, "Address already in use"))


@dataclass
class Listeners:
    """The bound sockets of one serving agent."""

    #: ``server.port``, then ``server.admin_port`` when set: uvicorn serves both.
    http: list[socket.socket] = field(default_factory=list)
    metrics: socket.socket | None = None
    #: Held for ``server.grpc_port`` until the gRPC server binds it.
    grpc: socket.socket | None = None

    def release_grpc(self) -> None:
        """Let ``server.grpc_port`` go, for the gRPC server to bind it now."""
        if self.grpc is not None:
            self.grpc.close()
            self.grpc = None

    def close(self) -> None:
        for sock in [*self.http, self.metrics, self.grpc]:
            if sock is not None:
                sock.close()
        self.http, self.metrics, self.grpc = [], None, None


def bind_listeners(settings: AgentSettings) -> Listeners:
    """Bind every port ``settings`` name (``server.port``, ``admin_port``, ``metrics_port``,
    ``grpc_port``); :class:`PortUnavailable` for the first that cannot be, none left bound."""
    srv = settings.server
    out = Listeners()
    try:
        out.http.append(listen(srv.host, srv.port, "server.port"))
        if srv.admin_port is not None:
            out.http.append(listen(srv.host, srv.admin_port, "server.admin_port"))
        if srv.metrics_port is not None:
            out.metrics = listen(srv.host, srv.metrics_port, "server.metrics_port")
        if srv.grpc_port is not None:
            out.grpc = listen(srv.host, srv.grpc_port, "server.grpc_port")
    except BaseException:
        out.close()
        raise
    return out
