"""How many rows the served model runs at once: at most one full batch's (``server.max_batch``).

A model's activations grow with the rows it runs: the MNIST CNN holds about 60 MB for a batch of 1,024
images, so 16 such requests run at once by the worker threads took the agent past 700 MB. Each run takes
its rows from :class:`ModelRows` before it starts (a request of more rows than one batch takes the whole
batch) and gives them back when it ends; runs that would pass the bound wait their turn, first come first
served. Requests of a few rows (at most a :data:`SMALL_SHARE`-th of a batch) neither wait nor count: their
activations are small, the worker threads bound how many run, and a client of single predictions is not
held up behind a burst of full batches. The model's memory is that of one full batch, and of the few small
requests beside it.
"""

from __future__ import annotations

import asyncio
from collections import deque

#: A request of at most ``capacity // SMALL_SHARE`` rows runs at once, uncounted.
SMALL_SHARE = 32


class ModelRows:
    """Rows in the model at once, bounded by a capacity given with each request (the runtime's
    ``server.max_batch``, which a reload may change). Used from the event loop only."""

    def __init__(self) -> None:
        self.held = 0
        self._queue: deque[tuple[int, int, asyncio.Future[None]]] = deque()

    async def take(self, rows: int, capacity: int) -> int:
        """Take ``rows`` (at most ``capacity``, at least one), waiting for them; returns what was taken
        (what :meth:`give` gives back; 0 for a small request, see the module docstring)."""
        if rows <= capacity // SMALL_SHARE:
            return 0
        need = max(1, min(rows, capacity))
        if not self._queue and (self.held == 0 or self.held + need <= capacity):
            self.held += need
            return need
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (need, capacity, fut)
        self._queue.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # its turn came as it was cancelled
                self.give(need)
            else:
                self._queue.remove(entry)
                self._admit()
            raise
        return need

    def give(self, taken: int) -> None:
        """Give back what :meth:`take` took; the next waiting runs start."""
        if taken:
            self.held -= taken
            self._admit()

    def _admit(self) -> None:
        while self._queue:
            need, capacity, fut = self._queue[0]
            if fut.done():
                self._queue.popleft()
                continue
            if self.held and self.held + need > capacity:
                return
            self._queue.popleft()
            self.held += need
            fut.set_result(None)
