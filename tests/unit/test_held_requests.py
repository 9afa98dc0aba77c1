"""HeldRequests: a request stays held until its last batch is released."""

from __future__ import annotations

from agent.core.held_requests import HeldRequests


def test_held_until_the_last_batch_is_released() -> None:
    held = HeldRequests()
    held.add("a")
    held.add("a")
    held.add("b")
    assert held.holds("a") and held.holds("b") and not held.holds("c")
    assert sorted(held.ids()) == ["a", "b"]
    assert held.release("a") is False
    assert held.holds("a")
    assert held.release("a") is True
    assert not held.holds("a")
    assert held.ids() == ["b"]


def test_releasing_an_unheld_request_leaves_nothing_behind() -> None:
    held = HeldRequests()
    assert held.release("x") is True
    assert not held.holds("x") and held.ids() == []
