"""The fleet's arithmetic: flat window statistics, counter increments across resets, bounded leaf bins."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pytest

from agent.estimation.layout import LEAF_BINS
from agent.estimation.statistics.items import stat_items, stats_from_items
from agent.estimation.statistics.reference import InputReference, leaf_bin_of_rule
from agent.estimation.statistics.window import SampleExtras, WindowStats
from agent.fleet.prometheus_api import Series
from agent.fleet.window_sums import MAX_POINTS, quote, range_plan, restart_times, selector


def _reference(n_rules: int, rng: np.random.Generator) -> InputReference:
    share = rng.dirichlet(np.ones(n_rules))
    return InputReference(
        center=(0.0,) * 4,
        scale=(1.0,),
        basis=((1.0, 0.0, 0.0, 0.0),),
        pca_edges=(0.1, 0.2, 0.3),
        rule_label=tuple(int(v) for v in rng.integers(0, 10, n_rules)),
        rule_selected=tuple(bool(v) for v in rng.integers(0, 2, n_rules)),
        leaf_ref=tuple(float(v) for v in share),
        class_conf=(0.9,) * 10,
        leaf_bins=LEAF_BINS,
    )


def _stats(ref: InputReference, rng: np.random.Generator, n: int = 500) -> WindowStats:
    extras = SampleExtras(
        margin=rng.random(n),
        rules=rng.integers(0, ref.n_rules, n),
        agree=rng.random(n) < 0.8,
        covered=rng.random(n) < 0.5,
        pca_error=rng.random(n) * 0.4,
        label=rng.integers(0, 10, n),
    )
    return WindowStats.of_samples(rng.integers(0, 4, n), rng.random(n), 0.7, extras, ref)


def test_flat_items_round_trip_and_stay_bounded_for_a_large_tree() -> None:
    rng = np.random.default_rng(0)
    ref = _reference(400, rng)  # an unpruned TDI tree: hundreds of leaves
    a, b = _stats(ref, rng), _stats(ref, rng)
    items = dict(stat_items(a))
    assert len(items) < 100, len(items)  # bounded whatever the number of leaves
    assert len(a.leaves) == LEAF_BINS
    back = stats_from_items(items)
    assert back.n == a.n and back.leaves == a.leaves and back.class_counts == a.class_counts
    for key, value in stat_items(back):
        assert value == pytest.approx(items[key])
    # sums of the flat items are the flat items of the sum (what the fleet evaluator relies on)
    summed = {k: v + dict(stat_items(b))[k] for k, v in items.items()}
    total = stats_from_items(summed)
    for key, value in stat_items(a + b):
        assert dict(stat_items(total))[key] == pytest.approx(value)


def test_flat_items_without_classes_fall_back_to_the_inputs_model() -> None:
    rng = np.random.default_rng(1)
    ref = _reference(30, rng)
    s = _stats(ref, rng)
    items = dict(stat_items(s, classes=False))
    assert not any(k.startswith(("class_counts", "class_conf")) for k in items)
    back = stats_from_items(items)
    assert back.n_cls == 0 and back.n_ext == s.n


def test_leaf_bins_are_contiguous_runs_of_about_equal_mass() -> None:
    share = np.full(160, 1 / 160)
    bins = leaf_bin_of_rule(share, 16)
    assert bins.tolist() == sorted(bins.tolist()) and np.bincount(bins).tolist() == [10] * 16
    assert leaf_bin_of_rule(share, 0).tolist() == list(range(160))  # references fitted before binning
    skewed = np.r_[0.9, np.full(9, 0.1 / 9)]
    assert leaf_bin_of_rule(skewed, 4).max() <= 3


def test_a_restart_is_a_sample_below_its_predecessor() -> None:
    # 100, +20, a restart (5, counting from zero), +10, a second restart (the old value passed: unseen)
    s = Series((("stat", "n"),), array("d", [10, 11, 12, 13, 14]), array("d", [100, 120, 5, 15, 30]))
    assert restart_times(s) == [12.0]
    assert restart_times(Series((), array("d", [1.0]), array("d", [3.0]))) == []


def test_one_range_query_reads_every_windows_start_unless_its_grid_is_too_fine() -> None:
    at = 1_000_000_000
    assert range_plan(at, [300_000, 3_600_000]) == [(at - 3_600_000, at, 300_000)]  # 13 points
    assert range_plan(at, [600_000]) == [(at - 600_000, at, 600_000)]  # the start and the end
    hour = range_plan(at, [60_000, 3_600_000])  # a minute's grid over an hour: 61 points, the most one may have
    assert hour == [(at - 3_600_000, at, 60_000)] and 3_600_000 // 60_000 + 1 == MAX_POINTS
    # a second's grid: each window's start and the end, by a range query of its own
    assert range_plan(at, [600_000, 47_000]) == [(at - 600_000, at, 600_000), (at - 47_000, at, 47_000)]
    for plan in (range_plan(at, w) for w in ([300_000, 3_600_000], [420_000, 900_000, 86_400_000], [1, 7, 3_600_000])):
        assert all(s < e == at and (e - s) % g == 0 and (e - s) // g + 1 <= MAX_POINTS for s, e, g in plan)


def test_a_range_answer_is_read_at_the_times_asked_and_refused_off_them() -> None:
    from agent.fleet.prometheus_api import QueryError, grid_points

    def series(*points: tuple[float, str]) -> dict[str, Any]:
        return {"metric": {"__name__": "x", "stat": "n"}, "values": [list(p) for p in points]}

    answer = [series((1.0, "5"), (1.3, "7"), (1.6, "9"))]  # from 1 s by 300 ms
    got = grid_points(answer, (1000, 1600, 300), [1000, 1600, 1900])
    assert {t: [(s.labels, s.value) for s in v] for t, v in got.items()} == {
        1000: [((("stat", "n"),), 5.0)],
        1600: [((("stat", "n"),), 9.0)],
    }
    assert grid_points([], (1000, 1600, 300), [1000]) == {1000: []}  # nothing there: the sum is zero
    refused = {
        "malformed": [
            [series((0.9, "5"), (1.2, "7"))],  # a store that moved the grid (aligned its start to the step)
            [series((1.3, "7"), (1.0, "5"))],  # times that do not increase
            [series((1.0, "5", "6"))],  # not [time, value]
        ],
        "bad_value": [[series((1.0, "NaN"))], [series((1.0, "+Inf"))]],
    }
    for reason, answers in refused.items():
        for bad in answers:
            with pytest.raises(QueryError) as err:
                grid_points(bad, (1000, 1600, 300), [1000])
            assert err.value.reason == reason, bad


def test_selectors_quote_label_values() -> None:
    assert quote('a"b\\c') == '"a\\"b\\\\c"'
    assert selector("m", 'job="x"', stat="n") == 'icos_window_stat_total{model="m",stat="n",job="x"}'


def test_bundles_fitted_before_the_leaf_bins_export_no_per_leaf_series() -> None:
    rng = np.random.default_rng(2)
    old = _reference(300, rng)
    old = _unbinned(old)
    s = _stats(old, rng)
    assert len(s.leaves) == 300  # the agent keeps one count per leaf for such a bundle
    items = dict(stat_items(s, inputs=False))
    assert len(items) < 60 and not any(k.startswith(("leaves", "pca_bins", "class_")) for k in items)
    back = stats_from_items(items)
    assert back.n == s.n and back.n_ext == 0 and back.n_cls == 0  # the reduced model, not a wrong leaf feature


def _unbinned(ref: InputReference) -> InputReference:
    from dataclasses import replace

    return replace(ref, leaf_bins=0)


def test_a_raw_nan_is_a_staleness_marker_and_skipped_any_other_non_finite_value_refused() -> None:
    """VictoriaMetrics returns a failed scrape's staleness marker among a range selector's raw samples."""
    from agent.fleet.prometheus_api import QueryError, _series

    s = _series({"metric": {"stat": "n"}, "values": [[1, "5"], [2, "NaN"], [3, "0"], [4, "2"]]})
    assert list(s.points) == [(1.0, 5.0), (3.0, 0.0), (4.0, 2.0)]
    assert restart_times(s) == [3.0]  # the reset after the marker
    with pytest.raises(QueryError) as refused:
        _series({"metric": {}, "values": [[1, "5"], [2, "+Inf"]]})
    assert refused.value.reason == "bad_value"
    with pytest.raises(QueryError) as refused:
        _series({"metric": {}, "values": [[1, "5"], [2, "NaN"], [2, "6"]]})
    assert refused.value.reason == "malformed"


def test_queries_at_once_fail_with_the_first_failure_itself_and_cancel_the_rest() -> None:
    """A refresh's failure is counted under its own reason, and no query outlives the refresh."""
    import asyncio

    from agent.fleet.prometheus_api import QueryError, concurrently

    cancelled: list[bool] = []

    async def slow() -> int:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return 0

    async def fail() -> int:
        raise QueryError("timeout", "one query past its deadline")

    async def run() -> None:
        with pytest.raises(QueryError) as refused:
            await concurrently(slow(), fail())
        assert refused.value.reason == "timeout" and cancelled == [True]
        assert await concurrently(asyncio.sleep(0, 1), asyncio.sleep(0, 2)) == [1, 2]

    asyncio.run(asyncio.wait_for(run(), 10))
