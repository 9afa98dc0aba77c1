"""Benchmark: cost of a D-Score audit relative to plain inference, and the gain of one masked session.

A D-Score audit needs ``2n² + 1`` passes over the data (base model, ``n²`` region-deleted variants,
``n²`` translated test sets). This script measures, in one run and on the same data:

* ``plain``: ``2n² + 1`` forward passes of the unmodified model (one onnxruntime session);
* ``audit``: :func:`agent.audits.dscore.run.run_dscore` (graph surgery, one masked session, translation);
* ``separate``: :func:`agent.audits.dscore.run.run_dscore` with ``mode="separate_sessions"`` (``n²`` variant
  models and sessions built one by one: the baseline the mask inputs avoid).

and prints ``audit / plain`` (target ≤ 1.5) and ``separate / audit``. Each timing is the median
of ``--repeats`` interleaved runs.

    .venv/bin/python -m bench.bench_dscore [--data mnist5k|digits] [--model M.onnx] [--n 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from agent.audits.dscore.run import run_dscore
from agent.data.datasets import digits, mnist5k
from invariants.onnx_session import OnnxSession

ROOT = Path(__file__).resolve().parents[1]


def plain_passes(model_bytes: bytes, x: np.ndarray, passes: int, batch_size: int) -> float:
    """Seconds for ``passes`` forward passes over ``x`` (session creation included, as in the audit)."""
    started = time.perf_counter()
    session = OnnxSession(model_bytes)
    name = session.inputs[0].name
    for _ in range(passes):
        for i in range(0, len(x), batch_size):
            session.run({name: x[i : i + batch_size]})
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="ONNX CNN (default: the shipped model for --data)")
    ap.add_argument("--data", choices=["mnist5k", "digits"], default="mnist5k")
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--t", type=float, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)

    if args.model is None:
        args.model = str(
            ROOT / "agent" / "shipped_models" / ("mnist_cnn.onnx" if args.data == "mnist5k" else "digits_cnn.onnx")
        )
    model = Path(args.model).read_bytes()
    x, y = mnist5k() if args.data == "mnist5k" else digits()
    passes = 2 * args.n * args.n + 1
    t_plain: list[float] = []
    t_audit: list[float] = []
    t_sep: list[float] = []
    audit = separate = None
    for _ in range(args.repeats):
        t_plain.append(plain_passes(model, x, passes, args.batch_size))
        started = time.perf_counter()
        audit = run_dscore(model, x, y, n=args.n, t=args.t, batch_size=args.batch_size)
        t_audit.append(time.perf_counter() - started)
        started = time.perf_counter()
        separate = run_dscore(model, x, y, n=args.n, t=args.t, batch_size=args.batch_size, mode="separate_sessions")
        t_sep.append(time.perf_counter() - started)
    assert audit is not None and separate is not None
    same = (
        audit.variant_accuracies == separate.variant_accuracies
        and audit.translated_accuracies == separate.translated_accuracies
    )
    plain, aud, sep = (statistics.median(v) for v in (t_plain, t_audit, t_sep))
    report = {
        "model": str(args.model),
        "data": args.data,
        "samples": len(x),
        "n": args.n,
        "t": args.t,
        "batch_size": args.batch_size,
        "passes": passes,
        "repeats": args.repeats,
        "plain_seconds": plain,
        "audit_seconds": aud,
        "separate_sessions_seconds": sep,
        "audit_over_plain": aud / plain,
        "separate_over_audit": sep / aud,
        "same_accuracies": same,
        "dscore": audit.result.dscore,
        "robustness": audit.result.robustness,
        "fitness": audit.result.fitness,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"model {args.model}, {len(x)} images ({args.data}), n={args.n}, t={args.t}, batch {args.batch_size}")
        print(f"plain {passes} passes         {plain:7.3f} s")
        print(f"D-Score, one masked session  {aud:7.3f} s   audit / plain = {aud / plain:.2f}  (target <= 1.5)")
        print(
            f"D-Score, {args.n * args.n} separate sessions  {sep:7.3f} s   speed-up of one session = {sep / aud:.2f}x"
        )
        print(
            f"identical accuracies: {same}; D-Score {audit.result.dscore:.4f} (robust {audit.result.robustness:.4f},"
            f" fitness {audit.result.fitness:.4f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
