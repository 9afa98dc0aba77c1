"""Memory that comes back after a burst of large requests.

Two things keep a serving process's memory high after its large requests are answered:

* glibc's allocator raises its mmap threshold each time it frees a large mmapped block, so that after
  one 30 MB request later ones come from the heap arenas, which keep their pages after ``free``.
  :func:`configure_allocator` fixes the threshold at :data:`MMAP_THRESHOLD` (which also stops the
  dynamic adjustment): every block that large is mapped on its own and unmapped when freed.
* An exception answered to a client keeps, through its traceback, the frames of the request and their
  buffers alive until the cyclic garbage collector runs: tens of MB per refused large request.

:func:`release` runs the collector and hands the heap's free pages back (``malloc_trim``); the server
calls it, off the event loop, when the bytes of requests in flight fall back to zero after a burst
(:class:`agent.server.body_budget.BodyBudget`). On a C library other than glibc both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("icos_agent.memory")

#: Blocks of at least this many bytes are mapped on their own (and returned when freed).
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers (malloc.h)

_libc: ctypes.CDLL | None = None


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name or "libc.so.6")
            lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            lib.malloc_trim.argtypes = [ctypes.c_size_t]
            _libc = lib
        except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
            return None
    return _libc


def configure_allocator() -> bool:
    """Fix glibc's mmap threshold (see the module docstring); False where that is not possible."""
    lib = _glibc()
    if lib is None:
        return False
    ok = bool(lib.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    if not ok:
        log.debug("mallopt refused the mmap threshold")
    return ok


def release() -> None:
    """Collect cyclic garbage and hand the heap's free pages back to the system."""
    gc.collect()
    lib = _glibc()
    if lib is not None:
        lib.malloc_trim(0)
