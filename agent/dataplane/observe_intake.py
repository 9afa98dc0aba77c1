"""Observe mode's way in: ``POST /v1/observe`` bodies (direct observations, KServe inference-logger
CloudEvents) decoded and paired (:mod:`agent.dataplane.observe`), queued, and judged by worker tasks
off the request path.

The queue is bounded (``observe.queue_size``): when it is full a request is refused with 429 rather
than dropped silently. Batches still queued at shutdown are saved in the state directory and judged
after the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from agent.config.settings import AgentSettings
from agent.core import logs
from agent.core.tasks import cancel_all
from agent.dataplane.observe import (
    REQUEST,
    EventPairer,
    MetadataBounds,
    ObserveItem,
    decode_observation,
    decode_request_event,
    decode_response_event,
    parse_cloudevent,
    size_of,
)
from agent.dataplane.policy import Recording, RunInThread
from agent.dataplane.runtimes import RuntimeHolder
from agent.errors import ClientError
from agent.judging.queue import JudgeQueue
from agent.judging.state import StateStore
from agent.judging.verdicts import JudgeWork
from exporters.prometheus import AgentMetrics

log = logs.get("app")


class ObserveIntake:
    """Decodes, pairs, queues and judges observed predictions (observe mode)."""

    def __init__(
        self,
        settings: AgentSettings,
        runtimes: RuntimeHolder,
        judge_queue: JudgeQueue,
        metrics: AgentMetrics,
        run_in_thread: RunInThread,
        recording: Recording,
    ) -> None:
        self.settings = settings
        self.runtimes = runtimes
        self.judge_queue = judge_queue
        self.metrics = metrics
        self.run = run_in_thread
        #: Under commit durability an observation is answered once its predictions are committed.
        self.recording = recording
        o = settings.observe
        self.bounds = MetadataBounds.of(settings)
        self.pairer = EventPairer(o.event_ttl_seconds, o.event_buffer, o.max_pending_bytes)
        self.queue: asyncio.Queue[ObserveItem] = asyncio.Queue(maxsize=o.queue_size)
        self._counted_unmatched = (0, 0, 0, 0)
        self._tasks: list[asyncio.Task[None]] = []
        self.accepting = True
        #: Workers judge only while this is set (cleared to hold judging, e.g. for maintenance).
        self.judging = asyncio.Event()
        self.judging.set()

    # -- the request ------------------------------------------------------------------------------
    async def observe(self, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
        """A ``POST /v1/observe`` body (headers lower-cased) → the ``202`` answer; raises the client's
        errors. The predictions of an observation (or a paired event) are ``<id>:<index>``."""
        rt = self.runtimes.current
        event = parse_cloudevent(headers, body)
        scores_output = self.settings.upstream.scores_output
        if event is None:
            item: ObserveItem = await self.run(decode_observation, rt, body, scores_output, self.bounds)
            self.enqueue(item)
            await self.recording.acknowledge(item.id)
            return {"id": item.id, "accepted": int(item.x.n)}
        self.metrics.observe_events.labels(event.kind).inc()
        if event.kind == REQUEST:
            value = await self.run(decode_request_event, rt, event.data, self.bounds)
        else:
            value = await self.run(decode_response_event, rt, event.data, scores_output)
        try:
            pair = self.pairer.add(event.id, event.kind, value, time.time(), size_of(value))
        finally:
            self.count_unmatched()
        if pair is None:
            return {"id": event.id, "paired": False}
        (x, meta), probs = pair
        if probs.shape[0] != x.n:
            raise ClientError(
                f"event {event.id}: {x.n} inputs but {probs.shape[0]} probability vectors",
                status=400,
                reason="shape_mismatch",
            )
        self.enqueue(ObserveItem(event.id, x, probs, meta, time.time()))
        await self.recording.acknowledge(event.id)
        return {"id": event.id, "paired": True, "accepted": int(x.n)}

    def enqueue(self, item: ObserveItem) -> None:
        if not self.accepting:
            raise ClientError(
                "the agent is shutting down; retry on another replica", status=503, reason="shutting_down"
            )
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.metrics.observe_rejected.inc()
            raise ClientError(
                f"observe queue is full ({self.queue.maxsize} batches); retry later",
                status=429,
                reason="queue_full",
                headers={"Retry-After": "1"},
            ) from None
        self.metrics.observe_queue_length.set(self.queue.qsize())

    def count_unmatched(self) -> None:
        p = self.pairer
        e0, v0, d0, o0 = self._counted_unmatched
        for reason, new, old in (
            ("expired", p.expired, e0),
            ("evicted", p.evicted, v0),
            ("duplicate", p.duplicates, d0),
            ("overflow", p.overflow, o0),
        ):
            if new > old:
                self.metrics.observe_unmatched.labels(reason).inc(new - old)
        self._counted_unmatched = (p.expired, p.evicted, p.duplicates, p.overflow)

    # -- judging ----------------------------------------------------------------------------------
    def judge_item(self, item: ObserveItem) -> None:
        """Judge and record one observed batch now (in a worker thread)."""
        rt = self.runtimes.current
        probs = item.probabilities
        work = JudgeWork(
            rt, rt.features(item.x), probs, rt.predicted_classes(probs), item.metadata, None, item.id, inputs=item.x
        )
        self.judge_queue.record_now([work])
        work.verdicts_or_raise()

    async def _worker(self) -> None:
        while True:
            await self.judging.wait()
            item = await self.queue.get()
            try:
                await self.run(self.judge_item, item)
            except Exception:
                log.exception("judging an observed batch failed", extra={"id": item.id})
            finally:
                self.queue.task_done()
                self.metrics.observe_queue_length.set(self.queue.qsize())

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.settings.observe.event_ttl_seconds / 4))
            self.pairer.expire(time.time())
            self.count_unmatched()

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self, store: StateStore | None) -> None:
        """Take the batches a previous run saved, then start the workers."""
        size = self.settings.observe.queue_size
        if store is not None:
            restored = store.take_pending(lambda _kind, a, m: ObserveItem.from_arrays(a, m), size)
            for item in restored:  # at most the queue's size taken: the rest stays for the next start
                self.queue.put_nowait(item)
            if self.queue.qsize():
                log.info(
                    "restored pending observed batches",
                    extra={"batches": self.queue.qsize(), "left_for_next_start": store.count_pending()},
                )
        for _ in range(self.settings.observe.workers):
            self._tasks.append(asyncio.create_task(self._worker()))
        self._tasks.append(asyncio.create_task(self._expiry_loop()))

    async def stop(self, store: StateStore | None) -> None:
        """Refuse new batches, judge the queued ones for up to the graceful timeout, and save what is
        left in ``store``."""
        self.accepting = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.queue.join(), timeout=self.settings.server.graceful_timeout_seconds)
        await cancel_all(self._tasks)
        if store is None:
            return
        left = 0
        while not self.queue.empty():
            item = self.queue.get_nowait()
            arrays, meta = item.to_arrays()
            try:
                store.add_pending("observe", arrays, meta)
            except Exception as exc:
                self.metrics.state_write(False, time.time())
                log.error("an observed batch could not be saved", extra={"id": item.id, "error": str(exc)})
                continue
            left += 1
        if left:
            log.info("saved pending observed batches", extra={"batches": left})
