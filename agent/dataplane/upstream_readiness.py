"""Proxy mode's readiness follows its upstream's: a pod whose model server cannot answer must leave the
Service, not keep answering 502.

:class:`UpstreamReadiness` asks the upstream every ``upstream.ready_interval_seconds`` whether its model
is ready (one bounded check, :meth:`~agent.dataplane.upstream.UpstreamClient.model_ready`), in a task of
the agent's event loop, and keeps the answer: ``/v2/health/ready`` and gRPC ``ServerReady``/``ModelReady``
read the cached answer, never call the upstream themselves (a probe must not wait on the upstream). A
change is logged once (``upstream not ready``, ``upstream ready again``), the current readiness and the
time spent unready are metrics (:class:`exporters.upstream_metrics.UpstreamMetrics`), and each return to
ready runs ``on_ready`` (the upstream's metadata is read again: a restarted upstream may serve another
version).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from agent.core import logs
from agent.core.tasks import every
from exporters.upstream_metrics import UpstreamMetrics

log = logs.get("proxy")

#: One check: ``None`` when the upstream's model is ready, else why not.
Check = Callable[[], Awaitable[str | None]]


class UpstreamReadiness:
    """The upstream's readiness, checked in the background and cached."""

    def __init__(
        self,
        check: Check,
        interval_seconds: float,
        metrics: UpstreamMetrics,
        on_ready: Callable[[], Awaitable[object]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.check = check
        self.interval = interval_seconds
        self.metrics = metrics
        self.on_ready = on_ready
        self.clock = clock
        #: Why the upstream is not ready (``None``: it is); "not checked yet" until the first check.
        self.reason: str | None = "not checked yet"
        self._checked_at: float | None = None
        self._unready_since: float | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self.reason is None

    async def check_now(self) -> bool:
        """Check once, record the answer (metrics, a log line on a change) and return it."""
        reason = await self.check()
        now = self.clock()
        unready = now - self._checked_at if self._checked_at is not None and not self.ready else 0.0
        self.metrics.observe(reason is None, unready)
        was_ready, first = self.ready, self._checked_at is None
        self.reason, self._checked_at = reason, now
        if reason is not None and (was_ready or first):
            self._unready_since = now
            log.warning("upstream not ready: the agent answers not ready until it is", extra={"reason": reason})
        elif reason is None and not was_ready:
            if not first:
                since = self._unready_since if self._unready_since is not None else now
                log.info("upstream ready again", extra={"unready_seconds": round(now - since, 3)})
            self._unready_since = None
            if self.on_ready is not None:
                await self.on_ready()
        return reason is None

    async def start(self) -> None:
        """The first check now (bounded by the check's own timeout), then one every interval."""
        await self.check_now()
        # a bug in a check must not end the checks (and freeze readiness)
        checks = every(self.interval, self.check_now, log, "upstream readiness check failed")
        self._task = asyncio.create_task(checks, name="icos-upstream-readiness")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
