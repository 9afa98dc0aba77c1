"""The label benchmark on windows with a localized drop: the localization benchmark's faults (one segment of a
real model's inputs broken, :mod:`bench.localization.runs`), each window labeled by uniform, active and stratified
draws as :func:`bench.labels.__main__.run_model` labels the estimator benchmark's windows. The strata are the
segments the bundle fixed at ``fit`` (every dimension) and the bins of the bundle's predicted correctness;
the stratified design's estimate is the agent's ``with_labels``, which may be post-stratified on those segments.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence

import numpy as np

from agent.estimation.estimators.active import active_accuracy, draw_probabilities, rate_for, uncertainty
from agent.estimation.estimators.prediction_powered import WITH_LABELS, LabeledEstimate, prediction_powered_accuracy
from agent.estimation.estimators.strata import strata_of
from bench.labels.draws import ACTIVE, STRATIFIED, stratified_ceiling, stratified_draw
from bench.localization.runs import FAULTS, Pool, Subject, fit_subject, live_target
from invariants.fit_params import FitParams

#: model → the kind of faults it gets (the localization benchmark's, in its order)
MODELS = {"tabular_categorical": "tabular", "lightgbm": "numeric_table", "text_tfidf": "text", "mnist_cnn": "image"}
QUICK_MODELS = ("tabular_categorical", "mnist_cnn")
#: a window's result: (model, scenario, labels, method, value, lower, upper, truth)
Outcome = tuple[str, str, int, str, float, float, float, float]
#: a window's ceiling: (model, scenario, at the run's floor, with no floor) (:func:`stratified_ceiling`)
Ceiling = tuple[str, str, float, float]
#: the floor standing for "no floor" in the ceiling (the allocation alone)
NO_FLOOR = 1e-9


def _window(
    subject: Subject,
    pool: Pool,
    rows: np.ndarray,
    scenario: str,
    counts: Sequence[int],
    rng: np.random.Generator,
    floor: float,
    ceilings: list[Ceiling],
) -> list[Outcome]:
    name = subject.name
    conf = pool.confidences[rows]
    correct = pool.correct[rows]
    truth = float(correct.mean())
    f = subject.calibration.predicted_correct(conf, pool.verdicts[rows])
    f_sum, f_sq = float(conf.sum()), float((conf * conf).sum())
    segs = pool.ids[:, rows]
    size = subject.segments.size
    mean_u = float(uncertainty(f).mean())
    out: list[Outcome] = [(name, scenario, 0, "avg_conf", f_sum / len(rows), np.nan, np.nan, truth)]
    every = strata_of(f, segs)
    ceilings.append(
        (name, scenario, stratified_ceiling(f, correct, every, floor), stratified_ceiling(f, correct, every, NO_FLOOR))
    )
    for n in counts:
        s = rng.choice(len(rows), size=min(n, len(rows)), replace=False)
        e = prediction_powered_accuracy(len(rows), f_sum, f_sq, conf[s], correct[s])
        assert e is not None
        out.append((name, scenario, n, WITH_LABELS, e.value, e.lower, e.upper, truth))
        pi = draw_probabilities(f, rate_for(f, n / len(rows), mean_u, floor), mean_u, floor)
        d = np.flatnonzero(rng.random(len(rows)) < pi)
        a = active_accuracy(f, d, correct[d], pi[d]) or LabeledEstimate(0.0, 0.0, 1.0, len(rows), 0)
        out.append((name, scenario, n, ACTIVE, a.value, a.lower, a.upper, truth))
        dims = tuple(len(d.segments) for d in subject.segments.dimensions)
        strata = tuple((d.name, a, b) for d, a, b in subject.segments.spans())
        st = stratified_draw(rng, f, correct, segs, size, n, floor, dims, post_stratify=(conf, strata))
        out.append((name, scenario, n, STRATIFIED, st.value, st.lower, st.upper, truth))
    return out


def run_localized(
    counts: Sequence[int],
    *,
    quick: bool,
    reps: int,
    size: int,
    seed: int,
    floor: float,
    workdir: str | None = None,
    say: Callable[[str], None] = print,
    ceilings: list[Ceiling] | None = None,
) -> list[Outcome]:
    """Every fault of every model (the quick set: two models with fewer trees), ``reps`` windows of ``size``
    rows per injection, each labeled at every count of ``counts``; each window's :data:`Ceiling` appended to
    ``ceilings``."""
    ceilings = [] if ceilings is None else ceilings
    params = FitParams(seed=seed, n_estimators=20, shift_sets=24) if quick else FitParams(seed=seed)
    out: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="icos-labels-") as tmp:
        for name in QUICK_MODELS if quick else MODELS:
            subject = fit_subject(name, workdir or tmp, params)
            rng = np.random.default_rng([seed, 71])
            split = subject.zoo.test
            for fault in FAULTS[MODELS[name]]:
                for k, inj in enumerate(fault(subject, split, rng)):
                    pool = Pool.of(subject, inj.split)
                    target, _ = live_target(subject, pool, inj)
                    scenario = f"{fault.__name__}#{k}"
                    for _ in range(reps):
                        rows = rng.integers(0, len(split), size)
                        out += _window(subject, pool, rows, scenario, counts, rng, floor, ceilings)
                    acc = float(pool.correct.mean())
                    seg_acc = float(pool.correct[pool.ids[subject.segments.dimension_of(target)] == target].mean())
                    say(f"[{name}] {scenario}: accuracy {acc:.3f}, in the target segment {seg_acc:.3f}")
    return out
