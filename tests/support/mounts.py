"""Small file systems for fault tests: a tmpfs mounted over a directory (full disk, read-only), and a
directory this process cannot write. Mounting needs root (requirement ``mount``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.support.requirements import require


def mount(*args: str) -> None:
    """``mount ARGS`` (the test needs the ``mount`` requirement: root)."""
    subprocess.run([require("mount"), *args], check=True, capture_output=True, timeout=30)


def umount(path: Path) -> None:
    """Lazy unmount: a process still holding a file there does not keep it mounted."""
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "64k", read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` over ``path`` for the block (``read_only``: mounted read-only)."""
    mount("-t", "tmpfs", "-o", f"{'ro,' if read_only else ''}size={size}", "tmpfs", str(path))
    try:
        yield path
    finally:
        umount(path)


@contextlib.contextmanager
def read_only_dir(path: Path) -> Iterator[Path]:
    """``path`` unwritable for this process: chmod for a normal user; as root (who ignores permissions)
    a read-only tmpfs over it."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    with tmpfs(path, read_only=True):
        yield path
