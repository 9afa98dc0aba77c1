"""Free TCP ports on the loopback interface."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_closed(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing accepts connections on ``host:port`` (a stopped server released it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex((host, port)) != 0
