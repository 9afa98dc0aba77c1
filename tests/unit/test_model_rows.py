"""The served model runs at most one full batch's rows at once: larger runs wait their turn in arrival order,
a request of a few rows neither waits nor counts, and a cancelled waiter leaves nothing behind."""

from __future__ import annotations

import asyncio

import pytest

from agent.dataplane.model_rows import SMALL_SHARE, ModelRows


def test_rows_beyond_one_batch_wait_their_turn_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        gate = ModelRows()
        order: list[str] = []
        first = await gate.take(800, 1024)
        assert first == 800 and gate.held == 800

        async def run(name: str, rows: int) -> None:
            taken = await gate.take(rows, 1024)
            order.append(name)
            await asyncio.sleep(0)
            gate.give(taken)

        waiting = [asyncio.create_task(run("whole", 4096)), asyncio.create_task(run("half", 512))]
        for _ in range(5):
            await asyncio.sleep(0)
        assert order == [] and gate.held == 800  # neither fits beside the first run
        gate.give(first)
        await asyncio.gather(*waiting)
        assert gate.held == 0
        return order

    assert asyncio.run(scenario()) == ["whole", "half"]  # the larger came first: no overtaking


def test_a_few_rows_neither_wait_nor_count() -> None:
    async def scenario() -> None:
        gate = ModelRows()
        big = await gate.take(1024, 1024)
        small = await asyncio.wait_for(gate.take(1024 // SMALL_SHARE, 1024), 1.0)
        assert small == 0 and gate.held == 1024
        gate.give(small)
        gate.give(big)
        assert gate.held == 0

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_no_rows_taken() -> None:
    async def scenario() -> None:
        gate = ModelRows()
        first = await gate.take(1024, 1024)
        waiter = asyncio.create_task(gate.take(600, 1024))
        after = asyncio.create_task(gate.take(600, 1024))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        gate.give(first)
        assert await after == 600 and gate.held == 600
        gate.give(600)
        assert gate.held == 0

    asyncio.run(scenario())
