"""Where is the drop? Faults injected into one segment of real models' inputs, and whether each window's
segment table names that segment (docs/diagnosis.md).

    python -m bench.localization [--quick] [--out docs/diagnosis.md] [--workdir DIR]

Models of the zoo (:mod:`bench.zoo`), each fitted as ``icos-agent fit`` fits it: ``tabular_categorical`` (a
scikit-learn pipeline over numeric and categorical columns), ``lightgbm`` (numeric columns only),
``text_tfidf`` (free text) and ``mnist_cnn`` (images). Faults (:mod:`bench.localization.runs`): a numeric column
zeroed in the rows of one category, a new subpopulation (a category value never seen at fit), the inputs of
one region of a text view changing vocabulary, of one region of an image view blurred, and one class's
images darkened. Every window draws its rows from the judged test split, faulted or clean, and reads them as
an agent would.

Targets (the issue's): on faulted windows, the injected segment ranked first in ≥ 80% and in the top two in
≥ 95%, its estimated accuracy within 0.05 of its true accuracy in ≥ 80%; on clean windows, no segment's
contribution above 0.02 in ≥ 95%. Each is printed with PASS or FAIL. ``--quick`` (a test runs it) fits two
models with fewer trees and draws fewer windows; its figures are not the benchmark's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.generated_docs import provenance, write_block
from bench.label_curves import labels_for
from bench.localization.runs import (
    CLEAN_CONTRIBUTION,
    ESTIMATE_TOLERANCE,
    FAULTS,
    FOCUS_GRID,
    LABELS,
    NO_LABEL_HALF,
    Outcome,
    Run,
    fit_subject,
    run_subject,
)
from invariants.fit_params import FitParams

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python -m bench.localization"
BEGIN = f"<!-- BEGIN GENERATED: {COMMAND} -->"
#: model → the kind of faults it gets
MODELS = {
    "tabular_categorical": "tabular",
    "lightgbm": "numeric_table",
    "text_tfidf": "text",
    "mnist_cnn": "image",
}
QUICK_MODELS = ("tabular_categorical", "mnist_cnn")
#: (name, share of windows needed, what it counts)
TARGETS = (
    ("injected segment ranked first", 0.80),
    ("injected segment in the top two", 0.95),
    (f"its realized accuracy ({LABELS} labels drawn) within {ESTIMATE_TOLERANCE} of its truth", 0.80),
    ("its label-free interval covers its truth, or it says it cannot be estimated", 0.90),
    (f"clean windows: no segment changed, no contribution above {CLEAN_CONTRIBUTION}", 0.95),
)


def _share(flags: Sequence[bool]) -> float:
    return float(np.mean(flags)) if flags else float("nan")


def figures(run: Run) -> list[tuple[str, float, float, int]]:
    """Every target: its name, the share of windows meeting it, the share needed and the windows counted."""
    f, c = run.faulted, run.clean
    measured = (
        [o.first for o in f],
        [o.top_two for o in f],
        [o.close for o in f],
        [o.honest for o in f],
        [o.quiet for o in c],
    )
    return [(name, _share(m), need, len(m)) for (name, need), m in zip(TARGETS, measured, strict=True)]


#: labels drawn where the changes are may need at most this share of uniform draws' for the target's interval
LABEL_SHARE = 0.5


def label_needs(run: Run) -> list[tuple[str, int, float, float, float]]:
    """Per model, then over every model: ``(model, windows, the target's mean realized half-width from`` LABELS
    ``uniform draws, its mean half-width from as many drawn where the changes are, the labels those draws need
    for uniform's half-width)`` (interpolated on :data:`FOCUS_GRID`'s curve; a window whose target drew no label
    counts :data:`NO_LABEL_HALF`)."""
    out = []
    models = [*dict.fromkeys(o.model for o in run.faulted), "every model"]
    for model in models:
        group = [o for o in run.faulted if o.focused_halves and model in (o.model, "every model")]
        if not group:
            continue
        uniform = float(np.mean([o.uniform_half for o in group]))
        curve = [(n, float(np.mean([o.focused_halves[i] for o in group]))) for i, n in enumerate(FOCUS_GRID)]
        out.append((model, len(group), uniform, dict(curve)[LABELS], labels_for(curve, uniform)))
    return out


def _row(group: Sequence[Outcome]) -> str:
    o = group[0]
    errors = [abs(x.realized - x.truth) for x in group if x.realized is not None and x.truth is not None]
    truths = [x.truth for x in group if x.truth is not None]
    labels = [float(x.realized_n) for x in group]
    return (
        f"| {o.model} | {o.fault} | {o.target_name[:48]} | {len(group)} | {np.mean([x.retained for x in group]):.2f} | "
        f"{np.mean(truths) if truths else float('nan'):.3f} | {_share([x.first for x in group]):.2f} | "
        f"{_share([x.top_two for x in group]):.2f} | {_share([not x.estimable for x in group]):.2f} | "
        f"{_share([x.honest for x in group]):.2f} | "
        f"{np.mean(labels):.0f} | {_share([x.close for x in group]):.2f} | "
        f"{np.mean(errors) if errors else float('nan'):.3f} | {group[0].top[:40]} |"
    )


def report(run: Run, *, quick: bool, seconds: float) -> str:
    """The generated block: every target with PASS/FAIL, then each injection and the clean windows."""
    lines = [provenance(COMMAND + (" --quick" if quick else ""), ROOT), ""]
    lines += ["| target | measured | needed | windows | |", "|---|---|---|---|---|"]
    for name, got, need, n in figures(run):
        verdict = "PASS" if got >= need else "FAIL"
        lines.append(f"| {name} | {got:.2f} | {need:.2f} | {n} | **{verdict}** |")
    lines += [
        "",
        "Each injection: the windows drawn, the share of its broken rows the agent still finds in the target "
        "(inputs that moved to another region leave it), the target's true accuracy in them, how often it "
        "ranked first and in the top two, how often it said its inputs changed so that no label-free estimate "
        "holds, how often its label-free interval covered its truth or it said so (honest), the labels drawn in "
        f"it (of {LABELS} per window), how often their realized accuracy lay within "
        "the tolerance and its mean error, and the segment ranked first in the first window.",
        "",
        "| model | fault | target | windows | retained | true acc. | first | top two | not label-free | honest "
        "| labels | within | mean error | ranked first |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, str], list[Outcome]] = {}
    for o in run.faulted:
        groups.setdefault((o.model, o.fault, o.target_name), []).append(o)
    lines += [_row(g) for g in groups.values()]
    lines += [
        "",
        "| model | clean windows | largest contribution (median, max) | a segment changed | quiet |",
        "|---|---|---|---|---|",
    ]
    by_model: dict[str, list[Outcome]] = {}
    for o in run.clean:
        by_model.setdefault(o.model, []).append(o)
    for model, group in by_model.items():
        tops = [o.top_contribution for o in group]
        changed = _share([o.any_changed for o in group])
        quiet = _share([o.quiet for o in group])
        lines.append(
            f"| {model} | {len(group)} | {np.median(tops):.4f}, {max(tops):.4f} | {changed:.2f} | {quiet:.2f} |"
        )
    lines += [
        "",
        "Across the traffic or in a few segments: windows of the test split with one of the zoo's shifts applied to "
        "every row, their true accuracy, and how often the table read the change as across the traffic (in every "
        "dimension, segments whose inputs changed hold half the predictions or more); the faulted windows above, "
        "how often they read so.",
        "",
        "| model | change | windows | true acc. | across the traffic |",
        "|---|---|---|---|---|",
    ]
    by_shift: dict[tuple[str, str], list[Outcome]] = {}
    for o in run.every_row:
        by_shift.setdefault((o.model, o.fault), []).append(o)
    for (model, kind), group in by_shift.items():
        truth, across = np.mean([o.window_truth for o in group]), _share([o.widespread for o in group])
        lines.append(f"| {model} | {kind} in every row | {len(group)} | {truth:.3f} | {across:.2f} |")
    for model in dict.fromkeys(o.model for o in run.faulted):
        group = [o for o in run.faulted if o.model == model]
        lines.append(
            f"| {model} | the faults above | {len(group)} | {np.mean([o.window_truth for o in group]):.3f} | "
            f"{_share([o.widespread for o in group]):.2f} |"
        )
    lines += [
        "",
        f"Labels where the change is: the half-width of the target's realized interval from {LABELS} labels drawn "
        f"uniformly and from {LABELS} drawn as the agent's stratified draws put them (`agent.labels.change_focus`)"
        f", and how many of those it takes for uniform draws' half-width (a window whose target drew no label counts "
        f"{NO_LABEL_HALF}; interpolated on {', '.join(map(str, FOCUS_GRID))} labels).",
        "",
        f"| model | windows | half-width, {LABELS} uniform | half-width, {LABELS} where the change is | labels needed "
        f"(≤ {LABEL_SHARE:.0%} of {LABELS}) |",
        "|---|---|---|---|---|",
    ]
    for model, n, uniform, focused, need in label_needs(run):
        verdict = "PASS" if need <= LABEL_SHARE * LABELS else "FAIL"
        needed = f"more than {LABELS}" if np.isinf(need) else f"{need:.0f} ({need / LABELS:.0%})"
        lines.append(f"| {model} | {n} | {uniform:.3f} | {focused:.3f} | {needed} {verdict} |")
    fits = ", ".join(f"{m} {s:.0f} s" for m, s in run.fit_seconds.items())
    lines += ["", f"Fits: {fits}; the whole run {seconds:.0f} s."]
    lines += [f"Note: {n}" for n in run.notes]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two models, fewer trees and windows (for a test)")
    parser.add_argument("--models", nargs="*", choices=sorted(MODELS), help="models to run (default: all)")
    parser.add_argument("--reps", type=int, help="windows per injection and clean windows per model")
    parser.add_argument("--size", type=int, help="predictions per window (at most half the test split)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", help="where the zoo builds its models (default: a temporary directory)")
    parser.add_argument("--out", type=Path, help="rewrite the generated block of this page (docs/diagnosis.md)")
    args = parser.parse_args(argv)
    models = args.models or list(QUICK_MODELS if args.quick else MODELS)
    reps = args.reps or (3 if args.quick else 12)
    size = args.size or (500 if args.quick else 1000)
    params = FitParams(seed=args.seed, n_estimators=20, shift_sets=24) if args.quick else FitParams(seed=args.seed)
    started = time.perf_counter()
    run = Run()
    with tempfile.TemporaryDirectory(prefix="icos-localization-") as tmp:
        workdir = args.workdir or tmp
        for name in models:
            print(f"{name}: fitting", file=sys.stderr, flush=True)
            subject = fit_subject(name, workdir, params)
            run.fit_seconds[name] = subject.fit_seconds
            print(f"{name}: {subject.segments.size} segments; injecting faults", file=sys.stderr, flush=True)
            run_subject(subject, FAULTS[MODELS[name]], reps=reps, size=size, seed=args.seed, run=run)
    text = report(run, quick=args.quick, seconds=time.perf_counter() - started)
    print(text)
    for name, got, need, _ in figures(run):
        print(f"{'PASS' if got >= need else 'FAIL'}: {name}: {got:.2f} (needed {need:.2f})")
    if args.out is not None:
        write_block(args.out, BEGIN, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
