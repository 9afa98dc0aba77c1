"""One serving agent per state directory: the lock is exclusive, names its holder, goes with its
holder (released, or the process ended), and a directory that cannot hold it does not stop a start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.core.state_lock import LOCK_FILE, StateDirInUse, StateDirLock


def test_a_second_lock_on_the_same_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = StateDirLock(tmp_path / "state")
    assert first.acquire() and first.held
    with pytest.raises(StateDirInUse) as refused:
        StateDirLock(tmp_path / "state").acquire()
    assert f"state_dir {tmp_path / 'state'} is in use by another agent (pid {os.getpid()})" in str(refused.value)
    first.release()
    again = StateDirLock(tmp_path / "state")
    assert again.acquire()
    again.release()
    assert (tmp_path / "state" / LOCK_FILE).exists()  # the file may stay: the lock is the kernel's


def test_the_lock_goes_with_its_process(tmp_path: Path) -> None:
    """A process that ends without releasing (killed, crashed) leaves nothing held."""
    code = (
        "import sys; from pathlib import Path; from agent.core.state_lock import StateDirLock;"
        "assert StateDirLock(Path(sys.argv[1])).acquire(); print('held', flush=True); sys.stdin.read()"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    ) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        with pytest.raises(StateDirInUse, match=f"pid {holder.pid}"):
            StateDirLock(tmp_path).acquire()
        holder.kill()
        holder.wait(timeout=30)
    lock = StateDirLock(tmp_path)
    assert lock.acquire()
    lock.release()


def test_a_directory_that_cannot_hold_a_lock_file_is_served_unlocked(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    lock = StateDirLock(blocker / "state")  # cannot be created under a file
    assert lock.acquire() is False and not lock.held
