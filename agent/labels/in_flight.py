"""Requests on their way to the prediction store: queued or being written, counted by request id, and
who waits for them to arrive.

A label may name a prediction answered a moment ago, still in the store's write queue. The store
counts every batch from :meth:`InFlight.arrived` (queued) to :meth:`InFlight.left` (written or
dropped), so :meth:`InFlight.wait` can wait, bounded, until the requests a label names have left,
instead of anyone draining the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence

from agent.core.held_requests import HeldRequests


class InFlight:
    """Batches per request id between the queue and the database (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = HeldRequests()
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]]] = {}

    def arrived(self, request_id: str) -> None:
        """A batch of ``request_id`` is queued (counted before the writer can see it)."""
        with self._lock:
            self._held.add(request_id)

    def arrived_many(self, request_ids: Iterable[str]) -> None:
        """:meth:`arrived` of every request of a recording call, under one lock."""
        with self._lock:
            for rid in request_ids:
                self._held.add(rid)

    def awaited(self, request_id: str) -> bool:
        """Whether somebody waits for ``request_id`` to leave (the writer should not wait its interval)."""
        return request_id in self._waiters

    def holds(self, request_id: str) -> bool:
        """Whether batches of ``request_id`` are queued or being written now."""
        with self._lock:
            return self._held.holds(request_id)

    def ids(self) -> list[str]:
        """The request ids of every batch queued or being written now."""
        with self._lock:
            return self._held.ids()

    def left(self, request_ids: Sequence[str]) -> None:
        """Batches of these requests left the queue (written or dropped): wake who waits for that."""
        with self._lock:
            for rid in request_ids:
                if self._held.release(rid):
                    for loop, fut in self._waiters.pop(rid, ()):
                        _resolve(loop, fut)

    async def wait(
        self,
        request_ids: Iterable[str],
        pending_before: Callable[[str], bool],
        timeout: float,
        hurry: Callable[[], None],
    ) -> None:
        """Return once none of ``request_ids`` is on its way any more, or after ``timeout``.
        ``pending_before(id)`` says whether a request is still before the store (e.g. in the judge queue,
        which hands it to the store); each waiter is registered before that is asked, so no hand-over
        between the two is missed. ``hurry`` asks the writer to write now."""
        loop = asyncio.get_running_loop()
        waiting: list[tuple[str, asyncio.Future[bool]]] = []
        with self._lock:
            for rid in set(request_ids):
                fut: asyncio.Future[bool] = loop.create_future()
                self._waiters.setdefault(rid, []).append((loop, fut))
                waiting.append((rid, fut))
        for rid, fut in waiting:
            if not pending_before(rid) and not self.holds(rid) and not fut.done():
                fut.set_result(True)
        open_ = [f for _, f in waiting if not f.done()]
        if open_:
            hurry()
            await asyncio.wait(open_, timeout=timeout)
        with self._lock:
            for rid, fut in waiting:
                entries = self._waiters.get(rid)
                if entries is not None:
                    entries[:] = [e for e in entries if e[1] is not fut]
                    if not entries:
                        del self._waiters[rid]


def _resolve(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[bool]) -> None:
    def resolve() -> None:
        if not fut.done():
            fut.set_result(True)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(resolve)
