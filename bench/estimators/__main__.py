"""``python -m bench.estimators [--quick] [--models mnist,digits,tabular] [--reps 30] [--calibration-seeds 1,2,3,4]
[--window-sizes 100,300,3000] [--out docs/estimation.md]``

Runs the estimator benchmark and prints the tables and the targets; with ``--out docs/estimation.md`` it
also rewrites that page's generated section and its plot ``docs/img/estimation.png``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.estimators.harness import Config, Record, run_subject
from bench.estimators.report import console, markdown, plot, write_doc
from bench.estimators.subjects import LOADERS
from invariants.fit_params import FitParams


def _integers(flag: str, given: str | None, default: str, *, minimum: int) -> tuple[int, ...] | None:
    """The comma-separated integers of ``flag`` (``default`` when not given), each at least ``minimum``;
    None after printing an error."""
    spec = default if given is None else given
    try:
        values = tuple(int(v) for v in spec.split(",") if v.strip())
    except ValueError:
        values = None
    if values is None or any(v < minimum for v in values):
        print(f"error: {flag} wants comma-separated integers of at least {minimum}, got {spec!r}", file=sys.stderr)
        return None
    return values


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.estimators", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smoke test: 3 repetitions of 300 samples, small pools")
    ap.add_argument("--models", default="mnist,digits,tabular", help="comma-separated: mnist, digits, tabular")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per scenario (default 30, quick 3)")
    ap.add_argument("--size", type=int, default=None, help="operational set size (default 1000, quick 300)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--calibration-seeds",
        default=None,
        help="further seeds of shift_aware's calibration to report the spread over (comma-separated, "
        "'' for none; default 1,2,3,4, quick 1)",
    )
    ap.add_argument(
        "--window-sizes",
        default=None,
        help="further window sizes (predictions) to report shift_aware at (comma-separated, '' for none; "
        "default 100,300,3000, quick 100)",
    )
    ap.add_argument(
        "--out", default="-", help="page whose generated section to rewrite, e.g. docs/estimation.md (default: none)"
    )
    ap.add_argument("--plot", default=None, help="PNG path (default: img/estimation.png next to --out)")
    return ap


def _command(args: argparse.Namespace) -> str:
    """The command that rewrites the page as this run did (named in the generated section)."""
    cmd = f"python -m bench.estimators --out {args.out}" + (" --quick" if args.quick else "")
    if args.models != "mnist,digits,tabular":
        cmd += f" --models {args.models}"
    if args.reps:
        cmd += f" --reps {args.reps}"
    if args.size:
        cmd += f" --size {args.size}"
    if args.calibration_seeds is not None:
        cmd += f" --calibration-seeds '{args.calibration_seeds}'"
    if args.window_sizes is not None:
        cmd += f" --window-sizes '{args.window_sizes}'"
    return cmd


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in LOADERS]
    if unknown:
        print(f"error: unknown model(s) {', '.join(unknown)}; choose from {', '.join(LOADERS)}", file=sys.stderr)
        return 2
    cal_seeds = _integers("--calibration-seeds", args.calibration_seeds, "1" if args.quick else "1,2,3,4", minimum=0)
    sizes = _integers("--window-sizes", args.window_sizes, "100" if args.quick else "100,300,3000", minimum=1)
    if cal_seeds is None or sizes is None:
        return 2
    if args.quick:
        cfg = Config(
            reps=args.reps or 3,
            size=args.size or 300,
            pool_min=600,
            seed=args.seed,
            fit=FitParams(n_estimators=30, shift_sets=34),
            calibration_seeds=cal_seeds,
            window_sizes=sizes,
        )
    else:
        cfg = Config(
            reps=args.reps or 30,
            size=args.size or 1000,
            seed=args.seed,
            calibration_seeds=cal_seeds,
            window_sizes=sizes,
        )
    t0 = time.perf_counter()
    records: list[Record] = []
    titles: dict[str, str] = {}
    for name in models:
        subject = LOADERS[name]()
        titles[f"title:{name}"] = subject.title
        records += run_subject(subject, cfg, say=lambda m: print(m, file=sys.stderr, flush=True))
    print(console(records, cfg.seed, cfg.size))
    elapsed = time.perf_counter() - t0
    print(f"\n{len(records)} estimates in {elapsed:.0f}s")
    if args.out != "-":
        out = Path(args.out)
        png = Path(args.plot) if args.plot else out.parent / "img" / "estimation.png"
        plot(records, png)
        cmd = _command(args)
        meta = {
            "command": cmd,
            "settings": f"{cfg.reps} repetitions of {cfg.size} samples per scenario, seed {cfg.seed}",
            "seed": str(cfg.seed),
            "size": str(cfg.size),
            **titles,
        }
        rel = png.relative_to(out.parent) if png.is_relative_to(out.parent) else png
        write_doc(out, markdown(records, meta, str(rel)))
        print(f"wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
