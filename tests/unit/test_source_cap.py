"""One label source's share of a window's (and a segment's) labels, capped: the water-filling factors solve
``T = Σ min(W_s, c'·T)`` with ``c' = max(c, 1/m)``; a flood of ``__none__`` from one source moves the realized
accuracy by at most ``c'`` times its distance from the others' figure; a single source, or ``c = 1``, caps
nothing."""

from __future__ import annotations

import numpy as np
import pytest

from agent.core.label_values import NONE_INDEX
from agent.estimation.calibration import EstimatorCalibration
from agent.labels.realized import realized_window
from agent.labels.rows import LabeledRows
from agent.labels.source_cap import cap_factors, capped_group_weights, capped_weights, source_codes

CAL = EstimatorCalibration(tpr=0.6, fpr=0.05, n_wrong=100, n_right=900, accuracy=0.9, avg_conf=0.92, atc_threshold=0.7)


def test_one_source_over_the_cap_weighs_exactly_the_cap() -> None:
    f = cap_factors(np.array([10.0, 100.0]), 0.5)
    # f_s = c'·W_others / ((1 − c')·W_s) = 0.5·10 / (0.5·100)
    assert f.tolist() == pytest.approx([1.0, 0.1])
    f = cap_factors(np.array([30.0, 10.0, 160.0]), 0.5)
    assert f.tolist() == pytest.approx([1.0, 1.0, 0.5 * 40 / (0.5 * 160)])


def test_fewer_sources_than_one_over_the_cap_weigh_the_same_and_a_single_source_is_not_capped() -> None:
    f = cap_factors(np.array([5.0, 50.0, 500.0]), 0.1)  # c' = 1/3
    assert (f * [5.0, 50.0, 500.0]).tolist() == pytest.approx([5.0, 5.0, 5.0])
    assert cap_factors(np.array([0.0, 1e6, 0.0]), 0.1).tolist() == [1.0, 1.0, 1.0]
    assert cap_factors(np.array([1.0, 1e6]), 1.0).tolist() == [1.0, 1.0]  # 1: no cap


def test_the_factors_solve_the_water_filling_in_every_row() -> None:
    rng = np.random.default_rng(3)
    totals = rng.exponential(1.0, (4000, 6)) ** 3 * (rng.random((4000, 6)) < 0.8)
    for share in (0.1, 0.25, 0.3, 0.5, 0.7):
        f = cap_factors(totals, share)
        assert f.shape == totals.shape and bool((f <= 1.0).all()) and bool((f > 0).all())
        m = (totals > 0).sum(axis=1)
        cap = np.maximum(share, 1.0 / np.maximum(m, 1))
        v = totals * f
        t = v.sum(axis=1)
        several = m > 1
        fixed_point = np.minimum(totals, cap[:, None] * t[:, None]).sum(axis=1)
        assert fixed_point[several] == pytest.approx(t[several], rel=1e-9)
        assert bool((v[several] <= cap[several, None] * t[several, None] * (1 + 1e-9)).all())
        assert bool((f[~several] == 1.0).all())


def test_a_cap_within_each_segment_weighs_each_segment_on_its_own() -> None:
    groups = np.array([0, 0, 0, 0, 1, 1, 1])
    codes, k = source_codes(np.array(["a", "b", "b", "b", "b", "b", "b"], dtype=object))
    w = capped_group_weights(groups, 2, codes, k, np.ones(7), 0.5)
    # segment 0: a holds 1, b 3 → b's three weigh 1 together; segment 1: b alone, not capped
    assert w.tolist() == pytest.approx([1.0, 1 / 3, 1 / 3, 1 / 3, 1.0, 1.0, 1.0])


def _rows(correct: np.ndarray, label: np.ndarray, source: list[str]) -> LabeledRows:
    n = len(correct)
    return LabeledRows(
        timestamp=np.arange(n, dtype=float),
        verdict=np.zeros(n, np.int8),
        confidence=np.full(n, 0.9),
        correct=correct,
        abs_err=np.full(n, 0.2),
        sq_err=np.full(n, 0.02),
        n_classes=np.full(n, 3),
        label=label,
        source=np.asarray(source, dtype=object),
    )


@pytest.mark.parametrize("share", [0.5, 0.3])
def test_a_flood_of_none_moves_the_window_by_at_most_the_share(share: float) -> None:
    honest = np.array([True] * 16 + [False] * 4)  # 0.8 from the honest labeler
    flood = 400
    rows = _rows(
        np.concatenate([honest, np.zeros(flood, bool)]),
        np.concatenate([np.zeros(20, np.int64), np.full(flood, NONE_INDEX)]),
        ["labels"] * 20 + ["client:10.0.0.66"] * flood,
    )
    capped = realized_window(rows, CAL, max_source_share=share)
    plain = realized_window(rows, CAL, max_source_share=1.0)
    assert capped is not None and plain is not None
    c = max(share, 1 / 2)  # two sources: neither can weigh less than a half
    assert capped.accuracy.value == pytest.approx(0.8 - c * (0.8 - 0.0))
    assert capped.none_share == pytest.approx(c) and capped.capped == flood
    assert capped.accuracy.lower <= capped.accuracy.value <= capped.accuracy.upper
    assert capped.n == 420 and capped.correct == 16 and capped.none_of_the_classes == flood  # plain counts
    assert plain.accuracy.value == pytest.approx(16 / 420) and plain.capped == 0
    assert plain.to_dict()["capped_labels"] == 0 and capped.to_dict()["capped_labels"] == flood
    alone = realized_window(_rows(honest, np.zeros(20, np.int64), ["labels"] * 20), CAL, max_source_share=share)
    assert alone is not None and alone.accuracy.value == pytest.approx(0.8) and alone.capped == 0


def test_labels_of_unknown_source_are_one_source() -> None:
    rows = LabeledRows.from_tuples([(1.0, 0, 0.9, True, 0.1, 0.01, 2)] * 3)
    assert rows.source is not None and rows.source.tolist() == ["", "", ""]
    w, n = capped_weights(rows.source, None, 0.5)
    assert w.tolist() == [1.0, 1.0, 1.0] and n == 0
