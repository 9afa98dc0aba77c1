"""``icos-agent estimate-lake`` over a generated lake, run as a child process: its peak resident set size (read
from the kernel's accounting of that child alone, ``wait4``) and its rows per second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LakeRun:
    """One ``estimate-lake`` run: rows and files read, wall-clock seconds, peak RSS in bytes, and its report."""

    rows: int
    files: int
    seconds: float
    peak_rss: int
    report: dict[str, object]

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds


def command(model: Path, bundle: Path, lake: Path, window: str = "1h") -> list[str]:
    """The command line measured (the installed entry point's code, run by this interpreter)."""
    return [
        sys.executable,
        "-m",
        "agent",
        "estimate-lake",
        "--model",
        str(model),
        "--bundle",
        str(bundle),
        "--data",
        str(lake),
        "--timestamp",
        "ts",
        "--window",
        window,
        "--json",
    ]


def run_lake(model: Path, bundle: Path, lake: Path, timeout_s: float) -> LakeRun:
    """Run ``estimate-lake`` over ``lake`` and wait for it alone: ``wait4`` returns that child's own peak RSS (the
    kernel's high-water mark of its resident pages), unlike ``RUSAGE_CHILDREN``, which keeps the largest of every
    child this process ever waited for (a Spark JVM among them)."""
    out, err = lake.parent / "estimate-lake.json", lake.parent / "estimate-lake.stderr"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        start = time.perf_counter()
        child = subprocess.Popen(command(model, bundle, lake), stdout=stdout, stderr=stderr)
        deadline = start + timeout_s
        while True:  # bounded by the deadline
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                child.kill()
                child.wait()
                raise SystemExit(f"estimate-lake ran past {timeout_s:.0f} s")
            time.sleep(0.05)
        seconds = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        said = err.read_text(errors="replace").strip()[-2000:]
        raise SystemExit(f"estimate-lake failed ({child.returncode}): {said}")
    report = json.loads(out.read_text())
    # ru_maxrss is in kibibytes on Linux
    return LakeRun(int(report["n"]), int(report["files"]), seconds, int(usage.ru_maxrss) * 1024, report)
