"""Judging on the event loop: the verdicts of the verdict-waiting requests of one loop turn together
(:class:`VerdictBatcher`) and, lingering, the recording of the predictions of many small requests
(:class:`LoopRecorder`). Both are used from the loop's thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from agent.judging.queue import JudgeQueue
from agent.judging.verdicts import JudgeWork, judge

#: At most this many predictions are judged in one turn of the event loop (see :class:`LoopRecorder`).
LOOP_MAX_SAMPLES = 128


class VerdictBatcher:
    """Gives verdicts, in one oracle call, to the works queued during one turn of the event loop.

    The first work of a turn schedules the call with ``call_soon``, which runs after the callbacks and
    tasks that are already ready: requests whose bodies arrived in the same turn have decoded and run
    their model by then and join the call. A lone request is judged right after it queued, with no
    timer and no added wait. Only the oracle runs here: recording is the caller's next step. Up to
    ``max_samples`` predictions, the oracle runs on the loop, like the rest of a small request (its
    cost is not a request's: it is the loop's wherever the request's model ran, so it does not move
    a model to the threads); a larger call is handed to a worker thread
    (``run``), so that the loop is not held for milliseconds. The oracle takes no lock, so a recording
    call running in the background thread never holds a verdict request back.
    """

    def __init__(self, run: Callable[..., Awaitable[Any]], max_samples: int = LOOP_MAX_SAMPLES) -> None:
        self.run = run
        self.max_samples = max_samples
        self._works: list[JudgeWork] = []
        self._waiting: list[asyncio.Future[None]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        #: Calls made, works judged (a work per request) and calls handed to a thread; the tests read them.
        self.calls = 0
        self.works = 0
        self.in_thread = 0

    def judge(self, work: JudgeWork) -> asyncio.Future[None]:
        """Queue a work; the future resolves once the work has its verdicts or its error."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if not self._works:
            loop.call_soon(self._judge_queued)
        self._works.append(work)
        self._waiting.append(fut)
        return fut

    def _judge_queued(self) -> None:
        works, waiting = self._works, self._waiting
        self._works, self._waiting = [], []
        self.calls += 1
        self.works += len(works)
        if sum(w.n for w in works) > self.max_samples:
            self.in_thread += 1
            task = asyncio.get_running_loop().create_task(self._judge_in_thread(works, waiting))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        judge(works)
        _resolve(waiting)

    async def _judge_in_thread(self, works: list[JudgeWork], waiting: list[asyncio.Future[None]]) -> None:
        await self.run(judge, works)
        _resolve(waiting)


def _resolve(waiting: list[asyncio.Future[None]]) -> None:
    for fut in waiting:
        if not fut.done():  # the request may have been cancelled (client gone)
            fut.set_result(None)


class LoopRecorder:
    """Records, on the event loop, the predictions of small requests, in one
    :meth:`JudgeQueue.try_record_pending` call per ``queue.linger_seconds``.

    Such requests run on the loop already (see :class:`agent.dataplane.policy.ServingPolicy`).
    Recording their predictions there too, a few dozen at a time, spares the hand-over to the
    background thread: each wake-up of that thread and each contended GIL switch costs as much as
    judging a few predictions. At most ``max_samples`` predictions are recorded in one loop turn
    (about 0.5 ms with the shipped CNN's bundle); when more wait, the background thread records them,
    off the loop. The works sit in the queue's pending list, so :meth:`JudgeQueue.flush` (shutdown)
    records them like any other.
    """

    def __init__(self, queue: JudgeQueue, max_samples: int = LOOP_MAX_SAMPLES) -> None:
        self.queue = queue
        self.max_samples = max_samples
        self._timer: asyncio.TimerHandle | None = None
        #: Calls that recorded on the loop, and hand-overs to the background thread (the tests read them).
        self.calls = 0
        self.handed_over = 0

    def add(self, work: JudgeWork) -> None:
        if self.queue.hold(work) > self.max_samples:
            self.handed_over += 1
            self.queue.wake()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.queue.linger_seconds, self._run)

    def _run(self) -> None:
        self._timer = None
        if self.queue.pending_samples() > self.max_samples:  # e.g. large requests' work queued meanwhile
            self.handed_over += 1
            self.queue.wake()
        elif self.queue.try_record_pending():
            self.calls += 1
        else:  # the background thread is recording: look again after another linger period
            self._timer = asyncio.get_running_loop().call_later(self.queue.linger_seconds, self._run)

    def close(self) -> None:
        """Cancel the pending call (what is queued stays pending for :meth:`JudgeQueue.flush`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
