"""A periodic step survives a failing step; ending a component's tasks cancels and awaits them all."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent.core.tasks import cancel_all, every


def test_every_logs_a_failing_step_and_keeps_going(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    async def step() -> None:
        calls.append(len(calls))
        if len(calls) == 2:
            raise ValueError("broken once")

    async def main() -> None:
        task = asyncio.create_task(every(0.001, step, logging.getLogger("test.tasks"), "the step failed"))
        while len(calls) < 4:
            await asyncio.sleep(0.001)
        await cancel_all([task])
        assert task.cancelled()

    with caplog.at_level(logging.ERROR, logger="test.tasks"):
        asyncio.run(main())
    failed = [r for r in caplog.records if r.getMessage() == "the step failed"]
    assert len(failed) == 1 and vars(failed[0])["error"] == "ValueError: broken once"


def test_cancel_all_ends_running_and_failed_tasks_and_empties_the_list() -> None:
    async def forever() -> None:
        await asyncio.sleep(3600)

    async def fails() -> None:
        raise RuntimeError("failed before stop")

    async def main() -> None:
        tasks = [asyncio.create_task(forever()), asyncio.create_task(fails())]
        await asyncio.sleep(0)
        ended = list(tasks)
        await cancel_all(tasks)
        assert tasks == []
        assert ended[0].cancelled() and isinstance(ended[1].exception(), RuntimeError)

    asyncio.run(main())
