"""The label designs the label benchmark compares beside the agent's own estimators, and the stratified
draw as an agent makes it over one window: shared by :mod:`bench.labels.__main__` (the benchmark) and
:mod:`bench.labels.localized` (the same draws over a window with a faulty segment)."""

from __future__ import annotations

import math

import numpy as np

from agent.estimation.estimators.active import active_accuracy, rate_for, spread_probabilities
from agent.estimation.estimators.post_stratified import Strata, post_stratified
from agent.estimation.estimators.prediction_powered import LabeledEstimate
from agent.estimation.estimators.strata import MIN_SPREAD, StrataLearner, strata_of
from agent.estimation.statistics.window import WindowStats

ACTIVE = "active"
STRATIFIED = "stratified"
#: predictions per arriving batch of a window under stratified draws: the labels of a batch are known
#: before the next batch is drawn
BATCH = 50


def stratified_draw(
    rng: np.random.Generator,
    f: np.ndarray,
    correct: np.ndarray,
    segments: np.ndarray,
    n_segments: int,
    labels: int,
    floor: float,
    dimensions: tuple[int, ...] | None = None,
    post_stratify: tuple[np.ndarray, Strata] | None = None,
) -> LabeledEstimate:
    """Stratified draws over one window as an agent makes them (:mod:`agent.estimation.estimators.strata`): the
    predictions arrive in batches of :data:`BATCH`; each batch is drawn with the allocation learnt from the
    labels of the batches before it (none at the window's start: the bundle's prior), at the window's
    expected rate; every draw keeps its probability and the estimate is the active one. ``post_stratify``
    (every prediction's top-class probability, and the segment dimensions as ``(name, first, end)``): the
    agent's ``with_labels`` then, the narrower of the active estimate and the post-stratified one
    (:mod:`agent.estimation.estimators.post_stratified`) as the agent reports it."""
    learner = StrataLearner(n_segments, tau=math.inf, dimensions=dimensions)
    strata = strata_of(f, segments)
    target = labels / len(f)
    drawn, probs = [], []
    for start in range(0, len(f), BATCH):
        part = slice(start, start + BATCH)
        u = learner.spread(strata[:, part], f[part])
        mean_u = float(u.mean())
        pi = spread_probabilities(u, rate_for(f[part], target, mean_u, floor, spread=u), mean_u, floor)
        got = np.flatnonzero(rng.random(len(pi)) < pi)
        drawn.append(got + start)
        probs.append(pi[got])
        learner.learn(strata[:, part][:, got], f[part][got], correct[part][got], 0.0)
    s = np.concatenate(drawn)
    p = np.concatenate(probs)
    a = active_accuracy(f, s, correct[s], p)
    if a is not None and post_stratify is not None and len(s):
        conf, strata = post_stratify
        stats = WindowStats(n=len(f), conf_sum=float(conf.sum()), conf_sq_sum=float((conf * conf).sum()))
        stats.add_segment_sums(segments, n_segments, conf, np.zeros(len(f), dtype=np.int8), None)
        stats += WindowStats.of_labeled_sample(conf[s], correct[s], predicted_correct=f[s], draw_probability=p)
        stats.add_segment_labels(segments[:, s], n_segments, conf[s], correct[s], p)
        ps = post_stratified(stats, strata)
        if ps is not None and ps.upper - ps.lower < a.upper - a.lower:
            return ps
    return a if a is not None else LabeledEstimate(0.0, 0.0, 1.0, len(f), 0)


def stratified_ceiling(f: np.ndarray, correct: np.ndarray, strata: np.ndarray, floor: float) -> float:
    """The least share of uniform draws' labels the stratified design could need on one window, had it known
    every stratum's excess exactly from the start (:mod:`agent.estimation.estimators.strata`): per row of
    ``strata`` (:func:`~agent.estimation.estimators.strata.strata_of`), each prediction's spread is
    ``sqrt(f (1 − f) + e)``, ``e`` the true mean excess ``(Y − f)² − f (1 − f)`` of its stratum in the window;
    its relative rate ``p = floor + (1 − floor) · spread / mean spread``; the design's variance
    ``Σ (Y − f)² / p`` (Poisson sampling's, to first order) over uniform draws' ``Σ (Y − f)²``, both with the
    same difference estimate. The smallest over the rows, as the agent follows one row at a time. No draw on
    these strata does better at this floor: where it stays above a target, only other strata or a lower floor
    could reach it."""
    f = np.asarray(f, dtype=np.float64)
    sq = (np.asarray(correct, dtype=np.float64) - f) ** 2
    total = float(sq.sum())
    if total <= 0.0:
        return 1.0
    base = f * (1.0 - f)
    best = math.inf
    for row in np.asarray(strata, dtype=np.int64):
        _, inverse = np.unique(row, return_inverse=True)
        counts = np.bincount(inverse)
        excess = np.bincount(inverse, weights=sq - base) / counts
        spread = np.sqrt(np.maximum(base + excess[inverse], MIN_SPREAD**2))
        p = floor + (1.0 - floor) * spread / float(spread.mean())
        best = min(best, float((sq / p).sum()) / total)
    return best
