"""Judging on the event loop: the verdicts of the verdict-waiting requests of one loop turn together
(:class:`VerdictBatcher`) and, lingering, the recording of the predictions of many small requests
(:class:`LoopJudge`).

This is judging policy, not HTTP: the server's :class:`~agent.server.service.AgentService` builds
both around its :class:`~agent.judging.pipeline.Pipeline` and its worker-thread runner.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agent.core.os_threads import name_os_thread_once
from agent.judging.pipeline import DecodedRequest, JudgeWork, Pipeline
from agent.model.classifier import Prediction

#: At most this many predictions are judged in one turn of the event loop (see :class:`LoopJudge`).
LOOP_JUDGE_MAX_SAMPLES = 128


class VerdictBatcher:
    """Gives verdicts, in one oracle call (:meth:`Pipeline.verdicts_now`), to the works queued during
    one turn of the event loop (used only from the loop's thread), then hands them to ``record``.

    The first work of a turn schedules the call with ``call_soon``, which runs after the callbacks
    and tasks that are already ready: requests whose bodies arrived in the same turn have decoded and
    run their model by then and join the call. A lone request is judged right after it queued, with
    no timer and no added wait. Only the oracle runs on the request path: recording the verdicts
    (windows, metrics, the prediction store) is handed to ``record``, i.e. to the lingering judge
    (:class:`LoopJudge`), which records the predictions of many requests, with or without verdicts,
    in one batch. Up to ``max_samples`` predictions, the oracle runs on the loop, like the rest of a
    small request, and each waiting request gets its CPU share of it; a larger call is handed to a
    worker thread (``run``), so that the loop is not held for milliseconds. The oracle takes no lock,
    so a judging call running in the background thread never holds a verdict request back.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        run: Callable[..., Awaitable[Any]],
        max_samples: int = LOOP_JUDGE_MAX_SAMPLES,
    ) -> None:
        self.pipeline = pipeline
        self.run = run
        self.max_samples = max_samples
        self._works: list[JudgeWork] = []
        self._waiting: list[asyncio.Future[float]] = []
        self._records: list[Callable[[JudgeWork], None]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        #: Calls made, works judged (a work per request) and calls handed to a thread; the tests read them.
        self.calls = 0
        self.works = 0
        self.in_thread = 0

    def judge(self, work: JudgeWork, record: Callable[[JudgeWork], None]) -> asyncio.Future[float]:
        """Queue a work; the future resolves (to this request's share of the oracle's seconds) once it
        has its verdicts (or its error); then, without an error, the work goes to ``record``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        if not self._works:
            loop.call_soon(self._judge_queued)
        self._works.append(work)
        self._waiting.append(fut)
        self._records.append(record)
        return fut

    def _judge_queued(self) -> None:
        works, waiting, records = self._works, self._waiting, self._records
        self._works, self._waiting, self._records = [], [], []
        self.calls += 1
        self.works += len(works)
        if sum(len(w.labels) for w in works) > self.max_samples:
            self.in_thread += 1
            task = asyncio.get_running_loop().create_task(self._judge_in_thread(works, waiting, records))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._done(works, waiting, records, verdicts_with_cost(self.pipeline, works))

    async def _judge_in_thread(
        self, works: list[JudgeWork], waiting: list[asyncio.Future[float]], records: list[Callable[[JudgeWork], None]]
    ) -> None:
        self._done(works, waiting, records, await self.run(verdicts_with_cost, self.pipeline, works))

    @staticmethod
    def _done(
        works: list[JudgeWork],
        waiting: list[asyncio.Future[float]],
        records: list[Callable[[JudgeWork], None]],
        share: float,
    ) -> None:
        resolve_waiting(waiting, share)
        for w, record in zip(works, records, strict=True):
            if w.error is None:
                record(w)


def verdicts_with_cost(pipeline: Pipeline, works: list[JudgeWork]) -> float:
    """Give the works their verdicts (or errors); each one's share of the seconds it took (wall time on
    one thread that holds the GIL throughout: close to its CPU time, without a clock system call)."""
    t0 = time.perf_counter()
    pipeline.verdicts_now(works)
    return (time.perf_counter() - t0) / max(1, len(works))


def resolve_waiting(waiting: list[asyncio.Future[float]], share: float) -> None:
    for fut in waiting:
        if not fut.done():  # the request may have been cancelled (client gone)
            fut.set_result(share)


def in_worker(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` in a worker thread named ``icos-worker`` for the OS (see :mod:`agent.core.os_threads`)."""
    name_os_thread_once("icos-worker")
    return fn(*args)


def model_with_cost(
    pipeline: Pipeline, decoded: DecodedRequest, measure: bool = True
) -> tuple[Prediction, float, float]:
    """:meth:`Pipeline.serve_model` plus the CPU time it took on the calling (worker) thread (0 unless
    ``measure``: reading the thread's CPU clock is a system call)."""
    t0 = time.thread_time() if measure else 0.0
    pred, seconds = pipeline.serve_model(decoded)
    return pred, seconds, time.thread_time() - t0 if measure else 0.0


class LoopJudge:
    """Judges and records, on the event loop, the predictions of small serve-mode requests (those that
    do not wait for their verdicts, and those that already got them from the :class:`VerdictBatcher`),
    in one :meth:`Pipeline.try_judge_pending` call per ``pipeline.linger_seconds`` (used only from
    the loop's thread).

    Such requests run on the loop already (see :meth:`agent.server.service.AgentService.infer`). Judging their
    predictions there too, a few dozen at a time, spares the hand-over to the background thread:
    each wake-up of that thread and each contended GIL switch costs as much as judging a few
    predictions. At most ``max_samples`` predictions are judged in one loop turn (about 0.5 ms with
    the shipped CNN's bundle); when more wait, the background thread judges them, off the loop.
    The works sit in the pipeline's pending list, so :meth:`Pipeline.flush` (labels, shutdown)
    judges them like any other.
    """

    def __init__(self, pipeline: Pipeline, max_samples: int) -> None:
        self.pipeline = pipeline
        self.max_samples = max_samples
        self._timer: asyncio.TimerHandle | None = None
        #: Calls that judged on the loop, and hand-overs to the background thread (the tests read them).
        self.calls = 0
        self.handed_over = 0

    def add(self, work: JudgeWork) -> None:
        if self.pipeline.judge_soon(work) > self.max_samples:
            self.handed_over += 1
            self.pipeline.wake()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.pipeline.linger_seconds, self._run)

    def _run(self) -> None:
        self._timer = None
        if self.pipeline.pending_samples() > self.max_samples:  # e.g. large requests' work queued meanwhile
            self.handed_over += 1
            self.pipeline.wake()
        elif self.pipeline.try_judge_pending():
            self.calls += 1
        else:  # the background thread is judging: look again after another linger period
            self._timer = asyncio.get_running_loop().call_later(self.pipeline.linger_seconds, self._run)

    def close(self) -> None:
        """Cancel the pending call (what is queued stays pending for :meth:`Pipeline.flush`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
