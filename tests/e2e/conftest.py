"""The demo, run once per session in its reduced mode (``--quick``); its tests read what it left."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DemoRun:
    state_dir: Path
    report_dir: Path
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """``python -m agent demo --quick --no-live`` with its state and report in a fresh directory."""
    root = tmp_path_factory.mktemp("demo")
    state, report = root / "state", root / "report"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICOS_AGENT_")}
    proc = subprocess.run(  # noqa: S603 - our own interpreter and module
        [
            sys.executable,
            "-m",
            "agent",
            "demo",
            "--quick",
            "--no-live",
            "--state-dir",
            str(state),
            "--report-dir",
            str(report),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return DemoRun(state, report, proc.returncode, proc.stdout, proc.stderr)
