"""Ending the background tasks a part of the agent started, the one way every part stops them."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_all(tasks: list[asyncio.Task[Any]] | set[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks``, wait for each to end and empty the collection. What a task raises while it ends is
    dropped: a stopping agent has nobody left to tell, and one task's failure must not keep the others running."""
    pending = list(tasks)
    for t in pending:
        t.cancel()
    for t in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
    tasks.clear()
