"""The fleet's checks of the replicas' summed pair sums: what replicas of one pair cannot have sent is refused."""

from __future__ import annotations

import pytest

from agent.estimation.pairs.paired import PairSums
from agent.fleet.challenger import PAIR_METRIC, PAIR_SCHEMA, checked_pair_sums
from agent.fleet.stat_schema import RefusedAnswer
from agent.fleet.window_sums import selector


def test_consistent_sums_pass_and_counts_are_rounded() -> None:
    s = checked_pair_sums({"n": 1000.0000001, "n_dis": 40, "qa_sum": 12.5, "qb_sum": 20.0, "g_sq_sum": 8.0}, 1e4, "w")
    assert s == PairSums(1000, 40, 12.5, 20.0, 8.0)


@pytest.mark.parametrize(
    ("items", "why"),
    [
        ({"n": 10, "n_dis": 11}, "n_dis 11 > n 10"),
        ({"n": 10.4, "n_dis": 1}, "not a whole number"),
        ({"n": 10, "n_dis": 2, "qa_sum": 1.5, "qb_sum": 1.0}, "exceed their count"),
        ({"n": 10, "n_dis": 2, "g_sq_sum": 3.0}, "exceed their count"),
        ({"n": 10, "n_dis": 2, "qa_sum": -1.0}, "negative"),
    ],
)
def test_sums_no_pair_of_replicas_can_send_are_refused(items: dict[str, float], why: str) -> None:
    with pytest.raises(RefusedAnswer, match=why):
        checked_pair_sums(items, 100.0, "window 5m")


def test_the_pair_sums_are_read_from_their_own_counter() -> None:
    assert PAIR_SCHEMA.known("n_dis") and not PAIR_SCHEMA.known("cells:0")
    assert selector("m", "", PAIR_METRIC, stat="n") == 'icos_challenger_stat_total{model="m",stat="n"}'
