"""``server.metrics_port``: ``/metrics`` on a port of its own, served on the agent's event loop.

prometheus_client's ``start_http_server`` starts one thread per connection without bound: a flood of
idle connections to the metrics port cost a thread each. This server is a handful of coroutines on the
event loop instead: at most :data:`MAX_CONNECTIONS` at once (more are closed at once), a request head of
at most :data:`MAX_HEAD_BYTES` read within :data:`READ_TIMEOUT_SECONDS`, one request per connection. The
exposition itself (``generate_latest``) runs in a worker thread, as ``GET /metrics`` on the main port does.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from agent.core import logs

log = logs.get("metrics")

MAX_CONNECTIONS = 64
MAX_HEAD_BYTES = 8192
READ_TIMEOUT_SECONDS = 5.0

Offload = Callable[..., Awaitable[bytes]]


class MetricsPortServer:
    """Serves ``GET /metrics`` (and ``/``) of ``registry`` on ``host:port``; see the module docstring."""

    def __init__(self, registry: CollectorRegistry, offload: Offload) -> None:
        self.registry = registry
        self.offload = offload
        self._server: asyncio.Server | None = None
        self._active = 0
        self.refused = 0

    async def start(self, host: str, port: int, sock: socket.socket | None = None) -> None:
        """Serve on ``sock`` (bound by :func:`agent.server.listeners.bind_listeners`), else bind ``host:port``."""
        if sock is not None:
            self._server = await asyncio.start_server(self._handle, sock=sock, limit=MAX_HEAD_BYTES)
        else:
            self._server = await asyncio.start_server(self._handle, host, port, limit=MAX_HEAD_BYTES)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2.0)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._active >= MAX_CONNECTIONS:
            self.refused += 1
            writer.close()
            return
        self._active += 1
        try:
            status, body, ctype = await self._answer(reader)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode("ascii") + body)
            await asyncio.wait_for(writer.drain(), timeout=READ_TIMEOUT_SECONDS)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass  # a slow, broken or oversized client: drop it
        finally:
            self._active -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), timeout=1.0)

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[str, bytes, str]:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=READ_TIMEOUT_SECONDS)
        except (asyncio.LimitOverrunError, ValueError):  # the head grew past the stream's limit
            return "431 Request Header Fields Too Large", b"request head too large\n", "text/plain"
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD"):
            return "405 Method Not Allowed", b"only GET /metrics\n", "text/plain"
        if parts[1].split(b"?", 1)[0] not in (b"/metrics", b"/"):
            return "404 Not Found", b"only GET /metrics\n", "text/plain"
        body = await self.offload(generate_latest, self.registry)
        return "200 OK", body if parts[0] == b"GET" else b"", CONTENT_TYPE_LATEST
