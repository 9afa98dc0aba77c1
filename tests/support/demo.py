"""The demo (``python -m agent demo --quick --no-live``), run once per session for tests/e2e."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.agent_process import clean_env

ROOT = Path(__file__).resolve().parents[2]
#: The reduced demo takes 2–4 minutes on two loaded cores; this bounds it.
DEMO_TIMEOUT_SECONDS = 900


@dataclass(frozen=True)
class DemoRun:
    state_dir: Path
    report_dir: Path
    returncode: int
    stdout: str
    stderr: str


def run_demo(root: Path) -> DemoRun:
    """Run the reduced demo with its state and report under ``root``."""
    state, report = root / "state", root / "report"
    cmd = [sys.executable, "-m", "agent", "demo", "--quick", "--no-live"]
    cmd += ["--state-dir", str(state), "--report-dir", str(report)]
    proc = subprocess.run(  # noqa: S603 - our own interpreter and module
        cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=DEMO_TIMEOUT_SECONDS
    )
    return DemoRun(state, report, proc.returncode, proc.stdout, proc.stderr)
