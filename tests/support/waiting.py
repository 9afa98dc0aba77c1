"""Bounded waits. Tests wait for a condition (polled, with a deadline) or an event, never a fixed sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; whether it became true."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def poll(
    fn: Callable[[], T],
    timeout: float = 60.0,
    interval: float = 0.5,
    what: str = "condition",
    explain: Callable[[], object] | None = None,
) -> T:
    """Call ``fn`` until it returns something truthy and return that; AssertionError naming ``what``
    and the last value (and ``explain()``, e.g. the server's view) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = fn()
    while not last:
        if time.monotonic() > deadline:
            extra = f"; {explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}{extra}")
        time.sleep(interval)
        last = fn()
    return last


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """Whether ``GET url`` answers 200 now."""
    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def wait_http_ready(url: str, timeout: float = 20.0) -> None:
    """Poll ``GET url`` until it answers 200 (servers started as subprocesses); TimeoutError after ``timeout``."""
    if not wait_until(lambda: http_ok(url), timeout, 0.05):
        raise TimeoutError(f"{url} not ready within {timeout} s")


def on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], T], timeout: float = 10.0) -> T:
    """Run ``fn()`` on ``loop`` (the agent's event loop, from the test's thread) and return its result
    once it has run: what ``fn`` changed is in place for whatever the test does next."""

    async def call() -> T:
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout)


def await_on_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Await ``coro`` on ``loop`` (e.g. ``queue.join()``: everything queued has been handled) and return its result."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)
