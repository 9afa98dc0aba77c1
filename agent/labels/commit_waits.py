"""Acknowledge after commit (``labels.durability: commit``): the requests waiting until a transaction
holding their predictions has committed, and the outcomes of commits nobody waited for yet.

The prediction store's writer thread settles request ids (:meth:`CommitWaits.settle`); a request's
coroutine waits on its own event loop (:meth:`CommitWaits.wait`), resolved from the writer thread
through that loop. An outcome that arrives before its request asks is kept (the newest
:data:`SETTLED_MEMORY`), so a request that asks after the fact is answered at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence

#: Outcomes of commits kept for requests that ask after the fact.
SETTLED_MEMORY = 65_536


class CommitWaits:
    """Who waits for which commit, and the outcomes nobody waited for yet (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]]] = {}
        self._settled: OrderedDict[str, bool] = OrderedDict()

    async def wait(self, request_id: str, timeout: float, *, unreachable: bool) -> bool:
        """``True`` once the predictions of ``request_id`` are committed; ``False`` when they were
        dropped, the database is ``unreachable`` (and the outcome is not known yet), or ``timeout`` passed."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if request_id in self._settled:
                return self._settled.pop(request_id)
            if unreachable:
                return False
            fut: asyncio.Future[bool] = loop.create_future()
            entry = (loop, fut)
            self._waiters.setdefault(request_id, deque()).append(entry)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            with self._lock:
                q = self._waiters.get(request_id)
                if q is not None:
                    with contextlib.suppress(ValueError):
                        q.remove(entry)
                    if not q:
                        del self._waiters[request_id]
            return False

    def waiting(self) -> list[str]:
        """The request ids somebody waits for now."""
        with self._lock:
            return list(self._waiters)

    def settle(self, request_ids: Sequence[str], *, ok: bool) -> None:
        """Tell the requests waiting for these ids whether their commit happened (kept for those that
        ask later)."""
        with self._lock:
            for rid in request_ids:
                q = self._waiters.get(rid)
                if q:
                    loop, fut = q.popleft()
                    if not q:
                        del self._waiters[rid]
                    _resolve_from_thread(loop, fut, ok)
                else:
                    self._settled[rid] = ok
                    self._settled.move_to_end(rid)
                    if len(self._settled) > SETTLED_MEMORY:
                        self._settled.popitem(last=False)

    def fail_all(self) -> None:
        """Answer every waiting request ``False`` (the database became unreachable, or the store stops)."""
        with self._lock:
            waiting, self._waiters = self._waiters, {}
        for q in waiting.values():
            for loop, fut in q:
                _resolve_from_thread(loop, fut, False)


def _resolve_from_thread(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[bool], ok: bool) -> None:
    def resolve() -> None:
        if not fut.done():
            fut.set_result(ok)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(resolve)
