"""One serving agent per state directory: an exclusive lock on ``<state_dir>/icos-agent.lock``.

Two agents on one ``state_dir`` would overwrite each other's windows and interleave their prediction
stores without a word. ``icos-agent serve`` takes this lock before it opens anything in the directory
and before it says it is ready; a second agent on the same directory stops at start with one line
naming the directory and the process holding it.

The lock is ``flock(2)`` on an open file: the kernel releases it when the process ends, however it ends
(a crash or SIGKILL leaves no stale lock to clean up), and the file itself may stay. The file holds the
holder's pid, for the message only. A directory the agent cannot write (read-only volume) is not
locked: the agent serves without saving state there anyway (see :mod:`agent.judging.window_state`),
and says so in the log.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from agent.core import logs
from agent.errors import UserError

log = logs.get("app")

LOCK_FILE = "icos-agent.lock"


class StateDirInUse(UserError):
    """Another process holds the state directory's lock."""


class StateDirLock:
    """The exclusive lock of one state directory, held from :meth:`acquire` to :meth:`release` (or the
    end of the process)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock; :class:`StateDirInUse` when another process holds it, ``False`` (logged) when
        the directory cannot hold a lock file (read-only, not creatable)."""
        fd = self._open()
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            by = f"another agent (pid {holder})" if holder else "another agent"
            raise StateDirInUse(
                f"state_dir {self.directory} is in use by {by}: give each agent a state_dir of its own "
                "(state_dir in the config, or ICOS_AGENT_STATE_DIR), or stop the other one"
            ) from None
        except OSError as exc:  # a file system without locks
            os.close(fd)
            log.warning(
                "state_dir not locked: its file system does not support locks",
                extra={"state_dir": str(self.directory), "error": exc.strerror or str(exc)},
            )
            return False
        with contextlib.suppress(OSError):  # the pid is for the message only
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return True

    def release(self) -> None:
        """Let the lock go (the process's end does too)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int | None:
        """The lock file, created when missing; read-only when a directory now read-only holds one from an
        earlier run (flock works on it still); ``None`` (logged) when there is none and it cannot be made."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            error = exc.strerror or str(exc)
        try:
            return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            log.warning(
                "state_dir not locked: it cannot hold a lock file, so another agent on it would go unnoticed",
                extra={"state_dir": str(self.directory), "error": error},
            )
            return None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
