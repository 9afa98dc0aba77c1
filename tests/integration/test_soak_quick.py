"""Smoke run of the soak benchmark (``python -m bench.soak --quick``): a few thousand mixed valid and
invalid requests on loopback; no 5xx, valid answered 200, invalid 4xx, no descriptor growth, clean exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.agent_process import clean_env


def test_quick_soak(mnist_bundle_dir: Path) -> None:
    env = clean_env()
    out = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--quick", "--json", "--bundle", str(mnist_bundle_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip(), out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["requests"] == 3000, r
    assert r["server_errors"] == 0 and r["valid_not_200"] == 0 and r["invalid_not_4xx"] == 0, r["status"]
    assert not r["connection_errors"], r
    assert r["targets"]["no_fd_growth"] and r["targets"]["clean_exit"], r
    # memory: a quick run is too short to judge growth; the full soak reports it against the 10 % target
    assert r["rss_mb_final"] > 0
