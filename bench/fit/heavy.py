"""``fit`` on heavy inputs: wall time and peak memory of ``icos-agent fit``, and what the bundles cost to judge.

    python -m bench.fit.heavy [--cases wide,table] [--rows 2200] [--table-rows 1000000]
        [--position-width 128] [--workdir DIR]

Two cases, each generated here (:mod:`bench.fit.heavy_inputs`, seeded, in seconds) and fitted by
``python -m agent fit ... --json`` as a separate process whose wall time and peak resident memory the
operating system reports (``wait4``):

* ``wide``: a text classifier over INT32 ``[N, 2048]`` token ids with 230 classes, ``--rows`` labeled rows
  (80% training, 20% validation). Its own speed (rows per second, one onnxruntime thread) is printed
  too, so the fit's time can be read against one pass of the model over the data.
  Target: ≤ 90 s, ≤ 1 GB.
* ``table``: ``fit --reference`` of a Parquet table of ``--table-rows`` rows, 20 feature columns, three
  classes' probabilities and the label. Target: ≤ 120 s, ≤ 1.5 GB. Then the cost of judging with its
  bundle (its TDI rules and ADI forest, the compiled oracle's ``judge_with_rules`` as the judge thread calls it) per
  row at batches of 1 and 256, against a bundle of the same table's first 20,000 rows (a few hundred
  rules): whether the judge's cost grows with the rule count.

Prints each figure with its target and PASS/FAIL, the stages' seconds (``stage_seconds`` of
``fit --json``) and the machine's load average when each fit started (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
GB = 1024**3
TARGETS = {"wide": (90.0, 1 * GB), "table": (120.0, 1.5 * GB)}
SMALL_TABLE_ROWS = 20_000


@dataclass(frozen=True)
class FitRun:
    wall: float
    peak: int
    status: int
    summary: dict[str, Any]
    log: str
    load: float


def run_fit(args: list[str], out: Path) -> FitRun:
    """``python -m agent fit ARGS --out OUT --json`` as a child: wall seconds, peak RSS bytes, the summary."""
    cmd = [sys.executable, "-m", "agent", "fit", *args, "--out", str(out), "--json"]
    log = out.parent / f"{out.name}.log"
    load = os.getloadavg()[0]
    with open(log, "w", encoding="utf-8") as sink:  # a file, not a pipe: progress output cannot block the child
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sink, text=True, cwd=ROOT)
        stdout = proc.stdout.read() if proc.stdout is not None else ""
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
    code = os.waitstatus_to_exitcode(status)
    try:
        summary = json.loads(stdout) if code == 0 else {}
    except ValueError:
        summary = {}
    return FitRun(wall, int(usage.ru_maxrss) * 1024, code, summary, log.read_text(errors="replace"), load)


def verdict(run: FitRun, case: str) -> str:
    seconds, peak = TARGETS[case]
    ok = run.status == 0 and run.wall <= seconds and run.peak <= peak
    return "PASS" if ok else "FAIL"


def report(case: str, what: str, run: FitRun) -> None:
    seconds, peak = TARGETS[case]
    print(f"\n## {case}: {what}")
    print(f"load average (1 min) at the start: {run.load:.1f} on {os.cpu_count()} cores")
    if run.status != 0:
        print(f"fit failed (exit {run.status}):\n{run.log[-3000:]}")
    print(f"wall      {run.wall:7.1f} s   target ≤ {seconds:.0f} s")
    print(f"peak RSS  {run.peak / GB:7.2f} GB  target ≤ {peak / GB:.1f} GB")
    print(f"{verdict(run, case)}")
    s = run.summary
    if s:
        stages = ", ".join(f"{k} {v:.1f} s" for k, v in s.get("stage_seconds", {}).items())
        print(f"stages: {stages}")
        cal = s.get("calibration", {})
        print(
            f"TDI rules {s.get('tdi_rules')} ({s.get('tdi_selected')} selected); oracle TPR {cal.get('tpr', 0):.3f} "
            f"FPR {cal.get('fpr', 0):.3f} on {cal.get('n')} calibration rows; headline {s.get('headline')}"
        )


def model_speed(model_bytes: bytes, ids: np.ndarray) -> float:
    """Rows per second of the model alone (one onnxruntime thread, batches of 64)."""
    from invariants.onnx_session import OnnxSession

    session = OnnxSession(model_bytes, intra_op_threads=1)
    n = min(len(ids), 512)
    t0 = time.perf_counter()
    for a in range(0, n, 64):
        session.run({"input_ids": ids[a : a + 64]})
    return n / (time.perf_counter() - t0)


def wide_case(work: Path, rows: int, position_width: int) -> int:
    from bench.fit.heavy_inputs import WIDE_CLASSES, WIDE_LENGTH, wide_token_model, wide_token_rows

    data = wide_token_rows(rows, seed=0)
    model = wide_token_model(seed=0, position_width=position_width)
    n_train = int(rows * 0.8)
    np.savez(work / "wide-train.npz", x=data.ids[:n_train], y=data.y[:n_train])
    np.savez(work / "wide-val.npz", x=data.ids[n_train:], y=data.y[n_train:])
    (work / "wide.onnx").write_bytes(model)
    speed = model_speed(model, data.ids)
    args = ["--model", str(work / "wide.onnx"), "--train", str(work / "wide-train.npz")]
    run = run_fit([*args, "--val", str(work / "wide-val.npz")], work / "wide-bundle")
    what = (
        f"INT32 [N, {WIDE_LENGTH}] token ids, {WIDE_CLASSES} classes, {n_train:,} training + {rows - n_train:,} "
        f"validation rows; the model alone: {speed:,.0f} rows/s ({rows / speed:.1f} s for one pass over all rows)"
    )
    report("wide", what, run)
    if run.summary:
        view = json.loads((work / "wide-bundle" / "manifest.json").read_text()).get("feature_view", {})
        print(f"view: {view.get('kind')} ({view.get('width')} columns): {view.get('why', '')}")
    return 0 if verdict(run, "wide") == "PASS" else 1


def write_table(path: Path, rows: int) -> list[str]:
    import pandas as pd

    from bench.fit.heavy_inputs import TABLE_CLASSES, wide_table

    pd.DataFrame(wide_table(rows, seed=0)).to_parquet(path)
    return [f"p_{k}" for k in range(TABLE_CLASSES)]


def judge_cost(bundle_dir: Path, features: np.ndarray, probabilities: np.ndarray) -> dict[int, float]:
    """Microseconds of CPU per row of the serving oracle's ``judge_with_rules`` (TDI leaves and ADI forest
    in one onnxruntime call, as the agent's runtime builds it) by batch size."""
    from agent.model.classifier import predicted_classes_of
    from invariants.bundle import Bundle
    from invariants.compiled import CompiledOracle

    bundle = Bundle.load(bundle_dir)
    oracle = CompiledOracle(bundle.oracle(), features.shape[1], probabilities.shape[1])
    predicted = predicted_classes_of(probabilities)
    out: dict[int, float] = {}
    for batch in (1, 256):
        calls = max(1, 4096 // batch)
        oracle.judge_with_rules(features[:batch], probabilities[:batch], predicted[:batch])  # warm
        t0 = time.process_time()
        for i in range(calls):
            a = (i * batch) % (len(features) - batch)
            oracle.judge_with_rules(features[a : a + batch], probabilities[a : a + batch], predicted[a : a + batch])
        out[batch] = (time.process_time() - t0) / (calls * batch) * 1e6
    return out


def table_case(work: Path, rows: int) -> int:
    import pandas as pd

    from bench.fit.heavy_inputs import TABLE_FEATURES

    table = work / f"table-{rows}.parquet"
    proba = write_table(table, rows)
    flags = ["--proba-columns", ",".join(proba), "--label-column", "label"]
    run = run_fit(["--reference", str(table), *flags], work / "table-bundle")
    report("table", f"{rows:,} rows × {TABLE_FEATURES} feature columns, 3 classes (fit --reference, Parquet)", run)
    if run.status != 0:
        return 1
    small = work / f"table-{SMALL_TABLE_ROWS}.parquet"
    frame = pd.read_parquet(table)
    frame.iloc[:SMALL_TABLE_ROWS].to_parquet(small)
    small_run = run_fit(["--reference", str(small), *flags], work / "small-bundle")
    features = frame[[f"f{j:02d}" for j in range(TABLE_FEATURES)]].to_numpy(np.float32)[-8192:]
    probabilities = frame[proba].to_numpy(np.float32)[-8192:]
    print("\njudging cost, CPU µs per row (CompiledOracle.judge_with_rules: TDI leaves and verdicts, ADI forest):")
    print("| bundle | TDI rules | ADI forest | batch 1 | batch 256 |")
    print("|---|---|---|---|---|")
    for name, r, bdir in (
        ("table", run, work / "table-bundle"),
        ("first 20,000 rows", small_run, work / "small-bundle"),
    ):
        cost = judge_cost(bdir, features, probabilities)
        adi = (bdir / "adi.onnx").stat().st_size
        print(f"| {name} | {r.summary.get('tdi_rules')} | {adi / 1e6:.1f} MB | {cost[1]:.0f} | {cost[256]:.1f} |")
    return 0 if verdict(run, "table") == "PASS" else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="wide,table", help="comma-separated: wide, table (default both)")
    p.add_argument("--rows", type=int, default=2200, help="labeled rows of the wide case (default 2200)")
    p.add_argument("--table-rows", type=int, default=1_000_000, help="rows of the table case (default 1,000,000)")
    p.add_argument("--position-width", type=int, default=128, help="units per position of the wide model's dense layer")
    p.add_argument("--workdir", type=Path, default=None, help="where the data and bundles go (default: a temp dir)")
    args = p.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(TARGETS))
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(TARGETS)}")
    from bench.generated_docs import commit_of

    print(f"command: python -m bench.fit.heavy {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print(f"commit: {commit_of(ROOT)}; {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="fit-heavy-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        failed = 0
        if "wide" in cases:
            failed += wide_case(work, args.rows, args.position_width)
        if "table" in cases:
            failed += table_case(work, args.table_rows)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
