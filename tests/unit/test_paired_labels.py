"""The labels of the paired difference (drawn disagreements and their outcomes), the labeling sample's
preference for them, and the paired time windows."""

from __future__ import annotations

import time

import numpy as np
import pytest

from agent.estimation.pairs.paired import PairSums
from agent.estimation.statistics.window import WindowStats
from agent.judging.paired_windows import PairedStats, PairedWindows
from agent.labels.paired_labels import DisagreementDraws
from agent.labels.rows import LabelOutcome


def _outcome(unknown: list[str] = (), duplicate: list[str] = ()) -> LabelOutcome:  # type: ignore[assignment]
    return LabelOutcome([], 1, list(unknown), list(duplicate))


def test_a_preference_is_the_budget_on_the_disagreements_and_nothing_elsewhere() -> None:
    start = time.monotonic()  # the budget's clock
    draws = DisagreementDraws(per_window=10, window_seconds=100.0, max_kept=1000, max_age_seconds=3600)
    none = draws.preference(3, np.zeros(0, dtype=np.int64), now=start + 0.5)  # no disagreement seen yet
    assert none is not None and np.all(none == 0)
    prefer = draws.preference(6, np.array([1, 4]), now=start + 1.0)
    assert prefer is not None and prefer.shape == (6,)
    assert np.all(prefer[[0, 2, 3, 5]] == 0) and np.all(prefer[[1, 4]] > 0) and prefer[1] == prefer[4]
    assert DisagreementDraws(0, 100.0, 1000, 3600).preference(6, np.array([1]), now=50.0) is None
    # a steady stream of 10 disagreements a second: 1,000 per window, of which the budget draws 10
    late = [draws.preference(100, np.arange(0, 100, 10), now=start + 2.0 + t) for t in range(300)]
    assert late[-1] is not None and late[-1][0] == pytest.approx(10 / 1000, rel=0.2)


def test_labels_of_drawn_disagreements_give_their_outcome_once_the_store_took_them() -> None:
    draws = DisagreementDraws(per_window=10, window_seconds=100.0, max_kept=1000, max_age_seconds=3600)
    rows = np.array([0, 2, 3])
    kept = draws.remember(
        "r",
        1000.0,
        np.array([2, 3, 5]),
        np.array([0.5, 1.0, 0.2]),
        rows,
        np.array([1, 1, 7]),
        np.array([2, 4, 7]),
        np.array([0.1, -0.2, 0.3]),
    )
    assert kept == 2  # prediction 5 is no disagreement
    # r:2: champion 1, challenger 4, true 4, so d = +1
    n = draws.on_labels([("r:2", 4), ("r:3", 7), ("r:0", 2), ("x:1", 3)], _outcome(duplicate=["r:3"]))
    assert n == 1  # r:3 was refused by the store (already labeled), r:0 was not drawn, x:1 is not ours
    sums = draws.labeled_sums({"5m": 300.0, "1h": 3600.0}, now=1100.0)
    assert sums["5m"] == PairSums.of_labeled(np.array([-0.2]), np.array([1.0]), np.array([0.5]))
    assert draws.labeled_sums({"1m": 60.0}, now=1100.0) == {}
    assert draws.labeled_sums({"1h": 3600.0}, now=1000.0 + 7200.0) == {}  # forgotten past the longest window
    assert draws.kept == 0


def test_the_drawn_disagreements_are_bounded_in_count() -> None:
    draws = DisagreementDraws(per_window=10, window_seconds=100.0, max_kept=5, max_age_seconds=3600)
    for k in range(4):
        draws.remember(f"r{k}", 0.0, np.arange(3), np.ones(3), np.arange(3), np.zeros(3), np.ones(3), np.zeros(3))
    assert draws.kept == 5


def test_paired_windows_add_and_forget_their_buckets() -> None:
    windows = PairedWindows({"1m": 60.0, "1h": 3600.0})
    one = PairedStats(WindowStats(n=10), WindowStats(n=10), PairSums(n=10, n_dis=2, qa_sum=0.5, qb_sum=1.0))
    windows.record(one, now=1000.0)
    windows.record(one, now=1030.0)
    windows.record(one, now=1200.0)
    at = windows.stats(now=1210.0)
    assert at["1m"].pair.n == 10 and at["1h"].pair.n == 30 and at["1h"].champion.n == 30
    assert at["1h"].pair.qb_sum == pytest.approx(3.0) and windows.total == 30
    assert one.pair.n == 10  # the buckets copied what they were given
    windows.reset()
    assert windows.stats(now=1210.0)["1h"].pair.n == 0 and windows.total == 0
