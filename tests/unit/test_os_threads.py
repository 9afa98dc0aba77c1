"""OS-level thread names (``agent.core.os_threads``): what ``top -H`` and ``/proc/<pid>/task/*/comm`` show."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agent.core.os_threads import name_os_thread, name_os_thread_once

pytestmark = pytest.mark.needs("linux")


def _comm_in_thread(action: object) -> str:
    out: list[str] = []

    def run() -> None:
        action()  # type: ignore[operator]
        out.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]


def test_a_thread_gets_its_name_at_the_os_level() -> None:
    assert _comm_in_thread(lambda: name_os_thread("icos-test")) == "icos-test"


def test_long_names_are_cut_to_15_bytes() -> None:
    assert _comm_in_thread(lambda: name_os_thread("icos-a-very-long-thread-name")) == "icos-a-very-lon"


def test_name_once_renames_a_pooled_thread_for_a_new_name() -> None:
    def twice() -> None:
        name_os_thread_once("icos-first")
        name_os_thread_once("icos-second")

    assert _comm_in_thread(twice) == "icos-second"
