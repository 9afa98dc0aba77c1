"""Benchmark: which of two model versions is more accurate on the same traffic, with an interval.

Model versions whose truth is known (:mod:`bench.challenger.pairs`: a CNN and a narrower one, the same recipe
with another seed, the CNN retrained on drifted data, each both ways round, a model paired with itself; the
digits CNN and a perceptron; a tabular MLP, another seed and a retrained one) are compared on every scenario
of the estimator benchmark (the same shifted pools and window draws as ``python -m bench.estimators``), each
pair calibrated as ``icos-agent fit --champion`` calibrates it. Per window the agent's label-free paired
difference and its label-assisted one (labels drawn on the disagreements) are compared with the window's true
difference, beside an unpaired baseline (two ``with_labels`` estimates at the same number of labels) and the
label-free interval without its model-error term or with it at the 95% quantile.

Prints the targets with PASS/FAIL (label-free coverage ≥ 0.90 and wrong calls ≤ 0.02 in every direction,
challenger better, equal and worse; the label-assisted width at most half the unpaired one), the designs by
direction, the agent's design by family and direction, and with ``--scenarios`` every (pair, scenario).
Exits 1 when a target fails.

    python -m bench.challenger [--quick] [--families mnist,digits,tabular] [--reps 30] [--size 1000]
        [--labels 100] [--seed 0] [--scenarios] [--json FILE] [--out docs/challenger.md]

``--quick``: the digits and tabular families, 6 windows per scenario and 24 corrupted copies per pair (about
a minute; the integration test runs it). ``--example`` runs docs/challenger.md's worked example instead
(:mod:`bench.challenger.example`: ``icos-agent fit`` and ``check --challenger`` as a user runs them) and, with
``--out``, writes its block.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from bench.challenger.example import example
from bench.challenger.pairs import FAMILIES
from bench.challenger.report import Summary
from bench.challenger.run import Record, run_family
from bench.estimators.harness import Config
from bench.generated_docs import provenance, write_block

ROOT = Path(__file__).resolve().parents[2]
#: The block of docs/challenger.md this benchmark rewrites (``--out docs/challenger.md``).
DOC_BEGIN = "<!-- BEGIN GENERATED: python -m bench.challenger --out docs/challenger.md -->"
EXAMPLE_BEGIN = "<!-- BEGIN GENERATED: python -m bench.challenger --example --out docs/challenger.md -->"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.challenger", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="digits and tabular, 6 windows per scenario, 24 copies")
    ap.add_argument("--families", default=None, help=f"comma-separated: {', '.join(FAMILIES)} (default all)")
    ap.add_argument("--reps", type=int, default=None, help="windows per (pair, scenario) (default 30)")
    ap.add_argument("--size", type=int, default=1000, help="predictions per window (default 1000)")
    ap.add_argument("--labels", type=int, default=100, help="labels per window for the labeled designs (default 100)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scenarios", action="store_true", help="also print every (pair, scenario)")
    ap.add_argument("--json", type=Path, default=None, help="write every record here")
    ap.add_argument("--out", type=Path, default=None, help="also write the tables into this page (docs/challenger.md)")
    ap.add_argument("--example", action="store_true", help="run the worked example of docs/challenger.md instead")
    args = ap.parse_args(argv)
    if args.example:
        text = example()
        print(text)
        if args.out is not None:
            command = f"python -m bench.challenger --example --out {args.out}"
            write_block(args.out, EXAMPLE_BEGIN, provenance(command, ROOT) + "\n\n" + text)
        return 0
    names = (args.families or ("digits,tabular" if args.quick else ",".join(FAMILIES))).split(",")
    unknown = [n for n in names if n not in FAMILIES]
    if unknown or args.size < 2 or args.labels < 1:
        print(f"error: unknown famil(ies) {unknown} or --size/--labels out of range", file=sys.stderr)
        return 2
    reps = args.reps or (6 if args.quick else 30)
    cfg = Config(reps=reps, size=args.size, seed=args.seed)
    if args.quick:
        cfg = replace(cfg, fit=replace(cfg.fit, shift_sets=24))
    t0 = time.perf_counter()
    records: list[Record] = []
    errors: dict[str, list[float]] = {}
    for name in names:
        recs, cals = run_family(name, FAMILIES[name](), cfg, args.labels, say=_say)
        records += recs
        errors.update({f"{name} {k}": list(c.error) for k, c in cals.items()})
    summary = Summary(records)
    took = time.perf_counter() - t0
    out = summary.markdown(per_scenario=args.scenarios)
    out += (
        f"\n\n{len(records)} estimates in {took:.0f}s: families {', '.join(names)}, {reps} windows of {args.size} "
        f"per (pair, scenario), {args.labels} labels per window, seed {args.seed}"
    )
    print(out)
    if args.json is not None:
        args.json.write_text(json.dumps({"records": [asdict(r) for r in records], "model_error": errors}))
    if args.out is not None:
        command = f"python -m bench.challenger --out {args.out}"
        write_block(args.out, DOC_BEGIN, provenance(command, ROOT) + "\n\n" + out)
    return 0 if all(t.passed for t in summary.targets()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
