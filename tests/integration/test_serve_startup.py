"""What ``icos-agent serve`` says at start, as a real process: a port in use, a state directory held by
another running agent and an unreadable model each end the start with one last line naming the thing
and what to do, a non-zero exit status, and no line saying ready; ``--check`` finds the same. The JSON
log lines of a served agent hold no terminal escape."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.ports import free_port
from tests.support.settings import mnist_config
from tests.support.v2 import verdict_body

#: What a start says once it is ready: the agent's own line, uvicorn's.
READY_LINES = ("agent ready", "Application startup complete")


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process-like owner listens on for the whole test."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def _last_line(agent: AgentProcess) -> str:
    lines = [ln for ln in agent.log().splitlines() if ln.strip()]
    assert lines, "the agent said nothing"
    return lines[-1]


def _assert_refused(agent: AgentProcess, code: int, *named: str) -> str:
    """Exit status non-zero, the last line naming each of ``named``, no line saying ready."""
    log = agent.log()
    assert code != 0, log[-2000:]
    last = _last_line(agent)
    for what in named:
        assert what in last, (what, last)
    for ready in READY_LINES:
        assert ready not in log, log[-2000:]
    return last


@pytest.mark.parametrize(
    ("setting", "remedy"),
    [
        ("port", "--port or ICOS_AGENT_SERVER__PORT"),
        ("metrics_port", "ICOS_AGENT_SERVER__METRICS_PORT"),
        ("admin_port", "ICOS_AGENT_SERVER__ADMIN_PORT"),
        ("grpc_port", "ICOS_AGENT_SERVER__GRPC_PORT"),
    ],
)
def test_a_port_in_use_ends_the_start_naming_it(
    tmp_path: Path, mnist_bundle_dir: Path, taken_port: int, setting: str, remedy: str
) -> None:
    cfg = mnist_config(mnist_bundle_dir, state=tmp_path / "state", server={setting: taken_port})
    agent = AgentProcess(tmp_path, cfg)
    for args in ((), ("--check",)):
        last = _assert_refused(agent, agent.run(*args), f"port {taken_port}", f"server.{setting}", "in use", remedy)
        assert last.startswith("icos-agent serve: error: "), last
        assert "config OK" not in agent.log()
    # nothing was left bound or locked: on a free port instead, the same config starts
    server = {k: v for k, v in cfg["server"].items() if k != setting}
    if setting != "port":
        server[setting] = free_port()
    with AgentProcess(tmp_path, {**cfg, "server": server}) as again:
        assert httpx.get(f"{again.url}/v2/health/ready", timeout=10).status_code == 200


def test_a_state_dir_held_by_a_running_agent_ends_the_start(tmp_path: Path, mnist_bundle_dir: Path) -> None:
    state = tmp_path / "state"
    cfg = mnist_config(mnist_bundle_dir, state=state)
    with AgentProcess(tmp_path, cfg) as first:
        second = AgentProcess(tmp_path, cfg)  # another port, the same state directory
        for args in ((), ("--check",)):
            _assert_refused(
                second, second.run(*args), f"state_dir {state}", f"pid {first.pid}", "in use", "ICOS_AGENT_STATE_DIR"
            )
        assert httpx.get(f"{first.url}/v2/health/ready", timeout=10).status_code == 200  # the first serves on
        first.kill()  # a crash: the kernel lets the lock go with the process
    with second.start() as again:  # the second may start now
        assert httpx.get(f"{again.url}/v2/health/ready", timeout=10).status_code == 200


@pytest.mark.parametrize("kind", ["not_onnx", "truncated", "directory", "missing"])
def test_an_unreadable_model_ends_the_start_naming_it(tmp_path: Path, mnist_bundle_dir: Path, kind: str) -> None:
    model = tmp_path / "model.onnx"
    if kind == "not_onnx":
        model.write_bytes(b"\x08\x07this is not an ONNX model\xff" * 64)
    elif kind == "truncated":
        model.write_bytes(default_model_path().read_bytes()[:5000])
    elif kind == "directory":
        model.mkdir()
    cfg = mnist_config(mnist_bundle_dir, model={"name": "mnist", "path": str(model)})
    agent = AgentProcess(tmp_path, cfg)
    want = {
        "not_onnx": "is not an ONNX model",
        "truncated": "is not an ONNX model",
        "directory": "is a directory",
        "missing": "not found",
    }[kind]
    for args in ((), ("--check",)):
        _assert_refused(agent, agent.run(*args), str(model), want, "model.path", "ICOS_AGENT_MODEL__PATH")


def test_json_logs_hold_no_terminal_escapes(tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    """uvicorn's ``color_message`` (ANSI colours) is not carried into the JSON lines, nor an escape a
    client sent in its request path (access log on)."""
    cfg: dict[str, Any] = mnist_config(mnist_bundle_dir, server={"access_log": True})
    with AgentProcess(tmp_path, cfg) as agent:
        body = verdict_body(mnist_splits.test.x[:1])
        assert httpx.post(f"{agent.url}/v2/models/mnist/infer", json=body, timeout=30).status_code == 200
        assert httpx.get(f"{agent.url}/v2/models/%1B%5B31mred/ready", timeout=10).status_code == 404
        assert agent.terminate() == 0
    lines = agent.log().splitlines()
    assert any("Started server process" in ln for ln in lines)  # the line uvicorn colours
    assert any("%1B%5B31mred" in ln or "[31mred" in ln for ln in lines)  # the access line was written
    for line in lines:
        assert "\x1b" not in line and "\\u001b" not in line.lower(), line
        record = json.loads(line)
        assert "color_message" not in record
