"""A bound on the bytes of request bodies the server holds at once (``server.max_inflight_bytes``).

Each request body (HTTP, either path) takes its size from the budget before it is read on, and gives it
back once answered. A gRPC request message's size is known only once it is read, so its call first takes
the most a message may be (waiting for room, :mod:`agent.server.grpc_server`), reads it, and keeps what the
message and its parsed copy hold. A request that does not fit is refused at once with
503 and ``Retry-After`` (:class:`ServerBusy`, counted in
``icos_connections_refused_total{reason="bytes_in_flight"}``), so a burst of large requests cannot make
the process hold gigabytes: what it holds is the budget, plus what the transports buffer before the
request reaches the agent. One request up to ``server.max_body_bytes`` always fits an idle server.

When the bytes in flight fall back to zero after a burst that held more than :data:`TRIM_AFTER_BYTES`,
the memory is handed back (:func:`agent.core.memory.release`, in a worker thread), so the process's
RSS returns near its baseline. Requests that come one at a time never hold that much: only a burst
pays for the hand-back. A gRPC call's reservation (the most its message may be, taken before it is read)
is not a burst: only what requests really hold counts towards one (:meth:`BodyBudget.settle`), so that two
small gRPC calls at once, each reserving 64 MB, do not collect and trim the heap every time they end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from agent.errors import Unavailable

TRIM_AFTER_BYTES = 64 * 1024 * 1024


class ServerBusy(Unavailable):
    """The request's bytes do not fit the budget now: answered 503 with ``Retry-After``."""

    def __init__(self, size: int, budget: int) -> None:
        super().__init__(
            f"the server holds its limit of {budget} bytes of requests (server.max_inflight_bytes); "
            f"this one needs {size} more: retry"
        )


class BodyBudget:
    """Bytes of request bodies in flight (thread-safe)."""

    def __init__(self, limit: int, on_idle_after_burst: Callable[[], None] = lambda: None) -> None:
        self.limit = int(limit)
        self.on_idle_after_burst = on_idle_after_burst
        self.held = 0
        self._real = 0  # of which what requests really hold (not a gRPC call's reservation)
        self._peak = 0  # most really held since the last hand-back
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def on_give(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (outside the lock, in the thread that gives) whenever bytes are given back:
        how a request waiting for room learns of it."""
        self._listeners.append(listener)

    def take(self, size: int, *, reservation: bool = False) -> None:
        """Take ``size`` bytes, or raise :class:`ServerBusy` (nothing taken). A ``reservation`` holds room
        for a message not yet read: it counts against the limit, not towards a burst."""
        with self._lock:
            if self.held and self.held + size > self.limit:
                raise ServerBusy(size, self.limit)
            self.held += size
            if not reservation:
                self._add_real(size)

    def settle(self, reservation: int, size: int) -> None:
        """A reservation becomes the ``size`` bytes its request really holds (at most the reservation); the
        rest goes back. The request then gives back ``size`` as any request does."""
        with self._lock:
            self.held -= reservation - size
            self._add_real(size)
        self._notify()

    def give(self, size: int, *, reservation: bool = False) -> None:
        """Give back ``size`` bytes taken before (a reservation never settled: ``reservation=True``)."""
        with self._lock:
            self.held -= size
            if not reservation:
                self._real -= size
            burst = self.held == 0 and self._peak > TRIM_AFTER_BYTES
            if self.held == 0:
                self._peak = 0
        self._notify()
        if burst:
            self.on_idle_after_burst()

    def _add_real(self, size: int) -> None:
        self._real += size
        self._peak = max(self._peak, self._real)

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()
