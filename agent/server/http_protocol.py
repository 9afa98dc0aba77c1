"""uvicorn's httptools protocol with the connection bounds uvicorn lacks.

uvicorn (0.54) arms its keep-alive timer only after a response: a connection that never finishes a
request head stays open for ever, and neither uvicorn nor httptools bounds the size of a head. A
few hundred clients dribbling header bytes could then take every file descriptor of the process.
:func:`bounded_protocol` returns a subclass (``uvicorn.Config(http=...)`` takes a protocol class)
that

* closes a connection whose request head is not complete ``header_timeout`` seconds after the
  connection opened or the request's first byte arrived (``server.header_timeout_seconds``);
* closes a connection whose request body is not complete ``body_timeout`` seconds after its head
  (``server.body_timeout_seconds``): a client dribbling a large body holds a request slot, a
  thread's worth of buffers and a descriptor no longer than that;
* answers 431 and closes when a head grows past ``max_head_bytes`` (``server.max_head_bytes``);
* answers 503 with ``Retry-After`` and closes a new connection at once while ``limit_concurrency``
  connections are open (``server.limit_concurrency``), so that descriptors stay below the limit.

Refusals are counted by reason (``icos_connections_refused_total{reason}``) and logged at most once
per ``LOG_INTERVAL`` seconds with counts, never once each. uvicorn's own per-request warnings (a
request that is not HTTP, a request past the concurrency limit, an unsupported upgrade) go the same
way (:class:`_QuietLogger`): a flood of them is a few counted lines, not a log line per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agent.errors import Abort

log = logging.getLogger("icos_agent.http")

#: Seconds between two log records about refused or timed-out connections.
LOG_INTERVAL = 10.0

#: The deadlines of a connection, by the reason a connection closed by one is counted under.
HEAD = "header_timeout"
BODY = "body_timeout"


def _refusal(status_line: bytes, message: str, *headers: bytes) -> bytes:
    """A complete HTTP/1.1 answer that closes the connection, with a JSON error like the app's."""
    body = json.dumps({"error": message}).encode()
    head = [status_line, b"content-type: application/json", b"connection: close", *headers]
    return b"\r\n".join([*head, b"content-length: " + str(len(body)).encode(), b"", body])


_BUSY = _refusal(
    b"HTTP/1.1 503 Service Unavailable", "too many open connections (server.limit_concurrency)", b"retry-after: 1"
)


class HeadTooLarge(Abort):
    """A request head past ``server.max_head_bytes``, raised from a parser callback."""


class _Throttled:
    """Counts events and logs one warning per :data:`LOG_INTERVAL` with the count since the last."""

    def __init__(self, on_refused: Callable[[str], None] | None) -> None:
        self.counts: dict[str, int] = {}
        self.last = 0.0
        self.on_refused = on_refused

    def note(self, what: str) -> None:
        if self.on_refused is not None:
            self.on_refused(what)
        self.counts[what] = self.counts.get(what, 0) + 1
        now = time.monotonic()
        if now - self.last >= LOG_INTERVAL:
            self.last = now
            log.warning("connections refused or closed", extra={"counts": dict(self.counts)})
            self.counts.clear()


#: uvicorn's per-request warnings → the reason they are counted under.
_UVICORN_WARNINGS = {
    "Invalid HTTP request received.": "malformed_request",
    "Exceeded concurrency limit.": "limit_concurrency",
    "Unsupported upgrade request.": "unsupported_upgrade",
}


class _QuietLogger:
    """uvicorn's protocol logger with its per-request warnings counted and throttled (``note``);
    everything else (errors of the app, trace lines) goes to the real logger as before."""

    def __init__(self, logger: logging.Logger, throttled: _Throttled) -> None:
        self._logger = logger
        self._throttled = throttled

    @property
    def level(self) -> int:
        return self._logger.level

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        reason = _UVICORN_WARNINGS.get(msg)
        if reason is not None and not args:
            self._throttled.note(reason)
        else:
            self._logger.warning(msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


@dataclass(frozen=True)
class _Bounds:
    """One server's connection bounds, shared by its connections (see :func:`bounded_protocol`)."""

    header_timeout: float
    max_head_bytes: int
    body_timeout: float | None
    throttled: _Throttled
    #: the 431 answer to a head past ``max_head_bytes``
    too_large: bytes


class _BoundedProtocol(HttpToolsProtocol):
    """The httptools protocol under :attr:`bounds` (set on the subclass :func:`bounded_protocol` makes)."""

    bounds: _Bounds

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = _QuietLogger(self.logger, self.bounds.throttled)  # type: ignore[assignment]
        #: the armed deadlines (:data:`HEAD`, :data:`BODY`), in the loop's time
        self._deadlines: dict[str, float] = {}
        #: the one timer that looks at them, and when it fires (see :meth:`_arm`)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._head_size = 0
        self._head_too_large = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.limit_concurrency is not None and len(self.connections) > self.limit_concurrency:
            self.bounds.throttled.note("limit_concurrency")
            transport.write(_BUSY)
            transport.close()
            return
        self._arm(HEAD, self.bounds.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadlines.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_size = 0
        if HEAD not in self._deadlines:  # the next request on a kept-alive connection
            self._arm(HEAD, self.bounds.header_timeout)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel(HEAD)
        super().on_headers_complete()
        if self.bounds.body_timeout is not None:
            self._arm(BODY, self.bounds.body_timeout)

    def on_message_complete(self) -> None:
        self._cancel(BODY)
        super().on_message_complete()

    def _arm(self, reason: str, seconds: float) -> None:
        """Close the connection, counted under ``reason``, unless the phase ends within ``seconds``.

        Every request arms two deadlines and ends both: a timer each (created, then cancelled) cost more
        than the rest of this class. One timer per connection looks at the deadlines instead; it is set
        again only when a deadline comes before it, and a deadline ended meanwhile costs nothing."""
        at = self.loop.time() + seconds
        self._deadlines[reason] = at
        if self._timer is None or at < self._timer_at:
            self._schedule(at)

    def _cancel(self, reason: str) -> None:
        self._deadlines.pop(reason, None)  # the timer, when it fires, finds it gone

    def _schedule(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self.loop.call_at(at, self._check), at

    def _check(self) -> None:
        """The timer fired: expire what is due, then wait for the next deadline."""
        self._timer = None
        now = self.loop.time()
        for reason, at in list(self._deadlines.items()):
            if at <= now:
                self._expire(reason)
        if self._deadlines:
            self._schedule(min(self._deadlines.values()))

    def _expire(self, reason: str) -> None:
        # A request under way ends without an answer: the app's receive() then reports a disconnect.
        del self._deadlines[reason]
        if not self.transport.is_closing():
            self.bounds.throttled.note(reason)
            self.transport.close()

    def _count_head(self, n: int) -> None:
        # the parser hands the head over in pieces as it arrives: stop before storing more
        self._head_size += n
        if self._head_size > self.bounds.max_head_bytes:
            self._head_too_large = True
            raise HeadTooLarge(self.bounds.max_head_bytes)  # the parser stops; uvicorn answers with send_400_response

    def send_400_response(self, msg: str) -> None:
        if not self._head_too_large:
            super().send_400_response(msg)
            return
        self.bounds.throttled.note("max_head_bytes")
        self._cancel(HEAD)
        self.transport.write(self.bounds.too_large)
        self.transport.close()


def bounded_protocol(
    header_timeout: float,
    max_head_bytes: int,
    on_refused: Callable[[str], None] | None = None,
    body_timeout: float | None = None,
) -> type[HttpToolsProtocol]:
    """The httptools protocol class with a head timeout, a head size bound, a body timeout and refusal
    at the connection limit (``uvicorn.Config.limit_concurrency``); ``on_refused`` counts each refusal
    by reason (``limit_concurrency``, ``header_timeout``, ``max_head_bytes``, ``body_timeout``)."""
    too_large = _refusal(
        b"HTTP/1.1 431 Request Header Fields Too Large",
        f"request head larger than {max_head_bytes} bytes (server.max_head_bytes)",
    )

    class BoundedHttpToolsProtocol(_BoundedProtocol):
        bounds = _Bounds(header_timeout, max_head_bytes, body_timeout, _Throttled(on_refused), too_large)

    return BoundedHttpToolsProtocol
