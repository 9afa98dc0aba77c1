"""Servers the tests start as child processes: stopping them within bounded time, reading their logs."""

from __future__ import annotations

import subprocess
from pathlib import Path


def stop_process(proc: subprocess.Popen[bytes] | None, grace: float = 20.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; nothing for a process already gone (or None)."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def read_log(path: Path) -> str:
    """The whole log at ``path`` ('' before the server wrote one)."""
    return path.read_text(errors="replace") if path.exists() else ""
