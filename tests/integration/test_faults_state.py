"""The state directory turns read-only or fills up while the agent serves: serving goes on, the
``icos_state_writable`` gauge drops to 0 and ``icos_state_write_failures_total`` grows, one log line
says so, and once the directory is writable again the state is saved (and restored at restart).

Uses real mounts (a read-only bind mount, a small tmpfs), so it needs root; otherwise it skips.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from agent_process import AgentProcess, infer_body
from conftest import wait_until

from agent.data.datasets import Splits
from agent.model.classifier import default_model_path


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@pytest.fixture
def mountable(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) for a read-only bind mount and a small tmpfs")
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe))
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot mount here: {exc}")
    _umount(probe)


def _config(bundle: Path, state: Path) -> dict[str, object]:
    return {
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(bundle)},
        "state_dir": str(state),
        "state": {"flush_interval_seconds": 0.3},
        "windows": {"time": ["5m"], "count": 100000},
        "audits": {"reservoir": {"size": 0}, "mlflow": {"enabled": False}},
    }


def _serve_some(agent: AgentProcess, x: object, n: int) -> int:
    with httpx.Client(timeout=30) as c:
        for _ in range(n):
            r = c.post(f"{agent.url}/v2/models/mnist/infer", json=infer_body(x))
            assert r.status_code == 200, r.text
    return n


@contextlib.contextmanager
def _agent(tmp_path: Path, bundle: Path, state: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(tmp_path, _config(bundle, state)).start()
    try:
        yield agent
    finally:
        agent.kill()


def _restart_total(tmp_path: Path, bundle: Path, state: Path) -> int:
    with _agent(tmp_path, bundle, state) as again:
        return int(httpx.get(f"{again.url}/v1/estimates").json()["total_judged"])


@pytest.mark.usefixtures("mountable")
def test_read_only_state_dir(tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    """A read-only volume (a file system cannot turn read-only under open writers, so it is read-only
    from the start): the agent serves, says so, and saves as soon as the volume is writable."""
    src, state = tmp_path / "src", tmp_path / "state"
    src.mkdir()
    state.mkdir()
    _mount("--bind", str(src), str(state))
    _mount("-o", "remount,bind,ro", str(state))
    try:
        x = mnist_splits.test.x[:4]
        with _agent(tmp_path, mnist_bundle_dir, state) as agent:
            sent = _serve_some(agent, x, 5) * 4  # serving goes on
            assert wait_until(lambda: agent.metrics().get("icos_state_writable") == 0.0, 10), agent.log()[-2000:]
            assert wait_until(lambda: agent.metrics()["icos_state_write_failures_total"] >= 3, 10)
            sent += _serve_some(agent, x, 5) * 4
            assert wait_until(lambda: "saving state failed" in agent.log(), 5)
            assert agent.log().count("saving state failed") == 1  # one line per outage, not per flush
            _mount("-o", "remount,bind,rw", str(state))
            assert wait_until(lambda: agent.metrics().get("icos_state_writable") == 1.0, 10), agent.log()[-2000:]
            assert wait_until(lambda: "saving state recovered" in agent.log(), 5)
            sent += _serve_some(agent, x, 5) * 4
            assert agent.terminate() == 0
        assert _restart_total(tmp_path, mnist_bundle_dir, state) == sent
    finally:
        _umount(state)


@pytest.mark.usefixtures("mountable")
def test_full_state_dir(tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    state = tmp_path / "state"
    state.mkdir()
    _mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(state))
    try:
        x = mnist_splits.test.x[:4]
        with _agent(tmp_path, mnist_bundle_dir, state) as agent:
            filler = state / "filler"
            with contextlib.suppress(OSError), filler.open("wb") as f:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            sent = 0
            for _ in range(40):  # new windows need new pages: writes fail on the full file system
                sent += _serve_some(agent, x, 2) * 4
                if agent.metrics().get("icos_state_writable") == 0.0:
                    break
            assert agent.metrics().get("icos_state_writable") == 0.0, agent.log()[-2000:]
            assert wait_until(lambda: "saving state failed" in agent.log(), 5)
            sent += _serve_some(agent, x, 5) * 4
            filler.unlink()
            assert wait_until(lambda: agent.metrics().get("icos_state_writable") == 1.0, 10), agent.log()[-2000:]
            assert wait_until(lambda: "saving state recovered" in agent.log(), 5)
            assert agent.terminate() == 0
        assert _restart_total(tmp_path, mnist_bundle_dir, state) == sent
    finally:
        _umount(state)
