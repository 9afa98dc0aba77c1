"""The serving benchmark's CPU split by thread (``bench/serving/__main__.py``): named threads of the
agent land in their own group, the main thread is the event loop, ended threads do not count."""

from __future__ import annotations

import os
import threading
import time

import pytest

from agent.core.os_threads import name_os_thread
from bench.serving.__main__ import thread_cpu_delta, thread_cpu_seconds
from tests.support.waiting import wait_until

pytestmark = pytest.mark.needs("linux")


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_cpu_of_a_named_thread_goes_to_its_group() -> None:
    started, release = threading.Event(), threading.Event()

    def judge() -> None:
        name_os_thread("icos-judge")
        started.set()
        release.wait()
        _burn(0.3)
        release.clear()
        release.wait()  # stay alive until the second snapshot

    t = threading.Thread(target=judge)
    t.start()
    started.wait()
    before = thread_cpu_seconds(os.getpid())
    release.set()
    assert wait_until(lambda: not release.is_set(), timeout=30)  # the thread burnt its CPU time
    after = thread_cpu_seconds(os.getpid())
    release.set()
    t.join()
    delta = thread_cpu_delta(before, after)
    assert delta["icos-judge"] >= 0.2, delta
    assert delta["icos-worker"] == 0.0 and delta["icos-store"] == 0.0


def test_a_thread_that_ended_is_not_counted_negative() -> None:
    burning = threading.Event()

    def burn() -> None:
        burning.set()
        _burn(0.2)

    t = threading.Thread(target=burn)
    t.start()
    assert burning.wait(timeout=30)
    before = thread_cpu_seconds(os.getpid())
    t.join()
    after = thread_cpu_seconds(os.getpid())
    delta = thread_cpu_delta(before, after)
    assert all(v >= 0 for v in delta.values()), delta


def test_cpu_lists_read_like_taskset() -> None:
    import argparse

    import pytest

    from bench.serving.__main__ import cpu_list

    assert cpu_list("0-3,6") == {0, 1, 2, 3, 6}
    assert cpu_list("1") == {1}
    for bad in ("", "a-b", "3-", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            cpu_list(bad)
