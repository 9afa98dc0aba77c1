"""The budget of request bytes in flight: what counts as a burst (after which the heap is collected and
trimmed) is what requests really hold, not a gRPC call's reservation for a message not yet read."""

from __future__ import annotations

import pytest

from agent.server.body_budget import TRIM_AFTER_BYTES, BodyBudget, ServerBusy

MiB = 1 << 20


def _budget() -> tuple[BodyBudget, list[int]]:
    bursts: list[int] = []
    budget = BodyBudget(256 * MiB, on_idle_after_burst=lambda: bursts.append(1))
    return budget, bursts


def test_reservations_settled_small_are_no_burst() -> None:
    budget, bursts = _budget()
    reserve = 64 * MiB
    for _ in range(3):  # three calls reserving at once: 192 MiB held, little of it real
        budget.take(reserve, reservation=True)
    for _ in range(3):
        budget.settle(reserve, 2 * 4096)
    assert budget.held == 3 * 2 * 4096
    for _ in range(3):
        budget.give(2 * 4096)
    assert budget.held == 0 and bursts == []


def test_a_reservation_refused_before_reading_gives_back_without_a_burst() -> None:
    budget, bursts = _budget()
    budget.take(64 * MiB, reservation=True)
    budget.take(64 * MiB, reservation=True)
    budget.give(64 * MiB, reservation=True)
    budget.give(64 * MiB, reservation=True)
    assert budget.held == 0 and bursts == []


def test_large_messages_really_held_are_a_burst() -> None:
    budget, bursts = _budget()
    big = TRIM_AFTER_BYTES // 2 + MiB
    for _ in range(2):
        budget.take(2 * big, reservation=True)
    for _ in range(2):
        budget.settle(2 * big, 2 * big)  # each message and its parsed copy
    for _ in range(2):
        budget.give(2 * big)
    assert bursts == [1]


def test_http_bodies_count_as_before() -> None:
    budget, bursts = _budget()
    budget.take(TRIM_AFTER_BYTES)
    budget.take(MiB)
    budget.give(TRIM_AFTER_BYTES)
    assert bursts == []
    budget.give(MiB)
    assert bursts == [1]


def test_reservations_count_against_the_limit() -> None:
    budget, _ = _budget()
    for _ in range(4):
        budget.take(64 * MiB, reservation=True)
    with pytest.raises(ServerBusy):
        budget.take(1, reservation=True)
