"""Benchmark: accuracy from a few labels. On every scenario of the estimator benchmark (the same
models, shifted pools and window draws as ``python -m bench.estimators``), a window of ``--size``
predictions gets the true labels of ``n`` of them, drawn uniformly at random, for every ``n`` of
``--labels``; three estimates of the window's accuracy are compared with the truth:

* ``with_labels`` — the agent's prediction-powered estimate (PPI++,
  :func:`agent.estimation.estimators.prediction_powered.prediction_powered_accuracy`): the window's confidence
  sums plus the labeled sample's correction, as a live agent computes it from its labeling sample;
* ``labels_only`` — the accuracy of the ``n`` labeled predictions alone, with its Wilson interval
  (what a user without the agent's estimate would report);
* ``avg_conf`` — the label-free average confidence, for reference (no interval).

* ``active`` — active labeling (:mod:`agent.estimation.estimators.active`): the same expected number of
  labels, each prediction drawn with probability growing with the calibrated predictor's uncertainty
  (:class:`agent.estimation.estimators.correctness.CorrectnessModel`, fitted on the model's calibration split and
  judged by its oracle, as ``icos-agent fit`` does), estimated by the inverse-probability-weighted
  prediction-powered accuracy. The traffic's mean uncertainty is the window's own (a steady rate).

Prints, per model and ``n``: the mean absolute error over all windows, the worst scenario's mean
absolute error, the interval coverage (share of windows whose 95% interval holds the truth) over all
windows and on the scenario where it is lowest, and the mean interval half-width; then the targets
at 200 labels per window (worst scenario's error ≤ 0.05, coverage ≥ 90% on every scenario); then
"how many labels do I need": per model, the labels ``active`` needs (interpolated on its half-width
curve) to reach the mean half-width of uniform sampling's ``with_labels`` at 100 and 200 labels
(target: at most half), with ``active``'s lowest scenario coverage and worst scenario error. The
estimate uses the model's confidence and the labels only, not ``shift_aware``'s calibration, so the
estimator benchmark's held-out-kind protocol changes nothing here. The label-free estimators on the
same scenarios are in the estimator benchmark (docs/estimation.md).

    python -m bench.labels [--models mnist,digits,tabular] [--reps 100] [--size 1000] [--labels 25,50,100,200,500]
        [--out docs/labels.md]
    python -m bench labels
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.estimation.estimators.active import (
    DEFAULT_FLOOR,
    active_accuracy,
    draw_probabilities,
    rate_for,
    uncertainty,
)
from agent.estimation.estimators.correctness import CorrectnessModel
from agent.estimation.estimators.prediction_powered import WITH_LABELS, LabeledEstimate, prediction_powered_accuracy
from agent.estimation.intervals import wilson
from bench.estimators.harness import Config, draw_window, fit_subject, scenario_pool, scenarios_for, stable_seed
from bench.estimators.subjects import LOADERS, Subject
from bench.generated_docs import END, provenance, write_block
from bench.label_curves import labels_for
from bench.labels.draws import ACTIVE, STRATIFIED, stratified_draw
from invariants.oracle import Oracle

METHODS = (WITH_LABELS, ACTIVE, STRATIFIED, "labels_only", "avg_conf")
#: designs whose label count is an expected one, measured on :data:`ACTIVE_GRID` too
DESIGNS = (ACTIVE, STRATIFIED)

#: label counts of ``active`` besides ``--labels``: the curve its half-width is interpolated on
ACTIVE_GRID = (25, 35, 50, 70, 100, 140, 200)
#: uniform sampling's label counts whose half-width ``active`` is asked to reach
NEED_AT = (100, 200)
#: the target: ``active`` reaches uniform's half-width with at most this share of its labels
TARGET_SHARE = 0.5


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


def fit_predictor(subject: Subject, cfg: Config) -> tuple[Oracle, CorrectnessModel]:
    """The subject's oracle and calibrated correctness predictor, as ``icos-agent fit`` fits them
    (TDI and ADI on the training and validation splits, the predictor on the calibration split)."""
    fit = fit_subject(subject, cfg)
    oracle = Oracle(None, fit.fitted.oracle.tdi, fit.fitted.oracle.adi)
    cal_pred, cal_y = fit.cal_pred, fit.cal_y
    res = oracle.judge(subject.model.features(fit.cal_x), cal_pred.probabilities, cal_pred.predicted)
    return oracle, CorrectnessModel.fit(cal_pred.confidences, cal_pred.predicted == cal_y, res.failed)


def run_model(
    name: str,
    cfg: Config,
    label_counts: tuple[int, ...],
    say: Callable[[str], None] = print,
    floor: float = DEFAULT_FLOOR,
) -> list[Result]:
    """Every scenario's windows of model ``name``, each estimated with every count of labels."""
    subject = LOADERS[name]()
    m = subject.model
    test_x = m.prepare_array(subject.test_x)
    oracle, predictor = fit_predictor(subject, cfg)
    active_counts = tuple(sorted(set(label_counts) | set(ACTIVE_GRID)))
    out: list[Result] = []
    for sc in scenarios_for(subject):
        t0 = time.perf_counter()
        pool_x, pool_y, seg_len, class_index = scenario_pool(subject, sc, cfg, test_x)
        pred = m.predict_batched(pool_x)
        correct_pool = pred.predicted == pool_y
        failed = oracle.judge(m.features(pool_x), pred.probabilities, pred.predicted).failed
        f_pool = predictor.predict(pred.confidences, failed)
        # the segments of the predicted-class dimension (the estimator benchmark's models have no others)
        n_segments = int(pred.probabilities.shape[1])
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
            f = f_pool[idx]
            mean_u = float(uncertainty(f).mean())
            for n in active_counts:
                pi = draw_probabilities(f, rate_for(f, n / len(idx), mean_u, floor), mean_u, floor)
                s = np.flatnonzero(rng.random(len(idx)) < pi)
                a = active_accuracy(f, s, correct[s], pi[s])
                if a is None:  # no prediction drawn: the window has no label-assisted estimate
                    a = LabeledEstimate(0.0, 0.0, 1.0, len(idx), 0)
                out.append(Result(name, sc.name, n, ACTIVE, a.value, a.lower, a.upper, truth))
                st = stratified_draw(rng, f, correct, pred.predicted[idx][None, :], n_segments, n, floor)
                out.append(Result(name, sc.name, n, STRATIFIED, st.value, st.lower, st.upper, truth))
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


def labels_needed(rows: list[Row], at: int, design: str = ACTIVE) -> tuple[float, float, float] | None:
    """``(uniform's half-width at ``at`` labels, the labels ``design`` needs for it, their share of
    ``at``)`` for one model's rows (see :func:`bench.label_curves.labels_for`)."""
    uni = [r for r in rows if r[1] == at and r[2] == WITH_LABELS]
    curve = [(r[1], r[7]) for r in rows if r[2] == design]
    if not uni or len(curve) < 2:
        return None
    need = labels_for(curve, uni[0][7])
    return uni[0][7], need, need / at


def scenario_shares(results: list[Result], model: str, at: int, design: str) -> dict[str, float]:
    """Per scenario of ``model``: the share of uniform's ``at`` labels ``design`` needs for uniform's mean
    half-width in that scenario."""
    half: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    for r in results:
        if r.model == model and r.method in (WITH_LABELS, design):
            half[(r.scenario, r.labels, r.method)].append((r.upper - r.lower) / 2)
    out = {}
    for sc in dict.fromkeys(k[0] for k in half):
        uni = half.get((sc, at, WITH_LABELS))
        curve = [(n, float(np.mean(v))) for (s2, n, m), v in half.items() if s2 == sc and m == design]
        if uni and len(curve) >= 2:
            out[sc] = labels_for(curve, float(np.mean(uni))) / at
    return out


def _coverage_with_se(results: list[Result], model: str, at: int, design: str) -> tuple[float, float, int]:
    """The lowest scenario coverage of ``design`` at ``at`` labels, its binomial standard error and windows."""
    by_sc: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        if r.model == model and r.labels == at and r.method == design:
            by_sc[r.scenario].append(r)
    if not by_sc:
        return math.nan, math.nan, 0
    sc = min(by_sc, key=lambda k: _covered(by_sc[k]))
    c, n = _covered(by_sc[sc]), len(by_sc[sc])
    return c, math.sqrt(max(c * (1 - c), 1e-12) / n), n


def needs_table(rows: list[Row], results: list[Result] | None = None) -> str:
    """Per model, design (:data:`DESIGNS`) and uniform label count of :data:`NEED_AT`: the labels the design
    needs for uniform's mean half-width (over all scenarios; with ``results``, also the largest share any one
    scenario needs), the design's lowest scenario coverage (± its binomial standard error) and worst scenario
    error there."""
    lines = [
        f"| model | design | uniform labels | uniform half-width | labels needed (target ≤ {TARGET_SHARE:.0%}) |"
        f" worst scenario (≤ {TARGET_SCENARIO_SHARE:.0%}) | lowest scenario coverage | worst scenario error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by = {(r[0], r[1], r[2]): r for r in rows}
    for model in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == model]
        for design in DESIGNS:
            for at in NEED_AT:
                got, act = labels_needed(mine, at, design), by.get((model, at, design))
                if got is None or act is None:
                    continue
                goal, need, share = got
                verdict = "PASS" if share <= TARGET_SHARE else "FAIL"
                needed = "more than measured" if math.isinf(need) else f"{need:.0f} ({share:.0%}) {verdict}"
                worst_share = "–"
                if results is not None:
                    shares = scenario_shares(results, model, at, design)
                    if shares:
                        sc, top = max(shares.items(), key=lambda kv: kv[1])
                        ok = "PASS" if top <= TARGET_SCENARIO_SHARE else "FAIL"
                        worst_share = "more than measured" if math.isinf(top) else f"{top:.0%} {ok} ({sc})"
                cover = "PASS" if act[6] >= TARGET_COVERAGE else "FAIL"
                se = ""
                if results is not None:
                    _c, err, n = _coverage_with_se(results, model, at, design)
                    se = f" ± {err:.0%} of {n}"
                worst = "" if at != TARGET_ACTIVE_ERROR_AT else (" PASS" if act[4] <= TARGET_WORST else " FAIL")
                lines.append(
                    f"| {model} | {design} | {at} | {goal:.3f} | {needed} | {worst_share} |"
                    f" {act[6]:.0%}{se} {cover} | {act[4]:.3f}{worst} |"
                )
    return "\n".join(lines)


def ceiling_table(ceilings: list[tuple[str, str, float, float]], floor: float) -> str:
    """Per model: the mean over its windows of :func:`bench.labels.draws.stratified_ceiling` at ``floor`` and with
    no floor, each with the scenario whose mean is highest, and whether :data:`TARGET_SHARE` is within reach."""
    lines = [
        f"| model | windows | least share at floor {floor:g} | highest scenario | with no floor | highest scenario"
        f" | target ≤ {TARGET_SHARE:.0%} |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in dict.fromkeys(c[0] for c in ceilings):
        mine = [c for c in ceilings if c[0] == model]
        cells = []
        for k in (2, 3):
            by_sc: dict[str, list[float]] = defaultdict(list)
            for c in mine:
                by_sc[c[1]].append(float(c[k]))
            sc, top = max(((sc, float(np.mean(v))) for sc, v in by_sc.items()), key=lambda kv: kv[1])
            cells.append((float(np.mean([c[k] for c in mine])), sc, top))
        (at, sc_at, top_at), (free, sc_free, top_free) = cells
        reach = (
            "within reach"
            if at <= TARGET_SHARE
            else ("only with a lower floor" if free <= TARGET_SHARE else "out of reach")
        )
        lines.append(
            f"| {model} (localized) | {len(mine)} | {at:.0%} | {top_at:.0%} ({sc_at}) | {free:.0%}"
            f" | {top_free:.0%} ({sc_free}) | {reach} |"
        )
    return "\n".join(lines)


#: no scenario may need more than this share of uniform's labels
TARGET_SCENARIO_SHARE = 1.05
#: active's worst scenario error target (≤ :data:`TARGET_WORST`) is at this many labels
TARGET_ACTIVE_ERROR_AT = 100
DOC_HEADING = "## How many labels do I need"


def _write_doc(path: Path, command: str, generated: str) -> None:
    """Rewrite the generated block under :data:`DOC_HEADING` (the page and section made if missing)."""
    begin = f"<!-- BEGIN GENERATED: {command} -->"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Labels\n"
    if begin not in text:
        if DOC_HEADING not in text:
            text = text.rstrip() + f"\n\n{DOC_HEADING}\n\n"
        head = text.index(DOC_HEADING) + len(DOC_HEADING)
        text = text[:head] + f"\n\n{begin}\n{END}\n" + text[head:].lstrip("\n")
        path.write_text(text, encoding="utf-8")
    write_block(path, begin, generated)


def _counts(spec: str) -> tuple[int, ...] | None:
    try:
        values = tuple(int(v) for v in spec.split(",") if v.strip())
    except ValueError:
        return None
    return values if values and all(v >= 1 for v in values) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.labels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mnist,digits,tabular", help="comma-separated: mnist, digits, tabular")
    ap.add_argument("--reps", type=int, default=100, help="windows per scenario (default 100)")
    ap.add_argument("--size", type=int, default=1000, help="predictions per window (default 1000)")
    ap.add_argument("--labels", default="25,50,100,200,500", help="labeled predictions per window (comma-separated)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--floor", type=float, default=DEFAULT_FLOOR, help=f"active draws' uniform floor (default {DEFAULT_FLOOR})"
    )
    ap.add_argument(
        "--localized",
        choices=("none", "quick", "full"),
        default="full",
        help="windows with a localized drop (the localization benchmark's faults): every model, two with"
        " fewer trees (quick), or none (default full)",
    )
    ap.add_argument("--localized-reps", type=int, default=40, help="windows per injected fault (default 40)")
    ap.add_argument("--out", type=Path, default=None, help="also write the tables into this page (docs/labels.md)")
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
        results += run_model(name, cfg, counts, say=lambda s: print(s, file=sys.stderr, flush=True), floor=args.floor)
    if args.localized != "none":
        from bench.labels.localized import Ceiling, run_localized

        ceilings: list[Ceiling] = []
        local = run_localized(
            tuple(sorted(set(counts) | set(ACTIVE_GRID))),
            quick=args.localized == "quick",
            reps=args.localized_reps,
            size=args.size,
            seed=args.seed,
            floor=args.floor,
            say=lambda s: print(s, file=sys.stderr, flush=True),
            ceilings=ceilings,
        )
        # uniform draws at every count of the grid too: the per-scenario shares interpolate on both curves
        results += [Result(f"{o[0]} (localized)", *o[1:]) for o in local]
    rows = summary(results)
    parts = [table(rows)]
    if TARGET_LABELS in counts:
        parts.append(f"Targets ({TARGET_LABELS} labels per window of {args.size}):\n\n{targets(rows)}")
    parts.append(
        f"How many labels active and stratified draws need for uniform draws' interval (windows of {args.size},"
        f" {args.reps} per scenario of the estimator benchmark, {args.localized_reps} per injected fault of"
        f" the localized ones):\n\n{needs_table(rows, results)}"
    )
    if args.localized != "none":
        parts.append(
            "The least the stratified design could need on the localized windows, had it known every stratum's"
            " errors from the start (`bench.labels.draws.stratified_ceiling`: per window, the share of uniform"
            " draws' labels for the same variance, the best row of strata; the mean over windows, and the scenario"
            f" where it is highest):\n\n{ceiling_table(ceilings, args.floor)}"
        )
    took = time.perf_counter() - t0
    parts.append(f"{len(results)} estimates in {took:.0f}s ({args.reps} windows of {args.size} per scenario)")
    out = "\n\n".join(parts)
    print(out)
    if args.out is not None:
        command = "python -m bench.labels --out " + str(args.out)
        ran = "python -m bench.labels " + " ".join(argv if argv is not None else sys.argv[1:])
        root = Path(__file__).resolve().parents[2]
        _write_doc(args.out, command, provenance(ran.strip(), root) + "\n\n" + out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
