"""Every kind of model the agent monitors, fitted and checked as a user would: the view ``fit`` chooses,
its time and peak memory, the oracle's TPR and FPR, and the headline estimate against the truth in
distribution and under each of the kind's shifts.

    python -m bench.bench_model_kinds [NAMES ...] [--workdir DIR] [--strength 0.5] [--trees 100]
        [--features VIEW ...]
    python -m bench model_kinds

Models and data come from the zoo (:mod:`bench.zoo`: a TF-IDF text pipeline, a ColumnTransformer over
numeric and categorical columns, LightGBM, a token-id classifier, ResNet-style CNNs on 224×224 images in
NCHW float and NHWC uint8, the MNIST CNN), written as ``.npz`` files with one array per named input.
``icos-agent fit`` and ``icos-agent check`` run as separate processes (``python -m agent``); fit's wall
time and peak resident memory are the operating system's (the child's ``VmHWM``). Each shift of the zoo is applied to
the test split at ``--strength``. ``--features`` fits the MNIST CNN once per view named (default: the one
``fit`` chooses, and ``embedding`` for comparison).

Columns: the headline's absolute error; ``avg_conf``'s (average confidence, the label-free baseline); and
whether the flag "this number may be wrong" is raised (``flag.raised`` of ``check --json``). The
targets: in distribution within 0.02; under shift no worse than average confidence by more than 0.02,
with the flag raised where the headline is more than 0.05 off.
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
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ("text_tfidf", "tabular_categorical", "lightgbm", "token_classifier", "resnet224", "resnet224_nhwc_uint8")
#: Larger splits than the zoo's default for the 224×224 models: a 150-image test split is ±0.03 by itself.
IMAGE_SIZES = (1000, 600, 1000)
IN_DISTRIBUTION = 0.02
BEHIND_CONFIDENCE = 0.02
FLAG_NEEDED = 0.05


def save_npz(split: Any, path: Path) -> Path:
    """One array per named input (text as fixed-width strings: no pickle) and ``y``."""
    arrays = {k: v.astype("U") if v.dtype == object else v for k, v in split.inputs.items()}
    np.savez(path, y=split.y, **arrays)
    return path


def _high_water(pid: int) -> int:
    """The process's own peak resident memory (``VmHWM``, bytes), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(cmd: list[str], log: Path) -> tuple[float, int, int, str]:
    """Wall seconds, peak RSS bytes, exit status and output of ``cmd`` (output to a file, not a pipe).

    The peak is the child's own ``VmHWM``, read every 20 ms until it exits: ``wait4``'s ``ru_maxrss``
    of a child also counts this process's memory at the fork (Linux carries it over), which after the
    zoo's 224×224 images are built here is gigabytes the child never used."""
    with log.open("w", encoding="utf-8") as sink:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _high_water(proc.pid))
            time.sleep(0.02)
        wall = time.monotonic() - t0
    return wall, peak, int(proc.returncode), log.read_text(errors="replace")


def last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise ValueError(f"no JSON line in: {text[-1500:]}")


def check(model: Path, bundle: Path, data: Path, log: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "agent", "check", "--model", str(model), "--bundle", str(bundle)]
    _, _, rc, text = run([*cmd, "--data", str(data), "--json"], log)
    if rc != 0:
        raise RuntimeError(f"check failed ({rc}): {text[-2000:]}")
    report = last_json(text)
    truth = float(report["truth"]["accuracy"])
    head = report["estimates"][report["headline"]]
    flag = report.get("flag") or {}
    return {
        "truth": truth,
        "headline": report["headline"],
        "error": abs(float(head["value"]) - truth),
        "conf_error": abs(float(report["estimates"]["avg_conf"]["value"]) - truth),
        "covered": float(head.get("lower", -1)) <= truth <= float(head.get("upper", 2)),
        "flag_raised": flag.get("raised") is True,
    }


def measure(name: str, work: Path, strength: float, trees: int, features: str | None) -> dict[str, Any]:
    from bench.zoo import build

    options = {"sizes": IMAGE_SIZES} if name.startswith("resnet224") else {}
    model = build(name, work / "zoo", seed=0, **options)
    tag = f"{name}-{features or 'default'}"
    data = work / tag
    data.mkdir(parents=True, exist_ok=True)
    files = {p: save_npz(getattr(model, p), data / f"{p}.npz") for p in ("train", "val", "test")}
    bundle = data / "bundle"
    cmd = [sys.executable, "-m", "agent", "fit", "--model", str(model.path), "--train", str(files["train"])]
    cmd += ["--val", str(files["val"]), "--trees", str(trees), "--out", str(bundle), "--json"]
    if features:
        cmd += ["--features", features]
    wall, peak, rc, text = run(cmd, data / "fit.log")
    if rc != 0:
        raise RuntimeError(f"fit {tag} failed ({rc}): {text[-2000:]}")
    manifest = json.loads((bundle / "manifest.json").read_text())
    cal = manifest["calibration"]
    row: dict[str, Any] = {
        "kind": name,
        "view": manifest["feature_view"]["kind"],
        "width": manifest["feature_view"]["width"],
        "fit_s": wall,
        "fit_peak_gb": peak / 1024**3,
        "tpr": float(cal["tpr"]),
        "fpr": float(cal["fpr"]),
        "in_distribution": check(model.path, bundle, files["test"], data / "check-test.log"),
        "shifts": {},
    }
    for kind in model.shifts:
        shifted = save_npz(model.shift(model.test, strength, seed=1, kind=kind), data / f"test-{kind}.npz")
        row["shifts"][kind] = check(model.path, bundle, shifted, data / f"check-{kind}.log")
    return row


def verdict(row: dict[str, Any]) -> str:
    misses = []
    if row["in_distribution"]["error"] > IN_DISTRIBUTION:
        misses.append("in distribution")
    for kind, s in row["shifts"].items():
        if s["error"] > s["conf_error"] + BEHIND_CONFIDENCE:
            misses.append(f"{kind}: behind avg_conf")
        if s["error"] > FLAG_NEEDED and not s["flag_raised"]:
            misses.append(f"{kind}: flag not raised")
    return "met" if not misses else "missed (" + "; ".join(misses) + ")"


def render(rows: list[dict[str, Any]], argv: list[str], strength: float) -> str:
    from bench.generated_docs import commit_of

    commit = commit_of(ROOT)
    lines = [
        f"command: python -m bench.bench_model_kinds {' '.join(argv)}".rstrip(),
        f"commit: {commit}; {os.cpu_count()} cores; shifts at strength {strength:g}",
        "",
        "| model | view | fit | fit peak | oracle TPR / FPR | in distribution: truth, headline error | "
        "under shift: truth, headline error / avg_conf error, flag | targets |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r["in_distribution"]
        shifts = "; ".join(
            f"{k} {s['truth']:.3f}, {s['error']:.3f} / {s['conf_error']:.3f}" + (", flag raised" * s["flag_raised"])
            for k, s in r["shifts"].items()
        )
        lines.append(
            f"| {r['kind']} | {r['view']} ({r['width']}) | {r['fit_s']:.0f} s | {r['fit_peak_gb']:.2f} GB "
            f"| {r['tpr']:.3f} / {r['fpr']:.3f} | {d['truth']:.3f}, {d['error']:.3f} ({d['headline']}) "
            f"| {shifts} | {verdict(r)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.bench_model_kinds", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help=f"zoo entries (default: {', '.join(DEFAULT)}, and mnist_cnn per view)")
    p.add_argument("--workdir", type=Path, help="where models, data and bundles go (default: a temporary one)")
    p.add_argument("--strength", type=float, default=0.5)
    p.add_argument("--trees", type=int, default=100)
    p.add_argument(
        "--features", nargs="+", default=["", "embedding"], help="views of the MNIST CNN ('' = fit's choice)"
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    runs: list[tuple[str, str | None]] = [(n, None) for n in (args.names or DEFAULT) if n != "mnist_cnn"]
    if not args.names or "mnist_cnn" in args.names:
        runs += [("mnist_cnn", f or None) for f in args.features]
    with tempfile.TemporaryDirectory(prefix="model-kinds-") as tmp:
        work = args.workdir or Path(tmp)
        rows = []
        for name, features in runs:
            print(f"{name} ({features or 'default view'}) ...", file=sys.stderr, flush=True)
            rows.append(measure(name, work, args.strength, args.trees, features))
    print(json.dumps(rows, indent=2) if args.json else render(rows, argv, args.strength))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
