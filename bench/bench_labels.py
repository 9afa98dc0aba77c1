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
absolute error, the interval coverage (share of windows whose 95% interval holds the truth) over all
windows and on the scenario where it is lowest, and the mean interval half-width; then the targets
at 200 labels per window (worst scenario's error ≤ 0.05, coverage ≥ 90% on every scenario). The
estimate uses the model's confidence and the labels only, not ``shift_aware``'s calibration, so the
estimator benchmark's held-out-kind protocol changes nothing here. The label-free estimators on the
same scenarios are in the estimator benchmark (docs/estimation.md).

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
    test_x = m.prepare_array(subject.test_x)
    out: list[Result] = []
    for sc in scenarios_for(subject):
        t0 = time.perf_counter()
        pool_x, pool_y, seg_len, class_index = scenario_pool(subject, sc, cfg, test_x)
        pred = m.predict_batched(pool_x)
        correct_pool = pred.predicted == pool_y
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


Row = tuple[str, int, str, float, float, float, float, float]


def _covered(rs: list[Result]) -> float:
    return float(np.mean([r.lower - 1e-12 <= r.truth <= r.upper + 1e-12 for r in rs]))


def summary(results: list[Result]) -> list[Row]:
    """``(model, labels, method, mean abs error, worst scenario's mean abs error, coverage, lowest
    scenario's coverage, mean half-width)`` rows (coverages and half-width NaN for ``avg_conf``)."""
    groups: dict[tuple[str, int, str], list[Result]] = defaultdict(list)
    for r in results:
        groups[(r.model, r.labels, r.method)].append(r)
    rows = []
    for (model, n, method), rs in groups.items():
        err = np.array([abs(r.value - r.truth) for r in rs])
        by_sc: dict[str, list[Result]] = defaultdict(list)
        for r in rs:
            by_sc[r.scenario].append(r)
        worst = max(float(np.mean([abs(r.value - r.truth) for r in v])) for v in by_sc.values())
        interval = method != "avg_conf"
        cover = _covered(rs) if interval else np.nan
        lowest = min(_covered(v) for v in by_sc.values()) if interval else np.nan
        half = float(np.mean([(r.upper - r.lower) / 2 for r in rs])) if interval else np.nan
        rows.append((model, n, method, float(err.mean()), worst, cover, lowest, half))
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(rows, key=lambda r: (r[0], r[1], order[r[2]]))


def _num(v: float, pct: bool = False) -> str:
    return "–" if np.isnan(v) else (f"{v:.0%}" if pct else f"{v:.3f}")


def table(rows: list[Row]) -> str:
    lines = [
        "| model | labels | estimate | mean abs error | worst scenario | coverage of the 95% interval"
        " | lowest scenario coverage | mean half-width |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, n, method, mae, worst, cover, lowest, half in rows:
        lines.append(
            f"| {model} | {n or '–'} | {method} | {mae:.3f} | {worst:.3f} | {_num(cover, True)}"
            f" | {_num(lowest, True)} | {_num(half)} |"
        )
    return "\n".join(lines)


#: the targets at this many labels per window: worst scenario's error, every scenario's coverage
TARGET_LABELS, TARGET_WORST, TARGET_COVERAGE = 200, 0.05, 0.90


def targets(rows: list[Row]) -> str:
    """The label-assisted targets per model (at :data:`TARGET_LABELS` labels), against the
    label-free average confidence and the labels alone measured in the same run."""
    lines = [
        f"| model | {WITH_LABELS}: worst scenario ≤ {TARGET_WORST} | every scenario's coverage ≥ "
        f"{TARGET_COVERAGE:.0%} | labels alone (worst / lowest coverage) | avg_conf worst |",
        "|---|---|---|---|---|",
    ]
    by = {(r[0], r[1], r[2]): r for r in rows}
    for model in dict.fromkeys(r[0] for r in rows):
        ppi, alone = by.get((model, TARGET_LABELS, WITH_LABELS)), by.get((model, TARGET_LABELS, "labels_only"))
        free = by.get((model, 0, "avg_conf"))
        if ppi is None or alone is None or free is None:
            continue
        ok_w, ok_c = ppi[4] <= TARGET_WORST, ppi[6] >= TARGET_COVERAGE
        lines.append(
            f"| {model} | {ppi[4]:.3f} {'PASS' if ok_w else 'FAIL'} | {ppi[6]:.0%} {'PASS' if ok_c else 'FAIL'}"
            f" | {alone[4]:.3f} / {alone[6]:.0%} | {free[4]:.3f} |"
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
    rows = summary(results)
    print(table(rows))
    if TARGET_LABELS in counts:
        print(f"\nTargets ({TARGET_LABELS} labels per window of {args.size}):\n")
        print(targets(rows))
    took = time.perf_counter() - t0
    print(f"\n{len(results)} estimates in {took:.0f}s ({args.reps} windows of {args.size} per scenario)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
