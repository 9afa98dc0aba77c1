"""The notebook story of docs/python.md, run end to end through ``icos_agent`` alone: the shipped MNIST CNN fitted,
twelve hours of traffic whose images darken after the sixth, estimated per hour with the labels beside, the page
written and photographed by headless Chromium into ``docs/img/python-report.png``.

    python -m bench.notebook_report [--out docs/python.md] [--workdir DIR]

Prints one line per window (the headline estimate and its interval, the realized accuracy, the flag and the
alert); ``--out`` writes the same table into the page's generated block.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

import icos_agent
from agent.data.datasets import mnist_splits
from agent.model.classifier import default_model_path
from bench.generated_docs import provenance, write_block

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python -m bench.notebook_report"
BEGIN = f"<!-- BEGIN GENERATED: {COMMAND} -->"
SCREENSHOT = ROOT / "docs" / "img" / "python-report.png"
HOURS, ROWS_PER_HOUR, DRIFT_FROM = 12, 250, 6


def traffic(seed: int = 0) -> tuple[np.ndarray, np.ndarray, pd.DatetimeIndex]:
    """Twelve hours of the test split drawn at random: the images, their labels and their times; from hour
    :data:`DRIFT_FROM` on the images darken a little more every hour."""
    test = mnist_splits().test
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(test.y), size=HOURS * ROWS_PER_HOUR)
    x = test.x[idx].astype(np.float32).copy()
    hour = np.repeat(np.arange(HOURS), ROWS_PER_HOUR)
    dim = np.clip(1.0 - 0.12 * (hour - DRIFT_FROM + 1), 0.25, 1.0)
    x *= dim[:, None, None, None]
    offset = rng.uniform(0, 3600, size=len(idx))
    ts = pd.Timestamp("2026-05-04", tz="UTC") + pd.to_timedelta(hour * 3600 + offset, unit="s")
    return x, test.y[idx], pd.DatetimeIndex(ts)


def screenshot(page: Path, out: Path, workdir: Path) -> None:
    """Headless Chromium's picture of the page (no network: every request goes to a closed port)."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        raise SystemExit("chromium is not installed (Debian: apt-get install chromium)")
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,1700"]
    cmd += ["--proxy-server=http://127.0.0.1:9", f"--user-data-dir={workdir / 'profile'}", f"--screenshot={out}"]
    subprocess.run([*cmd, page.as_uri()], capture_output=True, timeout=120, check=True)  # noqa: S603


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--out", type=Path, help="write the table into this page's generated block")
    parser.add_argument("--workdir", type=Path, help="keep the bundle and the page here (default: a temporary dir)")
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="icos-notebook-"))
    work.mkdir(parents=True, exist_ok=True)
    splits = mnist_splits()
    bundle = icos_agent.fit(
        model=default_model_path(), train=(splits.train.x, splits.train.y), val=(splits.val.x, splits.val.y), trees=30
    )
    x, y, ts = traffic()
    est = bundle.estimate(x, timestamp=ts, window="1h", labels=y)
    page = est.save_html(work / "report.html")
    screenshot(page, SCREENSHOT, work)
    df = est.to_df()
    lines = [
        f"headline `{est.headline}`; reference accuracy {est.reference_accuracy:.3f}, alert threshold "
        f"{est.alert_threshold:.3f}; images darkened from hour {DRIFT_FROM} on",
        "",
        "| hour (UTC) | n | estimate | 95% interval | realized | flag raised | alert |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in df.itertuples():
        lines.append(
            f"| {r.window_start:%H:%M} | {r.n} | {r.value:.3f} | [{r.lower:.3f}, {r.upper:.3f}] | {r.realized:.3f} "
            f"| {'yes: ' + r.flag_reasons.replace(';', ', ') if r.flag_raised else 'no'} "
            f"| {'yes' if r.alert else 'no'} |"
        )
    table = "\n".join(lines)
    print(table)
    print(f"screenshot: {SCREENSHOT.relative_to(ROOT)}")
    if args.out:
        write_block(args.out, BEGIN, f"{provenance(COMMAND, ROOT)}\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
