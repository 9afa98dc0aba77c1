"""Stratified label draws (:mod:`agent.estimation.estimators.strata`): the allocation follows the labels to the stratum
where the predictor of correctness is wrong, stays the calibrated one elsewhere, and the estimate of draws
made with it stays unbiased for the window's accuracy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agent.estimation.estimators.active import active_accuracy, rate_for, spread_probabilities, uncertainty
from agent.estimation.estimators.strata import MIN_SPREAD, N_BINS, StrataLearner, strata_of


def test_strata_are_the_bin_of_f_then_the_segments() -> None:
    f = np.array([0.1, 0.6, 0.8, 0.9, 0.99])
    segments = np.array([[0, 1, 0, 1, 2], [3, 3, 4, 4, 5]])
    strata = strata_of(f, segments)
    assert strata.shape == (3, 5)
    assert strata[0].tolist() == [0, 1, 2, 3, 4]
    assert strata[1:].tolist() == (segments + N_BINS).tolist()
    assert strata_of(f, None).shape == (1, 5)


def test_errors_in_one_segment_draw_more_labels_there_and_nowhere_else() -> None:
    rng = np.random.default_rng(3)
    n = 4000
    seg = rng.integers(0, 4, n)[None, :]
    f = np.full(n, 0.95)
    # the predictor says 95% everywhere; segment 2 is right half the time
    correct = np.where(seg[0] == 2, rng.random(n) < 0.5, rng.random(n) < 0.95)
    learner = StrataLearner(4, tau=math.inf)
    strata = strata_of(f, seg)
    before = learner.spread(strata, f)
    assert np.allclose(before, uncertainty(f))  # no labels: the bundle's calibrated prior
    labeled = rng.choice(n, 200, replace=False)
    learner.learn(strata[:, labeled], f[labeled], correct[labeled], now=0.0)
    after = learner.spread(strata, f)
    in_drop = seg[0] == 2
    assert after[in_drop].min() > 1.5 * after[~in_drop].max()
    assert float(np.median(after[~in_drop])) == pytest.approx(float(uncertainty(f)[0]), abs=0.05)
    assert after.min() >= MIN_SPREAD
    wanted = learner.wanted(strata, f)
    assert wanted[in_drop].mean() > wanted[~in_drop].mean()


def test_what_was_learnt_fades_with_time() -> None:
    f = np.full(50, 0.9)
    strata = strata_of(f, np.zeros((1, 50), dtype=np.int64))
    learner = StrataLearner(1, tau=10.0)
    learner.learn(strata, f, np.zeros(50, dtype=bool), now=0.0)
    high = learner.spread(strata, f)[0]
    learner.learn(strata[:, :0], f[:0], np.zeros(0, dtype=bool), now=0.0)
    learner.learn(strata[:, :1], f[:1], np.ones(1, dtype=bool), now=1000.0)
    assert learner.labels()[N_BINS] < 2.0
    assert learner.spread(strata, f)[0] < high


def test_every_probability_keeps_the_uniform_floor() -> None:
    u = np.array([0.0, 0.01, 0.3, 0.5])
    pi = spread_probabilities(u, 0.1, float(u.mean()), floor=0.5)
    assert (pi >= 0.05 - 1e-12).all() and pi[3] > pi[0]


def test_stratified_draws_are_unbiased_for_the_window() -> None:
    """Draws made batch by batch with the allocation learnt from the batches before: the inverse-probability
    estimate's mean over many draws is the window's accuracy, and its interval covers it."""
    rng = np.random.default_rng(11)
    n = 1000
    seg = rng.integers(0, 5, n)[None, :]
    f = np.clip(rng.beta(8, 1, n), 0.0, 1.0)
    correct = np.where(seg[0] == 1, rng.random(n) < 0.4, rng.random(n) < f)
    truth = float(correct.mean())
    strata = strata_of(f, seg)
    values, covered = [], []
    for _ in range(400):
        learner = StrataLearner(5, tau=math.inf)
        drawn, probs = [], []
        for start in range(0, n, 100):
            part = slice(start, start + 100)
            u = learner.spread(strata[:, part], f[part])
            pi = spread_probabilities(u, rate_for(f[part], 0.08, float(u.mean()), 0.5, spread=u), float(u.mean()))
            got = np.flatnonzero(rng.random(len(pi)) < pi)
            drawn.append(got + start)
            probs.append(pi[got])
            learner.learn(strata[:, part][:, got], f[part][got], correct[part][got], now=0.0)
        s = np.concatenate(drawn)
        e = active_accuracy(f, s, correct[s], np.concatenate(probs), tuned=False)
        assert e is not None
        values.append(e.value)
        covered.append(e.lower <= truth <= e.upper)
    se = float(np.std(values)) / math.sqrt(len(values))
    assert abs(float(np.mean(values)) - truth) < 4 * se + 1e-3
    assert float(np.mean(covered)) >= 0.9


def test_a_listing_by_worth_puts_the_most_wanted_first_and_the_unknown_last() -> None:
    from agent.labels.intake import by_worth

    entries = [{"id": str(i), "timestamp": float(10 - i)} for i in range(5)]
    ordered = by_worth(entries, [0.1, None, 0.5, 0.3, None])
    assert [e["id"] for e in ordered] == ["2", "3", "0", "1", "4"]
    assert ordered[0]["worth"] == 0.5 and ordered[-1]["worth"] is None
