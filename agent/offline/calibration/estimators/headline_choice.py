"""Choosing a bundle's headline estimator from evidence, at ``fit``.

No label-free estimator is best under every shift, and which one is best for a given model depends on
how its confidence, its oracle and its errors move together. So ``fit`` measures them on the data it
has, held out from what they were calibrated on:

1. The calibration split (labeled rows held out of the ADI forest) is cut into folds
   (:class:`~invariants.fit_params.CalibrationPlan` holds every count of this module),
   stratified by right/wrong predictions. For each fold, every estimator is calibrated on the other
   folds (``calibrate``: the classic estimators' offsets, thresholds and TPR/FPR, and ``shift_aware``'s
   regressions where the bundle has them), and measured on windows of the fold's rows under simulated
   shifts (:class:`~agent.offline.calibration.shift_windows.WindowPlanner`). No window holds a row its
   estimators were calibrated on (cross-fitting: each estimate is out of sample).
2. Each candidate's criterion is its worst relative regret over the kinds of window: per kind of shift,
   its mean absolute error over the windows of that kind divided by the lowest such mean among the
   candidates, and the largest of these ratios over kinds (minimax relative regret). The choice
   guards against the drift that hurts it most compared with what was achievable there; a ratio, not
   a difference, so that one kind where every estimator errs a lot (a strong change of the class
   prior) does not decide alone; a mean over windows is not the luck of one draw.
3. The candidate with the lowest criterion is chosen when it beats the default
   (:func:`~agent.estimation.estimators.registry.default_headline`: ``shift_aware`` where the bundle has it, else
   ``cbpe``, the estimators built for the bundle's kind) in at least the plan's ``support`` share of its
   ``bootstrap`` resamples of the calibration rows *and* of the windows: each resample draws every
   fold's calibration rows again (with replacement, wrong and right ones apart), recalibrates the
   estimators that need only the judged predictions on them, re-estimates the windows, and draws the
   windows again kind by kind. A small data set gives noisy windows, and the held-out windows' truth
   rests on the same few errors the estimators were calibrated on: a choice a resample of those errors
   would overturn is no evidence, and the default is then kept rather than a winner by chance. Below the
   plan's ``min_choice_errors`` wrong predictions in the split (so few that every fold's calibration
   rests on a handful of them) no other headline is chosen at all. Only estimators whose spec may be a
   headline are candidates, and those resting on the oracle are not eligible where it is weak
   (:func:`ineligible`).

A model bundle (:func:`choose_model_headline`) measures ``shift_aware`` the same way: its regressions and
trust model are refitted on each fold's complement of the calibration split and its corrupted copies
(:meth:`~agent.offline.calibration.sets.CalibrationSets.fit` with ``rows``), and the windows add a
``corruption`` kind drawn from the corrupted copies of the held-out rows.

The final estimators are calibrated on the whole split as before; the evidence (every candidate's
mean, worst and per-kind error, the windows' count and size) is kept in the bundle
(:class:`~agent.estimation.estimators.evidence.HeadlineEvidence`). Everything is seeded by ``fit --seed``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.evidence import EstimatorErrors, HeadlineEvidence
from agent.estimation.estimators.registry import (
    REGISTRY,
    default_headline,
    estimate_all,
    estimator_specs,
    headline_candidates,
)
from agent.estimation.estimators.reliability import weak_oracle
from agent.estimation.statistics.window import SampleExtras, WindowStats
from agent.offline.calibration.judged import JudgedSet
from agent.offline.calibration.sets import CalibrationSets
from agent.offline.calibration.shift_windows import Window, WindowPlanner, tilt_coordinates
from invariants.fit_params import CalibrationPlan

#: Smallest mean error a ratio divides by (an estimator exact on one kind of window does not make every
#: other one infinitely worse there).
ERROR_FLOOR = 0.002

#: Calibrates the estimators on the given rows of the calibration split.
Calibrate = Callable[[np.ndarray], EstimatorCalibration]


class RowBootstrap:
    """The windows of :func:`measure` estimated again after every fold's calibration rows are drawn anew
    (stratified by right and wrong, with replacement), by the candidates that need only the judged
    predictions (their spec's ``needs_model`` unset: recalibrated in milliseconds); the others keep their
    measured values (``shift_aware``'s refit is the expensive part). See the module docstring, point 3."""

    def __init__(
        self,
        clean: JudgedSet,
        row_fold: np.ndarray,
        window_fold: np.ndarray,
        stats: Sequence[WindowStats],
        confidences: Sequence[np.ndarray],
    ) -> None:
        self.clean = clean
        self.row_fold = row_fold
        self.window_fold = window_fold
        self.stats = list(stats)
        self.confidences = list(confidences)

    def values(self, names: Sequence[str], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """One resample's estimates of every window by each of ``names`` (classic candidates only)."""
        ok = np.asarray(self.clean.correct, dtype=bool)
        calibrate = classic_calibration(self.clean)
        out = {n: np.zeros(len(self.stats)) for n in names}
        for f in np.unique(self.window_fold):
            train = np.flatnonzero(self.row_fold != f)
            wrong, right = train[~ok[train]], train[ok[train]]
            rows = np.r_[rng.choice(wrong, len(wrong)) if len(wrong) else wrong, rng.choice(right, len(right))]
            cal = calibrate(rows)
            for j in np.flatnonzero(self.window_fold == f):
                stats = replace(self.stats[j], atc_above=int((self.confidences[j] > cal.atc_threshold).sum()))
                for n in names:
                    e = REGISTRY[n].formula(stats, cal)
                    out[n][j] = np.nan if e is None else e.value
        return out


@dataclass(frozen=True)
class Measured:
    """Every candidate's estimate of every simulated window, and the windows' true accuracy and kind;
    ``wrong``: the wrong predictions in the split the windows were drawn from; ``bootstrap``: how to
    estimate the windows again from resampled calibration rows (None: only the windows are resampled)."""

    kinds: np.ndarray
    truth: np.ndarray
    estimates: dict[str, np.ndarray]
    window_size: int
    rows: int
    folds: int
    wrong: int = -1
    bootstrap: RowBootstrap | None = field(default=None, compare=False)

    def errors(self, name: str) -> np.ndarray:
        return np.abs(self.estimates[name] - self.truth)


def fold_of(correct: np.ndarray, folds: int, rng: np.random.Generator) -> np.ndarray:
    """The fold of every row, stratified by ``correct`` (each fold holds its share of wrong predictions)."""
    ok = np.asarray(correct, dtype=bool).reshape(-1)
    out = np.empty(len(ok), dtype=np.int64)
    for group in (np.flatnonzero(ok), np.flatnonzero(~ok)):
        perm = rng.permutation(group)
        out[perm] = (np.arange(len(perm)) + int(rng.integers(folds))) % folds
    return out


def window_stats(sets: Sequence[JudgedSet], window: Window, calibration: EstimatorCalibration) -> WindowStats:
    """The additive statistics a live window of these rows would hold (with the per-sample inputs of
    the full ``shift_aware`` model when every set carries them and the calibration has it)."""
    v = np.concatenate([sets[k].verdicts[i] for k, i in window.parts])
    c = np.concatenate([sets[k].confidences[i] for k, i in window.parts])
    shift = calibration.shift
    extras = None
    if shift is not None and all(sets[k].extras is not None for k, _ in window.parts):
        extras = SampleExtras.concatenate([sets[k].extras.take(i) for k, i in window.parts])  # type: ignore[union-attr]
    return WindowStats.of_samples(v, c, calibration.atc_threshold, extras, shift.reference if shift else None)


def measure(
    clean: JudgedSet,
    shifted: Sequence[JudgedSet],
    coords: np.ndarray,
    calibrate: Calibrate,
    *,
    seed: int,
    plan: CalibrationPlan = CalibrationPlan(),
    windows_per_kind: int | None = None,
) -> Measured | None:
    """Every headline candidate (:func:`~agent.estimation.estimators.registry.headline_candidates`) on simulated
    windows of each fold of ``clean``'s rows, calibrated on the other folds (see the module docstring);
    None when a fold would hold fewer than the plan's ``min_fold_rows`` rows. ``shifted``: corrupted copies
    of the same rows (``corruption`` windows); ``coords``: the rows' tilt coordinates
    (:func:`~agent.offline.calibration.shift_windows.tilt_coordinates`); ``windows_per_kind`` overrides the
    plan's."""
    n, folds, max_window = len(clean.correct), plan.headline_folds, plan.max_window
    per_kind = plan.windows_per_kind if windows_per_kind is None else windows_per_kind
    if clean.y is None or n < folds * plan.min_fold_rows:
        return None
    rng = np.random.default_rng(seed)
    fold = fold_of(clean.correct, folds, rng)
    planner = WindowPlanner(coords, clean.confidences, clean.y, len(shifted))
    sets = [clean, *shifted]
    correct = [np.asarray(s.correct, dtype=bool) for s in sets]
    names = headline_candidates()
    kinds: list[str] = []
    truth: list[float] = []
    values: dict[str, list[float]] = {name: [] for name in names}
    window_fold: list[int] = []
    plain_stats: list[WindowStats] = []
    confidences: list[np.ndarray] = []
    size = max_window
    for f in range(folds):
        held = np.flatnonzero(fold == f)
        calibration = calibrate(np.flatnonzero(fold != f))
        size = min(size, len(held))
        for window in planner.plan(held, per_kind * len(planner.kinds), min(max_window, len(held)), rng):
            stats = window_stats(sets, window, calibration)
            estimates = estimate_all(stats, calibration)
            kinds.append(window.kind)
            truth.append(float(np.concatenate([correct[k][i] for k, i in window.parts]).mean()))
            for name in names:
                e = estimates.get(name)
                values[name].append(np.nan if e is None else e.value)
            window_fold.append(f)
            plain_stats.append(window_stats(sets, window, calibration.with_shift(None)))
            confidences.append(np.concatenate([np.asarray(sets[k].confidences)[i] for k, i in window.parts]))
    estimates_by_name = {k: np.asarray(v) for k, v in values.items() if not np.isnan(v).any()}
    wrong = int(n - np.asarray(clean.correct, dtype=bool).sum())
    bootstrap = RowBootstrap(clean, fold, np.asarray(window_fold), plain_stats, confidences)
    return Measured(np.asarray(kinds), np.asarray(truth), estimates_by_name, size, n, folds, wrong, bootstrap)


def _ratios(per_kind: np.ndarray) -> np.ndarray:
    """The criterion of every candidate from their mean errors per kind ``[candidates, kinds]``: the
    largest over kinds of its error over the best candidate's error in that kind (floored at
    :data:`ERROR_FLOOR`), so that a kind where every estimator errs a lot does not decide alone."""
    best = np.maximum(per_kind.min(axis=0), ERROR_FLOOR)
    return (np.maximum(per_kind, ERROR_FLOOR) / best).max(axis=1)


def _per_kind(errors: np.ndarray, by_kind: Sequence[np.ndarray]) -> np.ndarray:
    """Mean errors ``[candidates, kinds]`` of the windows ``by_kind`` (indices per kind)."""
    return np.stack([errors[:, rows].mean(axis=1) for rows in by_kind], axis=1)


def _support(
    measured: Measured,
    candidates: Sequence[str],
    by_kind: Sequence[np.ndarray],
    best: int,
    default: int,
    rng: np.random.Generator,
    resamples: int,
) -> float:
    """Share of ``resamples`` resamples in which candidate ``best`` has a lower criterion than candidate
    ``default``: each draws the calibration rows of every fold again and re-estimates the windows by the
    candidates that need only the judged predictions (:class:`RowBootstrap`, when ``measured`` has it),
    then draws the windows again within each kind."""
    boot = measured.bootstrap
    again = [c for c in candidates if not REGISTRY[c].needs_model] if boot is not None else []
    wins = 0
    for _ in range(resamples):
        values = dict(measured.estimates)
        if boot is not None and again:
            values.update(boot.values(again, rng))
        errors = np.stack([np.abs(values[c] - measured.truth) for c in candidates])
        errors = np.where(np.isnan(errors), np.inf, errors)
        ratios = _ratios(_per_kind(errors, [rng.choice(rows, len(rows)) for rows in by_kind]))
        wins += int(ratios[best] < ratios[default])
    return wins / resamples


def ineligible(calibration: EstimatorCalibration) -> dict[str, str]:
    """The candidates not eligible as a headline with this calibration, with the reason: those resting on
    the oracle (their spec's ``needs_oracle``) where it separates right from wrong poorly."""
    if not weak_oracle(calibration):
        return {}
    return {s.name: "the oracle separates right from wrong poorly" for s in estimator_specs() if s.needs_oracle}


def choose(
    measured: Measured,
    *,
    seed: int,
    exclude: Mapping[str, str] | None = None,
    plan: CalibrationPlan = CalibrationPlan(),
) -> HeadlineEvidence:
    """The headline and its evidence from the measured windows (see the module docstring). ``exclude``:
    estimators measured but not eligible, with the reason (kept in the evidence's notes)."""
    order = list(dict.fromkeys(measured.kinds.tolist()))
    excluded = {k: v for k, v in (exclude or {}).items() if k in measured.estimates}
    candidates = [c for c in measured.estimates if c not in excluded] or list(measured.estimates)
    default = default_headline(candidates)
    by_kind = [np.flatnonzero(measured.kinds == k) for k in order]
    matrix = np.stack([measured.errors(c) for c in candidates])
    ratios = _ratios(_per_kind(matrix, by_kind))
    errors = {}
    for name in [*candidates, *excluded]:
        e = measured.errors(name)
        ratio = float(ratios[candidates.index(name)]) if name in candidates else float("nan")
        errors[name] = EstimatorErrors(
            float(e.mean()), float(e.max()), {k: float(e[measured.kinds == k].mean()) for k in order}, ratio
        )
    best = min(candidates, key=lambda c: (errors[c].ratio, errors[c].mean))
    support = 1.0
    few = 0 <= measured.wrong < plan.min_choice_errors and default in candidates
    if best != default and default in candidates and not few:
        rng = np.random.default_rng([seed, 1])
        b, d = candidates.index(best), candidates.index(default)
        support = _support(measured, candidates, by_kind, b, d, rng, plan.bootstrap)
    elif best != default and few:
        support = 0.0
    chosen = best if (support >= plan.support and not few) or default not in candidates else default
    return HeadlineEvidence(
        chosen=chosen,
        default=default,
        best=best,
        support=support,
        windows=len(measured.truth),
        window_size=measured.window_size,
        rows=measured.rows,
        folds=measured.folds,
        seed=seed,
        kinds={k: int((measured.kinds == k).sum()) for k in order},
        errors=errors,
        reason=_reason(
            chosen,
            default,
            best,
            {k: v for k, v in errors.items() if k in candidates},
            support,
            plan,
            measured.wrong if few else None,
        ),
        notes=tuple(f"{k} not eligible: {v}" for k, v in excluded.items()),
    )


def _reason(
    chosen: str,
    default: str,
    best: str,
    errors: dict[str, EstimatorErrors],
    support: float,
    plan: CalibrationPlan,
    few_errors: int | None = None,
) -> str:
    """The choice in one sentence (``few_errors``: the split's wrong predictions, when too few to choose on)."""
    if few_errors is not None and chosen != best:
        return (
            f"{best} errs least in its worst kind of shift relative to the best estimator there "
            f"({errors[best].ratio:.2f}x, {chosen} {errors[chosen].ratio:.2f}x), but the calibration split holds "
            f"only {few_errors} wrong prediction(s) (fewer than {plan.min_choice_errors}): a resample of so few "
            f"errors could overturn it, so {chosen} stays"
        )
    if chosen != best:
        return (
            f"{best} errs least in its worst kind of shift relative to the best estimator there "
            f"({errors[best].ratio:.2f}x, {chosen} {errors[chosen].ratio:.2f}x) but beats {chosen} in only "
            f"{support:.0%} of resamples of the calibration rows and windows (fewer than {plan.support:.0%}), "
            f"so {chosen} stays"
        )
    runner = min((n for n in errors if n != chosen), key=lambda n: errors[n].ratio, default=None)
    text = (
        f"{chosen} errs least in its worst kind of shift relative to the best estimator there "
        f"({errors[chosen].ratio:.2f}x"
    )
    text += f"; next {runner} {errors[runner].ratio:.2f}x)" if runner else ")"
    if chosen != default:
        text += f" and beats {default} in {support:.0%} of resamples"
    return text


def choose_headline(
    clean: JudgedSet,
    shifted: Sequence[JudgedSet],
    coords: np.ndarray,
    calibrate: Calibrate,
    *,
    seed: int,
    exclude: Mapping[str, str] | None = None,
    plan: CalibrationPlan = CalibrationPlan(),
) -> HeadlineEvidence | None:
    """:func:`measure` then :func:`choose`; None when the calibration split is too small to choose on."""
    measured = measure(clean, shifted, coords, calibrate, seed=seed, plan=plan)
    return None if measured is None else choose(measured, seed=seed, exclude=exclude, plan=plan)


def classic_calibration(clean: JudgedSet) -> Calibrate:
    """Calibrates the estimators that need only the judged predictions on rows of ``clean``."""
    failed = np.asarray(clean.verdicts) != 0

    def calibrate(rows: np.ndarray) -> EstimatorCalibration:
        return EstimatorCalibration.fit(clean.confidences[rows], clean.correct[rows], failed[rows])

    return calibrate


def choose_model_headline(
    sets: CalibrationSets,
    features: np.ndarray | None,
    *,
    seed: int,
    exclude: Mapping[str, str] | None = None,
    plan: CalibrationPlan = CalibrationPlan(),
) -> HeadlineEvidence | None:
    """The headline of a model bundle from evidence: :func:`choose_headline` on the calibration split
    ``sets`` was fitted from (``features``: the oracle's view of its rows, for the tilts), every
    estimator, ``shift_aware`` included, calibrated on the other folds. Costs one more ``shift_aware``
    fit per fold, on that fold's complement, without the refits behind its interval."""
    classic = classic_calibration(sets.clean)

    def calibrate(rows: np.ndarray) -> EstimatorCalibration:
        fitted = classic(rows)
        return fitted.with_shift(sets.fit(seed, rows, interval=False, plan=plan))  # only its values are measured

    coords = tilt_coordinates(features)
    return choose_headline(sets.clean, sets.shifted, coords, calibrate, seed=seed, exclude=exclude, plan=plan)
