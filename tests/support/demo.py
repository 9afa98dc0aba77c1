"""The demo (``python -m agent demo --quick --no-live``), run once per run for tests/e2e."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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

    def to_json(self) -> dict[str, Any]:
        """The run as a JSON-able mapping (shared between test processes)."""
        return {**asdict(self), "state_dir": str(self.state_dir), "report_dir": str(self.report_dir)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DemoRun:
        return cls(**{**data, "state_dir": Path(data["state_dir"]), "report_dir": Path(data["report_dir"])})


def run_demo(root: Path) -> DemoRun:
    """Run the reduced demo with its state and report under ``root``."""
    state, report = root / "state", root / "report"
    cmd = [sys.executable, "-m", "agent", "demo", "--quick", "--no-live"]
    cmd += ["--state-dir", str(state), "--report-dir", str(report)]
    proc = subprocess.run(  # noqa: S603 - our own interpreter and module
        cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=DEMO_TIMEOUT_SECONDS
    )
    return DemoRun(state, report, proc.returncode, proc.stdout, proc.stderr)
