"""Benchmark: accuracy from a few labels. On every scenario of the estimator benchmark (the same
models, shifted pools and window draws as ``python -m bench.estimators``), a window of ``--size``
predictions gets the true labels of ``n`` of them, drawn uniformly at random, for every ``n`` of
``--labels``; three estimates of the window's accuracy are compared with the truth:

* ``with_labels`` — the agent's prediction-powered estimate (PPI++,
  :func:`agent.estimation.prediction_powered.prediction_powered_accuracy`): the window's confidence
  sums plus the labeled sample's correction, as a live agent computes it from its labeling sample;
* ``labels_only`` — the accuracy of the ``n`` labeled predictions alone, with its Wilson interval
  (what a user without the agent's estimate would report);
* ``avg_conf`` — the label-free average confidence, for reference (no interval).

Prints, per model and ``n``: the mean absolute error over all windows, the worst scenario's mean
absolute error, the interval coverage (share of windows whose 95% interval holds the truth) and the
mean interval half-width. The label-free estimators on the same scenarios are in the estimator
benchmark (docs/estimation.md).

    python -m bench.bench_labels [--models mnist,digits,tabular] [--reps 100] [--size 1000] [--labels 25,50,100,200,500]
    python -m bench labels
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from agent.estimation.intervals import wilson
from agent.estimation.prediction_powered import WITH_LABELS, prediction_powered_accuracy
from bench.estimators.harness import Config, draw_window, scenario_pool, scenarios_for, stable_seed
from bench.estimators.subjects import LOADERS

METHODS = (WITH_LABELS, "labels_only", "avg_conf")


@dataclass(frozen=True)
class Result:
    model: str
    scenario: str
    labels: int
    method: str
    value: float
    lower: float
    upper: float
    truth: float


def run_model(
    name: str, cfg: Config, label_counts: tuple[int, ...], say: Callable[[str], None] = print
) -> list[Result]:
    """Every scenario's windows of model ``name``, each estimated with every count of labels."""
    subject = LOADERS[name]()
    m = subject.model
    test_x = m.prepare(subject.test_x)
    out: list[Result] = []
    for sc in scenarios_for(subject):
        t0 = time.perf_counter()
        pool_x, pool_y, seg_len, class_index = scenario_pool(subject, sc, cfg, test_x)
        pred = m.predict_batched(pool_x)
        correct_pool = pred.labels == pool_y
        for rep in range(cfg.reps):
            rng = np.random.default_rng(stable_seed(cfg.seed, name, sc.name, rep, "labels"))
            idx = draw_window(rng, sc, cfg.size, seg_len, class_index)
            conf = pred.confidences[idx].astype(np.float64)
            correct = correct_pool[idx]
            truth = float(correct.mean())
            f_sum, f_sq = float(conf.sum()), float((conf * conf).sum())
            out.append(Result(name, sc.name, 0, "avg_conf", f_sum / len(idx), np.nan, np.nan, truth))
            for n in label_counts:
                s = rng.choice(len(idx), size=min(n, len(idx)), replace=False)
                e = prediction_powered_accuracy(len(idx), f_sum, f_sq, conf[s], correct[s])
                assert e is not None
                out.append(Result(name, sc.name, n, WITH_LABELS, e.value, e.lower, e.upper, truth))
                k = int(correct[s].sum())
                lo, hi = wilson(k, len(s))
                out.append(Result(name, sc.name, n, "labels_only", k / len(s), lo, hi, truth))
        say(f"[{name}] {sc.name:28s} pool accuracy {float(correct_pool.mean()):.3f} ({time.perf_counter() - t0:.1f}s)")
    return out


def summary(results: list[Result]) -> list[tuple[str, int, str, float, float, float, float]]:
    """``(model, labels, method, mean abs error, worst scenario's mean abs error, coverage, mean
    half-width)`` rows (coverage and half-width NaN for ``avg_conf``)."""
    groups: dict[tuple[str, int, str], list[Result]] = defaultdict(list)
    for r in results:
        groups[(r.model, r.labels, r.method)].append(r)
    rows = []
    for (model, n, method), rs in groups.items():
        err = np.array([abs(r.value - r.truth) for r in rs])
        by_sc: dict[str, list[float]] = defaultdict(list)
        for r, e in zip(rs, err, strict=True):
            by_sc[r.scenario].append(float(e))
        worst = max(float(np.mean(v)) for v in by_sc.values())
        lo, hi, truth = (np.array([getattr(r, a) for r in rs]) for a in ("lower", "upper", "truth"))
        cover = float(np.mean((lo - 1e-12 <= truth) & (truth <= hi + 1e-12))) if method != "avg_conf" else np.nan
        half = float(np.mean((hi - lo) / 2)) if method != "avg_conf" else np.nan
        rows.append((model, n, method, float(err.mean()), worst, cover, half))
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(rows, key=lambda r: (r[0], r[1], order[r[2]]))


def table(rows: list[tuple[str, int, str, float, float, float, float]]) -> str:
    def num(v: float, pct: bool = False) -> str:
        return "–" if np.isnan(v) else (f"{v:.0%}" if pct else f"{v:.3f}")

    lines = [
        "| model | labels | estimate | mean abs error | worst scenario | coverage of the 95% interval"
        " | mean half-width |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, n, method, mae, worst, cover, half in rows:
        lines.append(
            f"| {model} | {n or '–'} | {method} | {mae:.3f} | {worst:.3f} | {num(cover, True)} | {num(half)} |"
        )
    return "\n".join(lines)


def _counts(spec: str) -> tuple[int, ...] | None:
    try:
        values = tuple(int(v) for v in spec.split(",") if v.strip())
    except ValueError:
        return None
    return values if values and all(v >= 1 for v in values) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_labels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mnist,digits,tabular", help="comma-separated: mnist, digits, tabular")
    ap.add_argument("--reps", type=int, default=100, help="windows per scenario (default 100)")
    ap.add_argument("--size", type=int, default=1000, help="predictions per window (default 1000)")
    ap.add_argument("--labels", default="25,50,100,200,500", help="labeled predictions per window (comma-separated)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in LOADERS]
    counts = _counts(args.labels)
    if unknown or counts is None or args.reps < 1 or args.size < 2:
        why = f"unknown model(s) {', '.join(unknown)}" if unknown else "--labels, --reps or --size out of range"
        print(f"error: {why}; models: {', '.join(LOADERS)}; --labels: comma-separated integers ≥ 1", file=sys.stderr)
        return 2
    cfg = Config(reps=args.reps, size=args.size, seed=args.seed)
    t0 = time.perf_counter()
    results: list[Result] = []
    for name in models:
        results += run_model(name, cfg, counts, say=lambda s: print(s, file=sys.stderr, flush=True))
    print(table(summary(results)))
    took = time.perf_counter() - t0
    print(f"\n{len(results)} estimates in {took:.0f}s ({args.reps} windows of {args.size} per scenario)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
