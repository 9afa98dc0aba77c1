"""Names for the agent's threads at the operating-system level.

Python names its threads only for itself; ``top -H``, ``ps -L``, ``py-spy`` and
``/proc/<pid>/task/<tid>/comm`` show every thread of the agent as ``python``. The agent's own
threads call :func:`name_os_thread` when they start, so an operator (and ``bench/serving/__main__.py``,
which splits the agent's CPU time by thread) can tell the background judge (``icos-judge``), the
prediction-store writer (``icos-store``) and the worker threads that run the model
(``icos-worker``) from the event loop (the main thread). Linux only (``prctl(PR_SET_NAME)``, at most
15 bytes); elsewhere, or if the call fails, nothing happens.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable

_PR_SET_NAME = 15
_MAX_BYTES = 15
_local = threading.local()


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return fn


_PRCTL = _prctl()


def name_os_thread(name: str) -> bool:
    """Give the calling thread ``name`` (cut to 15 bytes) at the OS level; whether it worked."""
    if _PRCTL is None:
        return False
    raw = name.encode("utf-8", "replace")[:_MAX_BYTES]
    ok = _PRCTL(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0
    if ok:
        _local.name = name
    return bool(ok)


def name_os_thread_once(name: str) -> None:
    """:func:`name_os_thread` unless the calling thread already has ``name`` (pooled threads: one
    attribute read per call after the first)."""
    if getattr(_local, "name", None) != name:
        name_os_thread(name)
