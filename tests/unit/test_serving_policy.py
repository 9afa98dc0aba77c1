"""The serving policy (agent/dataplane/policy.py): which stages of a request run on the event loop and
which in a worker thread, for small, large and binary requests in serve and proxy mode; and how the
measured CPU cost of small requests moves them off the loop and back."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.dataplane.policy import (
    COST_SAMPLE_EVERY,
    INLINE_BUDGET_SECONDS,
    INLINE_MAX_BYTES,
    LOOP_DECODE_MAX_BYTES,
    BatchedRecording,
    Placement,
    ServingPolicy,
)
from agent.judging.loop import LoopRecorder, VerdictBatcher
from agent.judging.queue import JudgeQueue
from agent.judging.recorder import Recorder
from agent.judging.verdicts import JudgeWork
from agent.judging.windows import WindowSet
from exporters.prometheus import AgentMetrics

KiB, MiB = 1024, 1024 * 1024
#: CPU seconds a "costly" stage burns: far over the inline budget.
COSTLY = 20 * INLINE_BUDGET_SECONDS


async def in_worker(fn: Any, *args: Any) -> Any:
    """The server's worker threads (here asyncio's default executor)."""
    return await asyncio.to_thread(fn, *args)


def policy(has_model: bool = True) -> ServingPolicy:
    queue = JudgeQueue(Recorder(WindowSet({"5m": 300.0}, 100), AgentMetrics(CollectorRegistry())))
    recording = BatchedRecording(VerdictBatcher(in_worker), LoopRecorder(queue), queue)
    return ServingPolicy(in_worker, recording, has_model=has_model)


def stages(p: Placement) -> tuple[str, str]:
    """Where the stages other than the model run, and where the model runs: ``loop`` or ``thread``."""
    return ("loop" if p.on_loop else "thread", "loop" if p.inline else "thread")


def burn(seconds: float) -> str:
    """Spend ``seconds`` of this thread's CPU time; the thread's name."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    return threading.current_thread().name


@pytest.mark.parametrize(
    ("size", "binary", "where"),
    [
        (100, False, ("loop", "loop")),  # small JSON: everything on the loop
        (INLINE_MAX_BYTES, True, ("loop", "loop")),  # small binary, at the bound
        (INLINE_MAX_BYTES + 1, True, ("loop", "thread")),  # larger binary: decoded on the loop, model in a thread
        (LOOP_DECODE_MAX_BYTES, True, ("loop", "thread")),
        (LOOP_DECODE_MAX_BYTES + 1, True, ("thread", "thread")),  # huge binary: every stage in the threads
        (INLINE_MAX_BYTES + 1, False, ("thread", "thread")),  # larger JSON: parsing costs too much for the loop
    ],
)
def test_serve_mode_places_by_size_and_encoding(size: int, binary: bool, where: tuple[str, str]) -> None:
    assert stages(policy().place(size, binary)) == where


@pytest.mark.parametrize(
    ("size", "binary", "where"),
    [
        (100, True, ("loop", "loop")),  # small binary: forwarded from the loop
        (100, False, ("thread", "thread")),  # JSON costs milliseconds to parse: threads
        (INLINE_MAX_BYTES + 1, True, ("thread", "thread")),
        (10 * MiB, False, ("thread", "thread")),
    ],
)
def test_proxy_mode_keeps_only_small_binary_requests_on_the_loop(
    size: int, binary: bool, where: tuple[str, str]
) -> None:
    p = policy(has_model=False).place(size, binary)
    assert stages(p) == where and not p.measure


def test_one_small_request_in_eight_is_measured_and_large_ones_never() -> None:
    pol = policy()
    measured = [pol.place(100, False).measure for _ in range(3 * COST_SAMPLE_EVERY)]
    assert measured == ([True] + [False] * (COST_SAMPLE_EVERY - 1)) * 3
    assert not any(pol.place(2 * MiB, True).measure for _ in range(2 * COST_SAMPLE_EVERY))


def test_stages_run_where_they_are_placed() -> None:
    async def scenario() -> dict[str, tuple[str, str]]:
        loop_thread = threading.current_thread().name
        pol, out = policy(), {}
        for name, size, binary in (("small", 100, False), ("binary", 2 * MiB, True), ("large", 2 * MiB, False)):
            async with pol.place(size, binary) as p:
                stage, model = await p.run(burn, 0.0), await p.run_model(burn, 0.0)
            out[name] = ("loop" if stage == loop_thread else "thread", "loop" if model == loop_thread else "thread")
        return out

    assert asyncio.run(scenario()) == {
        "small": ("loop", "loop"),
        "binary": ("loop", "thread"),
        "large": ("thread", "thread"),
    }


def test_costly_small_requests_leave_the_loop_and_cheap_ones_bring_them_back() -> None:
    """The measured CPU cost of a small request (stages on the loop and the model in its thread alike)
    feeds a moving average: over the budget, small requests run their model in a thread; once cheap
    requests bring it under again, they run on the loop again."""
    pol = policy()

    async def one(cost: float) -> Placement:
        async with pol.place(100, False) as p:
            await p.run(burn, cost / 2)
            await p.run_model(burn, cost / 2)
        return p

    async def scenario() -> None:
        first = await one(COSTLY)  # measured (the first of eight), on the loop
        assert first.measure and first.inline and first.cost >= COSTLY
        assert pol.inline_cost > INLINE_BUDGET_SECONDS
        costly = pol.place(100, False)
        assert (costly.inline, costly.model_in_thread) == (False, True)
        for _ in range(20 * COST_SAMPLE_EVERY):  # cheap requests; one in eight measured
            if pol.inline_cost < INLINE_BUDGET_SECONDS:
                break
            await one(0.0)
        assert pol.inline_cost < INLINE_BUDGET_SECONDS
        assert pol.place(100, False).inline

    asyncio.run(scenario())


def test_the_verdicts_a_request_waits_for_are_not_counted_in_its_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle judges a loop turn's verdicts on the loop wherever each request's model ran, so its time does not
    decide where a model runs: a costly oracle call leaves a cheap request on the loop. Counted, it sent a table
    model's requests that asked for verdicts to run their model in a thread, which cost more CPU on the loop and off
    it than running it there."""
    import agent.judging.loop as loop_module

    def costly_oracle(works: list[JudgeWork]) -> None:
        burn(COSTLY)
        for w in works:
            w.verdicts = np.zeros(w.n, dtype=np.int8)

    monkeypatch.setattr(loop_module, "judge", costly_oracle)
    pol = policy()
    rows = np.zeros((2, 3), np.float32)
    work = JudgeWork(None, rows, np.full((2, 2), 0.5, np.float32), np.zeros(2, np.int64), None, None)  # type: ignore[arg-type]

    async def scenario() -> None:
        async with Placement(pol, True, False, True) as p:
            await pol.recording.judge(work, True, p)
        assert work.verdicts is not None and p.cost < INLINE_BUDGET_SECONDS
        assert pol.inline_cost < INLINE_BUDGET_SECONDS and pol.place(100, False).inline

    asyncio.run(scenario())


def test_the_average_moves_a_fifth_of_the_way_to_each_measured_cost() -> None:
    pol = policy()
    pol.learn(0.01)
    assert pol.inline_cost == pytest.approx(0.002)
    pol.learn(0.0)
    assert pol.inline_cost == pytest.approx(0.0016)
    assert not pol.place(100, False).inline  # 1.6 ms: over the 1 ms budget
