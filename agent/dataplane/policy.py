"""Where a request's work runs and how its predictions are recorded: the serving policy, built once
from the settings (:func:`serving_policy`).

**Placement.** A hop to a worker thread and back costs 50–100 µs, as much as a small CNN's whole
inference, so a serve-mode request runs wholly on the event loop while it is small (≤
:data:`INLINE_MAX_BYTES`) and the recent cost of small requests (a moving average of CPU time,
measured on one in :data:`COST_SAMPLE_EVERY`) stays under :data:`INLINE_BUDGET_SECONDS`; the loop is
then blocked for less than that. A costlier small request, or a binary one up to
:data:`LOOP_DECODE_MAX_BYTES`, runs only its model in a worker thread (onnxruntime releases the GIL):
threads that also decoded and encoded would queue for the GIL behind each other and behind the loop.
Anything larger runs every stage in the threads. Proxy mode has no model: small binary requests stay
on the loop, others (JSON costs milliseconds to parse) go to the threads. Costs are CPU times, so time
spent waiting for the GIL behind other threads does not keep small requests off the loop.

**Recording.** ``labels.durability: batched`` (:class:`BatchedRecording`): a request that asked for
``icos_verdict`` waits for its verdicts only (the :class:`VerdictBatcher` judges the requests of one
loop turn together, on the loop wherever their models ran: its cost is not counted in a request's, which
decides only where the model runs); recording — windows, metrics, the prediction store — happens later, for many
requests at once (on the loop for requests that ran there, :class:`LoopRecorder`; else in the
background thread, :class:`JudgeQueue`). ``commit`` (:class:`CommitRecording`): every request is
judged and recorded before its answer, which waits until the prediction store has committed it.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Protocol

from agent.judging.loop import LoopRecorder, VerdictBatcher
from agent.judging.queue import JudgeQueue
from agent.judging.verdicts import JudgeWork

INLINE_MAX_BYTES = 64 * 1024
INLINE_BUDGET_SECONDS = 0.001
LOOP_DECODE_MAX_BYTES = 4 * 1024 * 1024
COST_SAMPLE_EVERY = 8
COST_WEIGHT = 0.2

#: Runs ``fn(*args)`` in a worker thread (the server's bounded pool).
RunInThread = Callable[..., Awaitable[Any]]
#: Awaited with a request id under commit durability: returns once its predictions are committed.
Acknowledge = Callable[[str], Awaitable[None]]


class Placement:
    """Where the stages of one request run, decided when it arrives; an async context manager whose
    exit feeds the request's measured cost back to the policy."""

    __slots__ = ("_policy", "inline", "model_in_thread", "measure", "cost")

    def __init__(self, policy: ServingPolicy, inline: bool, model_in_thread: bool, measure: bool) -> None:
        self._policy = policy
        #: Every stage on the event loop.
        self.inline = inline
        #: Only the model in a worker thread (the other stages on the loop); with neither flag, every
        #: stage runs in the threads.
        self.model_in_thread = model_in_thread
        self.measure = measure
        #: CPU seconds measured so far (when ``measure``).
        self.cost = 0.0

    @property
    def on_loop(self) -> bool:
        """Whether the stages other than the model run on the event loop."""
        return self.inline or self.model_in_thread

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A stage other than the model: on the loop, or in a worker thread."""
        if kwargs:
            fn = functools.partial(fn, **kwargs)
        if not self.on_loop:
            return await self._policy.run_in_thread(fn, *args)
        if not self.measure:
            return fn(*args)
        t0 = time.thread_time()
        try:
            return fn(*args)
        finally:
            self.cost += time.thread_time() - t0

    async def run_model(self, fn: Callable[..., Any], *args: Any) -> Any:
        """The model: on the loop only when everything is, else in a worker thread (its CPU time
        measured there when ``measure``)."""
        if self.inline:
            return await self.run(fn, *args)
        if not self.measure:
            return await self._policy.run_in_thread(fn, *args)
        result, cost = await self._policy.run_in_thread(_with_thread_cost, fn, *args)
        self.cost += cost
        return result

    async def __aenter__(self) -> Placement:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.measure:
            self._policy.learn(self.cost)


def _with_thread_cost(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    t0 = time.thread_time()
    result = fn(*args)
    return result, time.thread_time() - t0


class Recording(Protocol):
    """How a request's predictions are judged and recorded (see the module docstring)."""

    async def judge(self, work: JudgeWork, verdicts_wanted: bool, place: Placement) -> None:
        """Give ``work`` its verdicts when they are wanted before the answer (raising its error) and
        have it recorded."""

    async def acknowledge(self, request_id: str) -> None:
        """Return once predictions queued elsewhere (observe mode) may be acknowledged."""


class BatchedRecording:
    """Verdicts when asked for; recording later, with other requests' predictions. With a judging
    ``sample_rate`` below 1, a request whose client did not ask for verdicts is judged with that
    probability (drawn from the agent's own random source) and otherwise only counted by ``skipped``."""

    def __init__(
        self,
        batcher: VerdictBatcher,
        loop_recorder: LoopRecorder,
        queue: JudgeQueue,
        sample_rate: float = 1.0,
        skipped: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self.batcher = batcher
        self.loop_recorder = loop_recorder
        self.queue = queue
        self.sample_rate = sample_rate
        self.skipped = skipped
        self._random = random.Random()  # OS entropy: no client can choose which requests are judged

    async def judge(self, work: JudgeWork, verdicts_wanted: bool, place: Placement) -> None:
        if not verdicts_wanted and self.sample_rate < 1.0 and self._random.random() >= self.sample_rate:
            self.skipped(work.n)
            return
        if verdicts_wanted:
            await self.batcher.judge(work)
            work.verdicts_or_raise()
        if place.inline:
            self.loop_recorder.add(work)
        else:
            self.queue.submit(work)

    async def acknowledge(self, request_id: str) -> None:
        return None  # answered at once: recorded within a linger period


class CommitRecording:
    """Judged and recorded before the answer, which waits for the prediction store's commit."""

    def __init__(self, queue: JudgeQueue, committed: Acknowledge) -> None:
        self.queue = queue
        self.committed = committed

    async def judge(self, work: JudgeWork, verdicts_wanted: bool, place: Placement) -> None:
        await place.run(self.queue.record_now, [work])
        work.verdicts_or_raise()
        assert work.request_id is not None
        await self.committed(work.request_id)

    async def acknowledge(self, request_id: str) -> None:
        await self.committed(request_id)


class ServingPolicy:
    """Placement and recording for one agent (see the module docstring)."""

    def __init__(self, run_in_thread: RunInThread, recording: Recording, *, has_model: bool) -> None:
        self.run_in_thread = run_in_thread
        self.recording = recording
        self.has_model = has_model
        #: Moving average of the CPU cost of small requests, measured on one request in
        #: :data:`COST_SAMPLE_EVERY` (``_tick`` counts them).
        self.inline_cost = 0.0
        self._tick = 0

    def place(self, size: int, binary: bool) -> Placement:
        """Where a request of ``size`` bytes (binary tensors or JSON) runs."""
        small = size <= INLINE_MAX_BYTES
        if not self.has_model:  # proxy mode: the upstream does the costly part
            return Placement(self, binary and small, False, False)
        measure = small and self._measure()
        if small and self.inline_cost < INLINE_BUDGET_SECONDS:
            return Placement(self, True, False, measure)
        if small or (binary and size <= LOOP_DECODE_MAX_BYTES):
            return Placement(self, False, True, measure)
        return Placement(self, False, False, False)

    def learn(self, cost: float) -> None:
        """Move the inline cost average toward a measured request's cost."""
        self.inline_cost += COST_WEIGHT * (cost - self.inline_cost)

    def _measure(self) -> bool:
        """One small request in :data:`COST_SAMPLE_EVERY` is measured: reading a thread's CPU clock is
        a system call (several µs in a virtual machine, a few times per request)."""
        self._tick = (self._tick + 1) % COST_SAMPLE_EVERY
        return self._tick == 1 or COST_SAMPLE_EVERY == 1
