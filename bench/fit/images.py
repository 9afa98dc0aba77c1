"""``fit`` on many large images: wall time and peak memory of ``icos-agent fit`` on an image folder.

    python -m bench.fit.images [--train 10000] [--val 2000] [--format jpeg] [--workdir DIR]

Generates the zoo's 224×224 texture images (:mod:`bench.zoo.images`), writes them as image folders
(ImageFolder layout: one subfolder per class) in batches, and runs ``icos-agent fit`` with the zoo's
ResNet-style CNN (``resnet224``, raw 0..255 pixels: ``--preprocess scale=1``) as a separate process, reading
its wall time and peak resident memory from the operating system (``wait4``). The target of the issue this
answers: 10,000 training images fitted in at most 5 minutes and 3 GB on 2 cores. Prints a Markdown table
with the command, the commit, the view ``fit`` chose and the bundle's oracle figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET_SECONDS = 300.0
TARGET_BYTES = 3 * 1024**3
CHUNK = 500  # images generated and written at a time


def write_folder(root: Path, n: int, seed: int, image_format: str) -> Path:
    """``n`` generated images as ``root/<class>/<i>.<ext>``, written a chunk at a time."""
    from bench.zoo.files import write_image_folder
    from bench.zoo.images import PATTERNS, generate

    classes = tuple(sorted(PATTERNS))
    done = root / ".complete"
    if done.is_file() and done.read_text() == f"{n}:{seed}:{image_format}":
        return root
    for start in range(0, n, CHUNK):
        x, y = generate(min(CHUNK, n - start), seed * 1000 + start)
        sub = root / f"part{start // CHUNK:04d}"
        write_image_folder(x, y, classes, sub, image_format=image_format)
        for cls in classes:  # flatten into root/<class>/
            (root / cls).mkdir(parents=True, exist_ok=True)
            for f in (sub / cls).iterdir():
                f.rename(root / cls / f"{start:06d}-{f.name}")
            (sub / cls).rmdir()
        sub.rmdir()
    done.write_text(f"{n}:{seed}:{image_format}")
    return root


def run_fit(model: Path, train: Path, val: Path, out: Path, trees: int) -> tuple[float, int, int, str]:
    """Wall seconds, peak RSS bytes, exit status and the last lines of ``icos-agent fit``."""
    cmd = [sys.executable, "-m", "agent", "fit", "--model", str(model), "--train", str(train), "--val", str(val)]
    cmd += ["--preprocess", "scale=1", "--trees", str(trees), "--out", str(out), "--json"]
    log = out.parent / "fit.log"
    with open(log, "w", encoding="utf-8") as sink:  # a file, not a pipe: progress output cannot block the child
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, int(usage.ru_maxrss) * 1024, proc.returncode, log.read_text(encoding="utf-8", errors="replace")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=int, default=10_000)
    p.add_argument("--val", type=int, default=2_000)
    p.add_argument("--format", choices=("png", "jpeg"), default="jpeg")
    p.add_argument("--trees", type=int, default=100)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    from bench.zoo.resnet224 import MODELS_DIR

    work = args.workdir or Path(tempfile.mkdtemp(prefix="fit-images-"))
    t0 = time.monotonic()
    train = write_folder(work / f"train-{args.train}", args.train, 1, args.format)
    val = write_folder(work / f"val-{args.val}", args.val, 2, args.format)
    print(f"images written in {time.monotonic() - t0:.0f} s to {work}", file=sys.stderr)
    model = MODELS_DIR / "resnet224.onnx"
    wall, peak, rc, text = run_fit(model, train, val, work / "bundle", args.trees)
    if rc != 0:
        print(text[-3000:], file=sys.stderr)
        return 1
    manifest = json.loads((work / "bundle" / "manifest.json").read_text())
    view = manifest.get("feature_view", {})
    cal = manifest["calibration"]
    from bench.generated_docs import commit_of

    commit = commit_of(ROOT)
    print(f"command: python -m bench.fit.images --train {args.train} --val {args.val} --format {args.format}")
    print(f"commit: {commit}; {os.cpu_count()} cores")
    print()
    print("| images (train / val) | wall | peak RSS | view | oracle TPR / FPR | target |")
    print("|---|---|---|---|---|---|")
    ok = wall <= TARGET_SECONDS and peak <= TARGET_BYTES
    print(
        f"| {args.train:,} / {args.val:,} ({args.format}) | {wall:.0f} s | {peak / 1024**3:.2f} GB "
        f"| {view.get('kind')} ({view.get('width')} columns) | {cal.get('tpr', float('nan')):.3f} / "
        f"{cal.get('fpr', float('nan')):.3f} | {'met' if ok else 'missed'} (≤ {TARGET_SECONDS:.0f} s, ≤ 3 GB) |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
