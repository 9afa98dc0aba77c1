"""docs/tutorial.md runs as written: every ``bash`` block, in order, in one shell from the repository
root, with a real agent and a real Prometheus on free loopback ports. Only the first block's line
that sets the working directory and the ports is replaced (a temporary directory, free ports); every
other command is the page's own. The shell stops at the first failing command (``set -euo pipefail``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

from tests.support.ports import free_port
from tests.support.requirements import require

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "tutorial.md"
SETTINGS = re.compile(r"^export WORK=\S+ AGENT_PORT=\d+ METRICS_PORT=\d+ PROMETHEUS_PORT=\d+$", re.M)


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", text, re.M | re.S)


def test_every_block_is_a_command_the_test_runs() -> None:
    blocks = _blocks(PAGE.read_text(encoding="utf-8"))
    fences = re.findall(r"^```(\w*)$", PAGE.read_text(encoding="utf-8"), re.M)
    # every fenced block opens as bash (and closes): nothing on the page is left out of the run
    assert fences.count("bash") == len(blocks) and fences.count("") == len(blocks)
    assert len(SETTINGS.findall(blocks[0])) == 1, "the first block sets WORK and the three ports in one export"


def test_the_tutorial_runs_from_training_to_an_alert(tmp_path: Path) -> None:
    require("prometheus")
    venv_cli = REPO / ".venv" / "bin" / "icos-agent"
    assert venv_cli.exists(), "the tutorial runs .venv/bin/icos-agent: install it with `make venv`"
    blocks = _blocks(PAGE.read_text(encoding="utf-8"))
    ports = f"AGENT_PORT={free_port()} METRICS_PORT={free_port()} PROMETHEUS_PORT={free_port()}"
    blocks[0] = SETTINGS.sub(f"export WORK={tmp_path / 'work'} {ports}", blocks[0])
    script = "set -euo pipefail\n" + "\n".join(blocks)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICOS_AGENT_")}
    proc = subprocess.Popen(  # noqa: S603
        ["bash", "-c", script],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        # the agent and Prometheus run in the background of that shell: whatever is left goes with it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    work = tmp_path / "work"
    logs = "".join(
        f"\n--- {name}\n" + (work / name).read_text(errors="replace")[-2000:]
        for name in ("agent.log", "prometheus.log")
        if (work / name).exists()
    )
    assert proc.returncode == 0, out[-6000:] + logs

    accuracy = re.search(r"validation accuracy ([\d.]+), on the noisy traffic ([\d.]+)", out)
    assert accuracy, out
    clean, noisy = float(accuracy[1]), float(accuracy[2])
    assert noisy < clean - 0.1, "the page's story needs traffic that has gone clearly worse"
    assert "bundle written to" in out and "agent ready" in out
    estimate = re.search(r"headline (\w+) ([\d.]+) \[([\d.]+), ([\d.]+)\]; reference accuracy ([\d.]+)", out)
    assert estimate, out
    value, reference = float(estimate[2]), float(estimate[5])
    # the label-free estimate sees the drop: within 0.1 of the truth, and below the reference
    assert abs(value - noisy) <= 0.1 and value < reference - 0.05, (value, noisy, reference)
    assert re.search(
        r"^IcosEstimatedAccuracyLow (pending|firing) - Estimated accuracy of digits 1 is low$", out, re.M
    ), out[-3000:]
