"""Fitting ``shift_aware``: windows drawn from judged calibration sets, regressions and interval tables,
and the leave-group-out refits behind the interval, kept whole (regressions and trust model) for the flag
"this number may be wrong" to be calibrated on kinds of shift its estimate was fitted without.

:func:`fit_shift`:

* ``n_windows`` windows (sizes in the plan's ``window_size``) are drawn: one corrupted set, or a mixture of
  2–3 (sometimes with clean data), a third of them resampled to a random class prior (label
  shift), a tenth clean; each gives the additive statistics a live window would hold and its
  true accuracy;
* three gradient-boosted regressions from window features to accuracy minus the window's mean
  confidence (the *residual* target): ``full`` (:data:`FULL_FEATURES`, needs the per-sample
  inputs with the predicted labels), ``inputs`` (:data:`INPUTS_FEATURES`, the same without the
  labels) and ``reduced`` (:data:`REDUCED_FEATURES`);
* interval: the corruptions are cut into groups of related ones
  (:func:`~agent.offline.calibration.corruptions.corruption_groups`: geometry, resolution, photometry,
  noise and occlusion for images, noise, scale, missing and swapped values for tables; the others in
  ``folds`` groups); each group is held out, the models are refitted (100 trees at a higher rate, to
  save time) on the windows without it and evaluated on the windows made only of it (and clean data).
  The 95% quantiles of those out-of-family errors per predicted-accuracy bin are the interval's
  model-error term. Each refit, with a trust model of the windows it kept, is returned too
  (:class:`GroupRefit`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from agent.estimation.estimators.shift_aware import window_features
from agent.estimation.estimators.shift_calibration import ShiftCalibration
from agent.estimation.estimators.tree_ensemble import TreeEnsemble
from agent.estimation.estimators.trust import KindSupport, TrustModel, confidence_base, confidence_offsets
from agent.estimation.layout import FULL_FEATURES, INPUTS_FEATURES, MEAN_CONFIDENCE, N_CONF_BINS
from agent.estimation.statistics.reference import InputReference
from agent.estimation.statistics.window import SampleExtras, WindowStats
from agent.offline.calibration.corruptions import corruption_groups
from agent.offline.calibration.judged import JudgedSet
from invariants.fit_params import CalibrationPlan

#: Edges of the predicted-accuracy bins of the interval's model-error term.
Q_EDGES: tuple[float, ...] = (0.5, 0.75, 0.9)


def _window_plan(
    sets: list[JudgedSet], n_windows: int, rng: np.random.Generator, size: tuple[int, int]
) -> list[list[tuple[int, np.ndarray]]]:
    """Windows drawn from the sets (index 0 = clean): one set, or a mixture of 2–3 (sometimes with
    clean data), each sometimes resampled to a Dirichlet class prior (label shift)."""
    plans: list[list[tuple[int, np.ndarray]]] = []
    shifted = np.arange(1, len(sets))
    for _ in range(n_windows):
        u = rng.uniform()
        if u < 0.1 or not len(shifted):
            chosen = [0]
        elif u < 0.6:
            chosen = [int(rng.choice(shifted))]
        else:
            chosen = [int(v) for v in rng.choice(shifted, min(len(shifted), int(rng.integers(2, 4))), replace=False)]
            if rng.uniform() < 0.3:
                chosen.append(0)
        m = int(rng.integers(size[0], size[1] + 1))
        counts = rng.multinomial(m, rng.dirichlet(np.ones(len(chosen))))
        alpha = float(rng.choice([0.5, 2.0, 5.0])) if rng.uniform() < 0.3 else None
        plan = []
        prior = None
        for k, c in zip(chosen, counts, strict=True):
            if c == 0:
                continue
            s = sets[k]
            if alpha is not None and s.y is not None:
                if prior is None:
                    prior = rng.dirichlet(np.full(int(s.y.max()) + 1, alpha))
                p = prior[np.asarray(s.y, dtype=np.int64)]
                plan.append((k, rng.choice(len(s.correct), int(c), p=p / p.sum())))
            else:
                plan.append((k, rng.integers(0, len(s.correct), int(c))))
        plans.append(plan)
    return plans


def _interval_table(pred: np.ndarray, resid: np.ndarray) -> tuple[float, ...]:
    """95% quantile of |residual| per predicted-accuracy bin, never narrower for lower accuracy."""
    if len(resid) == 0:
        return (0.5,) * (len(Q_EDGES) + 1)
    bins = np.searchsorted(np.asarray(Q_EDGES), pred, side="right")
    overall = float(np.quantile(np.abs(resid), 0.95))
    q = []
    for b in range(len(Q_EDGES) + 1):
        r = np.abs(resid[bins == b])
        q.append(float(np.quantile(r, 0.95)) if len(r) >= 20 else overall)
    for b in range(len(q) - 2, -1, -1):  # lower predicted accuracy: at least as wide
        q[b] = max(q[b], q[b + 1])
    return tuple(q)


@dataclass(frozen=True)
class GroupRefit:
    """``shift_aware`` refitted without one group of related corruptions (``left_out``): the regressions of
    the interval's refit and a trust model of the windows it kept (its interval is not measured: 0.5)."""

    left_out: tuple[str, ...]
    calibration: ShiftCalibration


@dataclass(frozen=True)
class ShiftFit:
    """``shift_aware``'s calibration and the leave-group-out refits behind its interval."""

    calibration: ShiftCalibration
    refits: tuple[GroupRefit, ...] = ()


def fit_shift_calibration(
    clean: JudgedSet,
    shifted: list[JudgedSet],
    reference: InputReference,
    *,
    plan: CalibrationPlan = CalibrationPlan(),
    n_windows: int | None = None,
    folds: int | None = None,
    seed: int = 0,
) -> ShiftCalibration:
    """``shift_aware``'s calibration (:func:`fit_shift`, without its refits)."""
    return fit_shift(clean, shifted, reference, plan=plan, n_windows=n_windows, folds=folds, seed=seed).calibration


def fit_shift(
    clean: JudgedSet,
    shifted: list[JudgedSet],
    reference: InputReference,
    *,
    plan: CalibrationPlan = CalibrationPlan(),
    n_windows: int | None = None,
    folds: int | None = None,
    seed: int = 0,
) -> ShiftFit:
    """Fit ``shift_aware`` on windows drawn from the clean calibration split and its corrupted copies
    (``plan``: the windows' count and sizes, the folds; ``n_windows`` and ``folds`` override its
    :attr:`~invariants.fit_params.CalibrationPlan.shift_windows` and ``interval_folds``, 0 folds: no interval
    and no refits); the method is in the module docstring.
    """
    folds = plan.interval_folds if folds is None else folds
    sets = [clean, *shifted]
    rng = np.random.default_rng(seed)
    windows = _window_plan(sets, plan.shift_windows if n_windows is None else n_windows, rng, plan.window_size)
    designs, y = _window_designs(sets, windows, reference)
    # residual target: what the trees learn is how far accuracy falls below (or rises above) the
    # mean confidence, so a window unlike any calibration window keeps the confidence's estimate
    # plus the correction of its nearest calibration windows instead of their absolute accuracy
    base = designs["full"][:, MEAN_CONFIDENCE]
    models = {k: TreeEnsemble.fit(X, y - base, seed=seed) for k, X in designs.items()}
    families = sorted({s.name for s in shifted} - {clean.name})
    fams = [{sets[k].name for k, _ in w} for w in windows]
    groups = [set(g) for g in corruption_groups(families, folds)] if folds else []
    held_out = _held_out_errors(designs, y, base, fams, groups, clean.name, plan.min_interval_windows, seed)
    clean_part = _clean_windows(clean, reference, plan, rng)
    trust = _fit_trust(clean, designs, y, clean_part, plan, rng)
    calibration = _shift_calibration(models, held_out, reference, tuple(families), trust)
    refits = tuple(_group_refit(calibration, r, clean, designs, y, clean_part, plan, rng) for r in held_out.refits)
    return ShiftFit(calibration, refits)


def _window_designs(
    sets: list[JudgedSet], windows: list[list[tuple[int, np.ndarray]]], reference: InputReference
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The drawn windows' features for each regression (``full``, ``inputs``, ``reduced``) and their true
    accuracies."""
    rows = [_plan_features(sets, w, reference) for w in windows]
    y = np.asarray(
        [float(np.concatenate([np.asarray(sets[k].correct, bool)[i] for k, i in w]).mean()) for w in windows]
    )
    return {k: np.asarray([r[j] for r in rows]) for j, k in enumerate(("full", "inputs", "reduced"))}, y


def _shift_calibration(
    models: dict[str, TreeEnsemble],
    held_out: _HeldOut,
    reference: InputReference,
    families: tuple[str, ...],
    trust: TrustModel,
) -> ShiftCalibration:
    """``shift_aware``'s calibration: the regressions, and the interval of their held-out errors."""
    q = {k: _interval_table(*held_out.errors[k]) for k in models}
    full_errors = held_out.errors["full"][1]
    return ShiftCalibration(
        full=models["full"],
        inputs=models["inputs"],
        reduced=models["reduced"],
        q_edges=Q_EDGES,
        q_full=q["full"],
        q_inputs=q["inputs"],
        q_reduced=q["reduced"],
        reference=reference,
        families=families,
        lofo_mae=float(np.mean(np.abs(full_errors))) if len(full_errors) else 0.0,
        target="residual",
        trust=trust,
    )


def _group_refit(
    calibration: ShiftCalibration,
    refit: tuple[set[str], dict[str, TreeEnsemble], np.ndarray],
    clean: JudgedSet,
    designs: dict[str, np.ndarray],
    y: np.ndarray,
    clean_part: _CleanWindows,
    plan: CalibrationPlan,
    rng: np.random.Generator,
) -> GroupRefit:
    """One refit of the interval as a whole calibration: its regressions, a trust model of the windows it
    kept, no measured interval (0.5)."""
    group, trees, train = refit
    unmeasured = (0.5,) * (len(Q_EDGES) + 1)
    kept = {k: X[train] for k, X in designs.items()}
    whole = replace(
        calibration,
        full=trees["full"],
        inputs=trees["inputs"],
        reduced=trees["reduced"],
        q_full=unmeasured,
        q_inputs=unmeasured,
        q_reduced=unmeasured,
        families=tuple(f for f in calibration.families if f not in group),
        lofo_mae=0.0,
        trust=_fit_trust(clean, kept, y[train], clean_part, plan, rng),
    )
    return GroupRefit(tuple(sorted(group)), whole)


@dataclass(frozen=True)
class _HeldOut:
    """Per design, the predicted accuracies and residuals of the held-out windows (``errors``), and every
    refit: the group it left out, its regressions per design and the windows it was fitted on."""

    errors: dict[str, tuple[np.ndarray, np.ndarray]]
    refits: list[tuple[set[str], dict[str, TreeEnsemble], np.ndarray]]


def _held_out_errors(
    designs: dict[str, np.ndarray],
    y: np.ndarray,
    base: np.ndarray,
    fams: list[set[str]],
    groups: list[set[str]],
    clean: str,
    min_windows: int,
    seed: int,
) -> _HeldOut:
    """Per design, the predicted accuracies and residuals of the windows made only of one held-out group
    of corruption families (and clean data), by the models refitted (100 trees at a higher rate, to save
    time) on the windows without it; a group leaving fewer than ``min_windows`` training windows is skipped."""
    preds: dict[str, list[np.ndarray]] = {k: [] for k in designs}
    resid: dict[str, list[np.ndarray]] = {k: [] for k in designs}
    refits: list[tuple[set[str], dict[str, TreeEnsemble], np.ndarray]] = []
    for g in groups:
        train = np.array([not (f & g) for f in fams])
        test = np.array([bool(f & g) and f <= g | {clean} for f in fams])
        if train.sum() < min_windows or not test.any():
            continue
        trees = {}
        for k, X in designs.items():
            tree = TreeEnsemble.fit(X[train], y[train] - base[train], n_trees=100, rate=0.075, seed=seed)
            trees[k] = tree
            m = tree.predict(X[test]) + base[test]
            preds[k].append(np.clip(m, 0, 1))
            resid[k].append(np.clip(m, 0, 1) - y[test])
        refits.append((g, trees, np.flatnonzero(train)))
    cat = lambda a: np.concatenate(a) if a else np.zeros(0)  # noqa: E731
    return _HeldOut({k: (cat(preds[k]), cat(resid[k])) for k in designs}, refits)


def _plan_features(
    sets: list[JudgedSet], plan: list[tuple[int, np.ndarray]], reference: InputReference
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``full``, ``inputs`` and ``reduced`` feature vectors of one planned window (zero-padded)."""
    v = np.concatenate([sets[k].verdicts[i] for k, i in plan])
    c = np.concatenate([sets[k].confidences[i] for k, i in plan])
    ex = None
    if all(sets[k].extras is not None for k, _ in plan):
        ex = SampleExtras.concatenate([sets[k].extras.take(i) for k, i in plan])  # type: ignore[union-attr]
    stats = WindowStats.of_samples(v, c, 0.5, ex, reference)
    full_x, _ = window_features(stats, reference)
    in_x, _ = window_features(replace(stats, n_cls=0), reference)
    red_x, _ = window_features(replace(stats, n_ext=0), reference)
    return (
        np.r_[full_x, np.zeros(len(FULL_FEATURES) - len(full_x))],
        np.r_[in_x, np.zeros(len(INPUTS_FEATURES) - len(in_x))],
        red_x,
    )


def _bases(x: np.ndarray, offsets: tuple[float, ...]) -> np.ndarray:
    """The confidence estimate of every window of a design (its first columns are the bin shares)."""
    return np.array([confidence_base(row[:N_CONF_BINS], row[MEAN_CONFIDENCE], offsets) for row in x])


@dataclass(frozen=True)
class _CleanWindows:
    """Windows of the clean calibration split (their sizes, feature vectors and accuracy) and its confidence
    offsets: what every trust model compares with, drawn once."""

    sizes: np.ndarray
    rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    y: np.ndarray
    offsets: tuple[float, ...]


def _clean_windows(
    clean: JudgedSet, reference: InputReference, plan: CalibrationPlan, rng: np.random.Generator
) -> _CleanWindows:
    sizes = rng.integers(plan.window_size[0], plan.window_size[1] + 1, plan.clean_windows)
    windows = [[(0, rng.integers(0, len(clean.correct), int(m)))] for m in sizes]
    rows = [_plan_features([clean], w, reference) for w in windows]
    y = np.array([float(np.asarray(clean.correct, bool)[w[0][1]].mean()) for w in windows])
    return _CleanWindows(sizes, rows, y, confidence_offsets(clean.confidences, clean.correct))


def _fit_trust(
    clean: JudgedSet,
    designs: dict[str, np.ndarray],
    y: np.ndarray,
    part: _CleanWindows,
    plan: CalibrationPlan,
    rng: np.random.Generator,
) -> TrustModel:
    """The trust model (:mod:`agent.estimation.estimators.trust`): the calibration windows' support per model
    kind, the clean split's window statistics and the confidence estimate's errors."""
    kinds = {
        k: KindSupport.fit(
            x,
            np.asarray([r[j] for r in part.rows]),
            part.sizes.astype(np.float64),
            rng,
            len(clean.correct),
            max_points=plan.trust_points,
        )
        for j, (k, x) in enumerate(designs.items())
    }
    base = _bases(designs["reduced"], part.offsets)
    clean_base = _bases(np.asarray([r[2] for r in part.rows]), part.offsets)
    return TrustModel(
        kinds=kinds,
        q_clean=float(np.quantile(np.abs(np.clip(clean_base, 0, 1) - part.y), 0.95)),
        q_base=float(np.quantile(np.abs(np.clip(base, 0, 1) - y), 0.95)),
        calibration_errors=int(len(clean.correct) - np.asarray(clean.correct, bool).sum()),
    )
