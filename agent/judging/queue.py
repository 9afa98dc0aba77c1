"""The judge queue: predictions waiting to be judged and recorded, and the background thread that
does it for many requests at once.

Judging and recording cost mostly per call, not per prediction, so works are *combined*: whoever takes
the judging lock next (the background thread, the event loop's
:class:`~agent.judging.loop.LoopRecorder`, a request that must be recorded before its answer) judges
and records everything pending in one :meth:`Recorder.record` call.

The background thread *lingers* (:class:`~agent.judging.linger.LingerLoop`): once work arrives it waits
up to ``linger_seconds`` (or until ``linger_samples`` predictions, or ``linger_bytes`` of their features and
inputs, wait) and records everything in one call, so that a stream of small requests costs one oracle call,
one window update and one wake-up per linger period instead of one per request (each wake-up also contends
with the request threads for the GIL). The bytes bound keeps what waits small for large inputs (images), the
count bound lets small ones (tables) share a call: a call's fixed costs (the oracle's, the window sums') are
most of a small model's recording.
Predictions are recorded at most ``linger_seconds`` late; windows have buckets of a second or more. At most
``deferred_limit`` works wait; beyond that, the submitting thread records them itself.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from agent.core.held_requests import HeldRequests
from agent.judging.linger import LingerLoop
from agent.judging.recorder import Recorder
from agent.judging.verdicts import JudgeWork


class JudgeQueue:
    """Works waiting to be judged and recorded (thread-safe); see the module docstring."""

    def __init__(
        self,
        recorder: Recorder,
        deferred_limit: int = 256,
        linger_seconds: float = 0.05,
        linger_samples: int = 4096,
        linger_bytes: int = 16 << 20,
    ) -> None:
        self.recorder = recorder
        self.deferred_limit = deferred_limit
        self.linger_samples = linger_samples
        self.linger_bytes = linger_bytes
        self._pending: list[JudgeWork] = []
        self._pending_samples = 0  # predictions queued since the last take
        self._pending_bytes = 0  # their features' and inputs' bytes
        #: request ids of the works queued or being recorded (a label may wait for them: :meth:`holds`)
        self._unrecorded = HeldRequests()
        self._hurry = False  # somebody waits: record without lingering
        self._pending_lock = threading.Lock()
        self._wakeup = threading.Condition(self._pending_lock)
        self._judge_lock = threading.Lock()
        self._loop = LingerLoop(
            self._wakeup,
            "icos-judge",
            linger_seconds,
            pending=lambda: bool(self._pending),
            enough=self._enough_pending,
            work=self.flush,
        )

    # -- adding work ----------------------------------------------------------------------------
    def record_now(self, works: Sequence[JudgeWork]) -> None:
        """Judge and record ``works`` now, together with whatever else is pending; returns once they
        are recorded (each with its ``verdicts`` or its ``error``; nothing is raised)."""
        with self._pending_lock:
            self._queue(works)
        self._record_until_done(works)

    def submit(self, work: JudgeWork) -> None:
        """Queue a work for the background thread (recorded here when the queue is full or no thread runs)."""
        with self._wakeup:
            self._queue((work,))
            if self._loop.running and len(self._pending) <= self.deferred_limit:
                if self._loop.idle or self._enough_pending():
                    self._loop.notify()
                return
        self._record_until_done([work])

    def hold(self, work: JudgeWork) -> int:
        """Queue a work *without* waking the background thread: the caller records it soon
        (:meth:`try_record_pending`) or wakes the thread (:meth:`wake`). Returns the predictions now
        pending. :meth:`flush` records it like any pending work."""
        with self._pending_lock:
            self._queue((work,))
            return self._pending_samples

    # -- state ----------------------------------------------------------------------------------
    @property
    def linger_seconds(self) -> float:
        """How long the background thread waits for more once work arrived, and the event loop between its
        recording calls (:class:`~agent.judging.loop.LoopRecorder`); set here, both read the new value at once."""
        return self._loop.linger_seconds

    @linger_seconds.setter
    def linger_seconds(self, value: float) -> None:
        self._loop.linger_seconds = value

    def pending_samples(self) -> int:
        """Predictions queued and not yet taken by a recording call."""
        with self._pending_lock:
            return self._pending_samples

    def holds(self, request_id: str) -> bool:
        """Whether a work of ``request_id`` is queued or being recorded (not yet handed to the sinks)."""
        with self._pending_lock:
            return self._unrecorded.holds(request_id)

    def held_ids(self) -> list[str]:
        """The request ids of every work queued or being recorded now."""
        with self._pending_lock:
            return self._unrecorded.ids()

    def busy(self) -> bool:
        """Whether a recording call is running now (a caller that must not wait can go elsewhere)."""
        return self._judge_lock.locked()

    @property
    def idle(self) -> bool:
        """Whether the background thread waits for work."""
        return self._loop.idle

    # -- recording ------------------------------------------------------------------------------
    def try_record_pending(self) -> bool:
        """Record everything pending now, unless a recording call is running (then False, at once)."""
        if not self._judge_lock.acquire(blocking=False):
            return False
        try:
            self._record(self._take())
        finally:
            self._judge_lock.release()
        return True

    def wake(self, hurry: bool = False) -> None:
        """Have the background thread record what is pending (recorded here without that thread);
        ``hurry``: without lingering first (somebody waits for it)."""
        with self._wakeup:
            if self._loop.running:
                self._hurry = self._hurry or hurry
                self._loop.notify()
                return
        self.flush()

    def flush(self) -> None:
        """Record everything pending now."""
        with self._judge_lock:
            self._record(self._take())

    def start(self) -> None:
        """Start the background thread."""
        self._loop.start()

    def stop(self) -> None:
        """Stop the background thread and record what is still pending."""
        self._loop.stop(timeout=60)
        self.flush()

    # -- internals ------------------------------------------------------------------------------
    def _take(self) -> list[JudgeWork]:
        with self._pending_lock:
            batch, self._pending = self._pending, []
            self._pending_samples = 0
            self._pending_bytes = 0
            self._hurry = False
        return batch

    def _queue(self, works: Sequence[JudgeWork]) -> None:
        """Add works to the pending ones, their predictions and bytes to the counts the lingering reads, and their
        request ids to the unrecorded ones (called holding the pending lock)."""
        self._pending.extend(works)
        self._pending_samples += sum(w.n for w in works)
        self._pending_bytes += sum(w.nbytes for w in works)
        for w in works:
            if w.request_id is not None:
                self._unrecorded.add(w.request_id)

    def _record(self, batch: list[JudgeWork]) -> None:
        """Record ``batch`` (called holding the judging lock); its request ids are then no longer held."""
        try:
            self.recorder.record(batch)
        finally:
            with self._pending_lock:
                for w in batch:
                    if w.request_id is not None:
                        self._unrecorded.release(w.request_id)

    def _record_until_done(self, works: Sequence[JudgeWork]) -> None:
        """Record everything pending, unless another thread already recorded these works meanwhile."""
        with self._judge_lock:
            if not all(w.done for w in works):
                self._record(self._take())

    def _enough_pending(self) -> bool:
        """Whether the background thread should stop lingering (called holding the pending lock)."""
        return (
            self._hurry
            or self._pending_samples >= self.linger_samples
            or self._pending_bytes >= self.linger_bytes
            or 2 * len(self._pending) >= self.deferred_limit
        )
