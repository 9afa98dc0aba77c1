"""Ending background tasks (:func:`agent.core.tasks.cancel_all`): every task ends, whatever one raises while
ending, and the collection is emptied."""

from __future__ import annotations

import asyncio

from agent.core.tasks import cancel_all


async def _forever() -> None:
    await asyncio.sleep(3600)


async def _fails_when_cancelled() -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        raise RuntimeError("cleanup failed") from None


def test_every_task_ends_and_the_collection_empties() -> None:
    async def main() -> None:
        listed = [asyncio.create_task(_fails_when_cancelled()), asyncio.create_task(_forever())]
        kept = {asyncio.create_task(_forever())}
        await asyncio.sleep(0)
        ended = [*listed, *kept]
        await cancel_all(listed)
        await cancel_all(kept)
        assert listed == [] and kept == set()
        assert all(t.done() for t in ended)

    asyncio.run(main())
