"""Fitting the flag "this number may be wrong" (:mod:`agent.estimation.flag.model`) at ``fit``, honest about shifts
its estimate has not seen.

The flag predicts whether the headline is off by more than the tolerance. It learns that from windows whose
truth is known and whose kind of shift the estimate was *fitted without*:

* **a model bundle** (:func:`model_flag`): ``shift_aware``'s fit already refits its regressions without each
  group of related corruptions to measure its interval
  (:func:`~agent.offline.calibration.estimators.shift_fitting.fit_shift`: geometry, resolution, photometry, noise and
  occlusion for images; noise, scale, missing and swapped values for tables); each refit, with a trust model
  of the windows it kept, estimates :attr:`~invariants.fit_params.CalibrationPlan.flag_corruption_windows`
  windows of the corrupted copies of its left-out group (one copy or a mixture of 2–3, some with clean rows,
  a third resampled to a random class prior) and
  :attr:`~invariants.fit_params.CalibrationPlan.flag_windows_per_kind` windows of every simulated shift of
  the headline's choice (:class:`~agent.offline.calibration.shift_windows.WindowPlanner`: clean, label,
  tilts, subpopulation, confidence, mixture); and
  :attr:`~invariants.fit_params.CalibrationPlan.flag_held_out_windows` windows of each kind of shift held
  out of every ``shift_aware`` fit (:mod:`agent.offline.calibration.held_out_kinds`: inversions and large
  covariate moves), which no refit saw either. No refit beyond those the interval needs.
* **a bundle without ``shift_aware``** (:func:`table_flag`: a table of predictions, or a model no corruption
  applies to): the simulated shifts of held-out folds of the calibration split, estimated by the estimators
  calibrated on the other folds (as the headline's choice draws them).

On each window: the evidence (:class:`~agent.estimation.flag.model.WindowEvidence`), the headline and the truth.
The model (:func:`fit_flag_model`): a logistic regression with non-negative coefficients on the standardised
evidence (:func:`monotone_logistic`), its score calibrated to the probability of a miss by isotonic
regression (:func:`isotonic_steps`); the threshold is the highest score at which the windows left down hold
at most :data:`~agent.estimation.flag.model.RISK` misses; the gate is the 99% quantile of the clean windows'
class-adjusted ``z``; the widened interval's quantiles are measured on the windows the flag raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import estimate_window, headline_of
from agent.estimation.flag.assessment import window_evidence
from agent.estimation.flag.class_mix import ClassReference, per_sample_quantities
from agent.estimation.flag.model import (
    MODEL_FEATURES,
    P_EDGES,
    RISK,
    TABLE_FEATURES,
    TOLERANCE,
    FlagModel,
    WindowEvidence,
    feature_row,
    mix_unexplained,
    raises_on_unexplained_mix,
)
from agent.estimation.statistics.window import WindowStats
from agent.offline.calibration.estimators.headline_choice import classic_calibration, fold_of, window_stats
from agent.offline.calibration.estimators.shift_fitting import ShiftFit
from agent.offline.calibration.judged import JudgedSet
from agent.offline.calibration.sets import CalibrationSets
from agent.offline.calibration.shift_windows import Window, WindowPlanner
from invariants.fit_params import CalibrationPlan

#: The L2 penalty of the flag's regression (scikit-learn's ``C``).
PENALTY_C = 1.0
#: Fewest windows in a step of the score's isotonic calibration.
MIN_STEP = 10
#: Fewest flagged windows the widened interval's quantiles are measured on (else half the range).
MIN_FLAGGED = 20
#: The quantile of the clean windows' class-adjusted ``z`` below which no flag is raised.
GATE_QUANTILE = 0.99


@dataclass(frozen=True)
class FlagWindow:
    """One fit-time window: its evidence, kind and true accuracy."""

    evidence: WindowEvidence
    kind: str
    truth: float


def monotone_logistic(z: np.ndarray, y: np.ndarray, c: float = PENALTY_C) -> tuple[np.ndarray, float]:
    """L2-penalised logistic regression (penalty ``|w|²/(2c)``) with every coefficient at least 0: more
    evidence never lowers the risk, and every term that raises the flag names a reason."""
    from scipy.optimize import minimize

    yy = np.asarray(y, dtype=np.float64)

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        s = z @ w[:-1] + w[-1]
        p = 1.0 / (1.0 + np.exp(-s))
        g = p - yy
        grad = np.r_[z.T @ g + w[:-1] / c, g.sum()]
        return float(np.sum(np.logaddexp(0.0, s) - yy * s)) + float(w[:-1] @ w[:-1]) / (2 * c), grad

    k = z.shape[1]
    res = minimize(loss, np.zeros(k + 1), jac=True, method="L-BFGS-B", bounds=[(0, None)] * k + [(None, None)])
    return np.asarray(res.x[:-1]), float(res.x[-1])


def isotonic_steps(score: np.ndarray, bad: np.ndarray, min_count: int = MIN_STEP) -> tuple[list[float], list[float]]:
    """A non-decreasing step function of ``score`` fitted to ``bad`` (pool adjacent violators on blocks of
    ``min_count`` windows): its inner edges and its levels."""
    order = np.argsort(score, kind="stable")
    s, y = score[order], np.asarray(bad, dtype=np.float64)[order]
    blocks: list[list[float]] = []  # [misses, windows, first score]
    for i in range(0, len(s), min_count):
        blocks.append([float(y[i : i + min_count].sum()), float(len(y[i : i + min_count])), float(s[i])])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
            last = blocks.pop()
            blocks[-1][0] += last[0]
            blocks[-1][1] += last[1]
    return [b[2] for b in blocks[1:]], [b[0] / b[1] for b in blocks]


def fit_flag_model(
    windows: Sequence[FlagWindow], reference: ClassReference, features: Sequence[str], headline: str
) -> FlagModel | None:
    """The flag fitted on ``windows`` (see the module docstring); None without windows."""
    if not windows:
        return None
    names = tuple(features)
    rows = [feature_row(w.evidence, names) for w in windows]
    x = np.array([[np.nan if v is None else v for v in r] for r in rows], dtype=np.float64)
    finite = np.isfinite(x)
    # a feature no window can tell (e.g. no per-sample inputs) has mean 0 and adds nothing
    mean = np.where(finite, x, 0.0).sum(axis=0) / np.maximum(finite.sum(axis=0), 1)
    x = np.where(finite, x, mean)
    scale = np.maximum(x.std(axis=0), 1e-9)
    err = np.array([w.evidence.headline - w.truth for w in windows])
    bad = np.abs(err) > TOLERANCE
    coef, intercept = monotone_logistic((x - mean) / scale, bad)
    score = ((x - mean) / scale) @ coef + intercept
    steps, levels = isotonic_steps(score, bad)
    order = np.argsort(score, kind="stable")
    miss_share = np.cumsum(bad[order]) / np.arange(1, len(bad) + 1)
    ok = np.flatnonzero(miss_share <= RISK)
    # no prefix of windows holds few enough misses: raise on every window like the fit's
    threshold = float(np.nextafter(score[order][ok[-1]], np.inf)) if len(ok) else float(score.min())
    clean_z = [w.evidence.mix.z for w in windows if w.kind == "clean" and w.evidence.mix is not None]
    z_gate = float(np.quantile(clean_z, GATE_QUANTILE)) if len(clean_z) >= 20 else 0.0
    levels_arr, steps_arr = np.asarray(levels), np.asarray(steps)
    p = levels_arr[np.searchsorted(steps_arr, score, side="right")]
    band = np.searchsorted(np.asarray(P_EDGES), p, side="right")
    # the windows the flag raises on (a model without inputs_beyond_confidence: a class mix the residual does not
    # explain raises it below the threshold too)
    by_mix = raises_on_unexplained_mix(names)
    unexplained = np.array([by_mix and mix_unexplained(w.evidence.mix, z_gate) for w in windows], dtype=bool)
    raised = (score >= threshold) | unexplained
    below, above = [], []
    for b in range(len(P_EDGES) + 1):
        e = err[(band >= b) & raised]  # this band and riskier ones: never narrower for a higher risk
        below.append(float(np.quantile(np.maximum(e, 0.0), 0.95)) if len(e) >= MIN_FLAGGED else 0.5)
        above.append(float(np.quantile(np.maximum(-e, 0.0), 0.95)) if len(e) >= MIN_FLAGGED else 0.5)
    return FlagModel(
        features=names,
        mean=tuple(float(v) for v in mean),
        scale=tuple(float(v) for v in scale),
        coef=tuple(float(v) for v in coef),
        intercept=intercept,
        threshold=threshold,
        z_gate=z_gate,
        steps=tuple(steps),
        levels=tuple(levels),
        below=tuple(below),
        above=tuple(above),
        reference=reference,
        windows=len(windows),
        headline=headline,
    )


def class_reference(
    clean: JudgedSet, predicted: np.ndarray, n_classes: int, pca_edges: Sequence[float]
) -> ClassReference:
    """Per predicted class, the clean calibration split's quantities (with the per-sample inputs where the
    split carries them)."""
    q = per_sample_quantities(clean.verdicts, clean.confidences, clean.extras, pca_edges)
    return ClassReference.fit(q, predicted, n_classes)


def _flag_window(
    stats: WindowStats,
    calibration: EstimatorCalibration,
    headline: str,
    reference: ClassReference,
    kind: str,
    truth: float,
) -> FlagWindow | None:
    window = estimate_window(stats, calibration)
    head = headline_of(window.estimates, headline)
    if head is None:
        return None
    return FlagWindow(window_evidence(window, head[1], calibration, reference), kind, truth)


def _corrupted(
    sets: Sequence[JudgedSet], pick: Sequence[int], rows: np.ndarray, size: int, rng: np.random.Generator
) -> Window:
    """Rows of one corrupted copy of ``pick``, or of 2–3 (sometimes with clean rows), a third of the windows
    resampled to a random class prior."""
    if rng.uniform() < 0.5 or len(pick) == 1:
        chosen = [int(rng.choice(pick))]
    else:
        chosen = [int(v) for v in rng.choice(pick, min(len(pick), int(rng.integers(2, 4))), replace=False)]
        if rng.uniform() < 0.3:
            chosen.append(0)
    counts = rng.multinomial(size, rng.dirichlet(np.ones(len(chosen))))
    y = np.asarray(sets[0].y, dtype=np.int64)
    p = None
    if rng.uniform() < 0.3:
        prior = rng.dirichlet(np.full(int(y.max()) + 1, float(rng.choice([0.5, 2.0, 5.0]))))
        w = prior[y[rows]]
        p = w / w.sum()
    parts = tuple((k, rng.choice(rows, int(c), p=p)) for k, c in zip(chosen, counts, strict=True) if c)
    return Window("corruption", parts)


def _truth(sets: Sequence[JudgedSet], window: Window) -> float:
    return float(np.concatenate([np.asarray(sets[k].correct, dtype=bool)[i] for k, i in window.parts]).mean())


def model_flag(
    sets: CalibrationSets,
    shift: ShiftFit,
    classic: EstimatorCalibration,
    headline: str,
    coords: np.ndarray,
    n_classes: int,
    *,
    seed: int,
    plan: CalibrationPlan = CalibrationPlan(),
) -> FlagModel | None:
    """The flag of a bundle fitted with the model (see the module docstring): ``shift``'s refits estimate
    windows of the corruptions each left out and of simulated shifts, with the classic estimators of
    ``classic``; ``coords``: the calibration rows' tilt coordinates. None without refits or class labels."""
    clean = sets.clean
    if not shift.refits or clean.y is None or clean.extras is None or clean.extras.label is None:
        return None
    reference = class_reference(clean, clean.extras.label, n_classes, sets.reference.pca_edges)
    all_sets = [clean, *sets.shifted, *sets.held_out]
    first = 1 + len(sets.shifted)
    unseen: dict[str, list[int]] = {}
    for k, s in enumerate(sets.held_out, first):
        unseen.setdefault(s.name, []).append(k)
    rows = np.arange(len(clean.correct))
    planner = WindowPlanner(coords, clean.confidences, clean.y, 0)
    rng = np.random.default_rng([seed, 37])
    lo, hi = plan.flag_window_size
    windows: list[FlagWindow] = []
    for refit in shift.refits:
        calibration = classic.with_shift(refit.calibration)
        pick = [k for k, s in enumerate(all_sets[:first]) if k and s.name in refit.left_out]
        planned: list[Window] = []
        if pick:
            planned += [
                _corrupted(all_sets, pick, rows, int(rng.integers(lo, hi + 1)), rng)
                for _ in range(plan.flag_corruption_windows)
            ]
        for kind in planner.kinds:
            planned += [
                planner.window(kind, rows, int(rng.integers(lo, hi + 1)), rng)
                for _ in range(plan.flag_windows_per_kind)
            ]
        for name, copies in unseen.items():
            planned += [
                replace(_corrupted(all_sets, copies, rows, int(rng.integers(lo, hi + 1)), rng), kind=f"held_out:{name}")
                for _ in range(plan.flag_held_out_windows)
            ]
        for w in planned:
            fw = _flag_window(
                window_stats(all_sets, w, calibration), calibration, headline, reference, w.kind, _truth(all_sets, w)
            )
            if fw is not None:
                windows.append(fw)
    return fit_flag_model(windows, reference, MODEL_FEATURES, headline)


def _with_class_mix(stats: WindowStats, predicted: np.ndarray, n_classes: int) -> WindowStats:
    """``stats`` holding the mix of predicted classes of its rows (as CBPE's per-class sums carry it live)."""
    counts = np.bincount(np.clip(predicted, 0, n_classes - 1), minlength=n_classes)[:n_classes]
    return replace(stats, cbpe_n=len(predicted), cbpe_predicted=counts.tolist())


def table_flag(
    clean: JudgedSet,
    predicted: np.ndarray,
    headline: str,
    coords: np.ndarray,
    n_classes: int,
    *,
    seed: int,
    plan: CalibrationPlan = CalibrationPlan(),
) -> FlagModel | None:
    """The flag of a bundle without ``shift_aware`` (see the module docstring): simulated shifts of each fold
    of the calibration split ``clean`` (``predicted``: its predicted classes), estimated by the estimators
    calibrated on the other folds. None when a fold would hold fewer rows than the plan's ``min_fold_rows``."""
    n, folds = len(clean.correct), plan.headline_folds
    if clean.y is None or n < folds * plan.min_fold_rows:
        return None
    pred = np.asarray(predicted, dtype=np.int64).reshape(-1)
    reference = class_reference(clean, pred, n_classes, ())
    rng = np.random.default_rng([seed, 38])
    fold = fold_of(clean.correct, folds, rng)
    planner = WindowPlanner(coords, clean.confidences, clean.y, 0)
    calibrate = classic_calibration(clean)
    lo, hi = plan.flag_window_size
    windows: list[FlagWindow] = []
    for f in range(folds):
        held = np.flatnonzero(fold == f)
        calibration = calibrate(np.flatnonzero(fold != f))
        for kind in planner.kinds:
            for _ in range(plan.flag_table_windows_per_kind):
                size = min(int(rng.integers(lo, hi + 1)), len(held))
                w = planner.window(kind, held, size, rng)
                idx = np.concatenate([i for _, i in w.parts])
                stats = _with_class_mix(window_stats([clean], w, calibration), pred[idx], n_classes)
                fw = _flag_window(stats, calibration, headline, reference, kind, _truth([clean], w))
                if fw is not None:
                    windows.append(fw)
    return fit_flag_model(windows, reference, TABLE_FEATURES, headline)
