"""Work done once per test run however many pytest-xdist workers run it: the fitted MNIST bundle, the
demo. The first worker to ask makes it under a file lock in the run's shared temporary directory; the
others wait on the lock and read what it wrote. Without xdist it is made once per session, as before.

What is made must be read-only for the tests that share it (they copy what they change).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


def run_root(factory: pytest.TempPathFactory) -> Path:
    """The directory every process of this run shares: under xdist the parent of the worker's
    ``basetemp`` (``.../pytest-N/popen-gwK``); otherwise the session's own ``basetemp``."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if need be), released when the block ends or the
    process dies: a worker that crashes while holding it does not block the others."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def once_per_run(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """``make(directory)``'s result (a JSON-able mapping), computed once per run in ``<run>/name``.

    A failed ``make`` leaves nothing behind: the next worker to ask tries again (and fails the same way,
    with its own traceback)."""
    root = run_root(factory)
    directory = root / name
    done = root / f"{name}.done.json"
    with file_lock(root / f"{name}.lock"):
        if done.exists():
            result: dict[str, Any] = json.loads(done.read_text(encoding="utf-8"))
            return result
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        try:
            result = make(directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        done.write_text(json.dumps(result), encoding="utf-8")
        return result
