"""Ending the asyncio tasks a component started.

A component that starts background tasks (workers, periodic loops) ends them all on stop the same way:
cancel every one first, then wait for each, so that the tasks wind down together and a task that failed
earlier does not stop the others from being awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks``, wait for each to end (its cancellation or earlier failure swallowed), and empty the list."""
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
    tasks.clear()
