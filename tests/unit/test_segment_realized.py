"""A segment's realized accuracy from the labels drawn: the share of right ones under uniform draws, the
inverse-probability-weighted share under draws of unequal probability, with an interval at the effective
number of labels."""

from __future__ import annotations

import numpy as np
import pytest

from agent.estimation.intervals import wilson
from agent.estimation.segments.realized import SegmentLabels


def test_uniform_labels_give_each_segment_its_share_right_and_the_wilson_interval() -> None:
    ids = np.array([[0, 0, 0, 1, 1, 3], [4, 5, 4, 5, 4, 5]])  # 3: a dimension that could not read its input
    correct = np.array([True, False, True, True, True, False])
    labels = SegmentLabels.of(ids, 6, correct)
    n, e = labels.estimate(0)
    assert n == 3 and e is not None and e.value == pytest.approx(2 / 3)
    assert (e.lower, e.upper) == pytest.approx(wilson(2, 3))
    assert labels.estimate(2) == (0, None)
    assert labels.estimate(4)[0] == 3 and labels.estimate(5)[0] == 3


def test_weighted_labels_are_unbiased_for_the_segment() -> None:
    rng = np.random.default_rng(2)
    n = 20_000
    seg = rng.integers(0, 2, n)
    f = rng.uniform(0.3, 1.0, n)
    correct = rng.random(n) < f
    pi = np.clip(0.05 + 0.3 * (1 - f), 0, 1)  # uncertain predictions drawn more often
    values = []
    for _ in range(200):
        d = np.flatnonzero(rng.random(n) < pi)
        _, e = SegmentLabels.of(seg[d][None, :], 2, correct[d], 1 / pi[d]).estimate(1)
        assert e is not None
        values.append(e.value)
    truth = float(correct[seg == 1].mean())
    assert float(np.mean(values)) == pytest.approx(truth, abs=0.004)
    unweighted = SegmentLabels.of(seg[d][None, :], 2, correct[d]).estimate(1)[1]
    assert unweighted is not None and unweighted.value < truth - 0.03  # the design's favourites, unweighted
