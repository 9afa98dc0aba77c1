"""The asyncio tasks a component runs in the background: a periodic step, and ending them all.

A periodic step (a readiness check, a look at the windows) runs until cancelled, and a step that fails is
logged without ending the loop: a bug in one step must not freeze what the loop keeps up to date. A
component that starts background tasks (workers, periodic loops) ends them all on stop the same way:
cancel every one first, then wait for each, so that the tasks wind down together and a task that failed
earlier does not stop the others from being awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any


async def every(seconds: float, step: Callable[[], Awaitable[object]], log: logging.Logger, failed: str) -> None:
    """Await ``step`` every ``seconds`` until cancelled; a step that raises is logged as ``failed``, with the
    error, and the next one comes as usual."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await step()
        except Exception as exc:
            log.exception(failed, extra={"error": f"{type(exc).__name__}: {exc}"})


async def cancel_all(tasks: list[asyncio.Task[Any]] | set[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks``, wait for each to end (its cancellation or earlier failure swallowed), and empty the
    list or set."""
    for t in list(tasks):
        t.cancel()
    for t in list(tasks):
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
    tasks.clear()
