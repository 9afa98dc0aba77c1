"""What changed where, label-free (:mod:`agent.estimation.segments.change`): the sketch's sums add up like every
other statistic, survive the flat export, and the test finds a column broken inside one segment, a correlation
broken by a shuffle and a segment unseen at fit, while clean windows report nothing."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from agent.estimation.estimators.active import rate_for, spread_probabilities
from agent.estimation.segments.change import (
    MAX_SCORE,
    ChangeReference,
    ColumnChange,
    SegmentChange,
    WindowChange,
    segment_changes,
)
from agent.estimation.segments.scope import shares_moved
from agent.estimation.segments.sketch import (
    CLIP,
    ChangeSketch,
    column_pairs,
    correlation_factors,
    cross_products,
    reference_moments,
)
from agent.estimation.segments.table import SegmentRow, rank, rank_evidence
from agent.estimation.statistics.items import stat_items, stats_from_items
from agent.estimation.statistics.window import WindowStats
from agent.labels.change_focus import FOCUS, focus_factors, focus_weights
from agent.offline.calibration.segments.change import define_change
from agent.offline.calibration.segments.data import ColumnGroup, SegmentData, ViewShape
from tests.support.change_windows import change_window, changes_of, window_change

SEGMENTS = 4  # one dimension: a categorical column of four values


def _rows(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows: a segment (0 … 3) and three columns; ``a`` and ``b`` correlated within every segment, each
    segment its own mean."""
    seg = rng.integers(0, SEGMENTS, n)
    a = rng.normal(seg.astype(float), 1.0)
    b = 0.8 * a + rng.normal(0, 0.6, n)
    c = rng.exponential(1.0 + seg, n)
    return seg, np.stack([a, b, c], axis=1)


def _sketch(rng: np.random.Generator) -> ChangeSketch:
    seg, x = _rows(4000, rng)
    mean, sd = x.mean(axis=0), x.std(axis=0)
    weights = tuple(tuple(float(v) for v in row) for row in np.diag(1 / sd))
    bias = tuple(float(v) for v in -mean / sd)
    draft = ChangeSketch(("a", "b", "c"), weights, bias, (0,) * SEGMENTS, ((0.0,) * (3 * SEGMENTS),) * 4)
    z = draft.values(x)
    assert z is not None
    counts, moments, cross = reference_moments(seg[None, :], SEGMENTS, z)
    return ChangeSketch(("a", "b", "c"), weights, bias, tuple(counts), tuple(map(tuple, moments)), tuple(cross))


def _window(sketch: ChangeSketch, seg: np.ndarray, x: np.ndarray) -> WindowStats:
    z = sketch.values(x)
    assert z is not None
    out = WindowStats(n=len(seg))
    out.seg_n = np.bincount(seg, minlength=SEGMENTS).tolist()
    out.seg_fails = [0] * SEGMENTS
    out.add_change_sums(seg[None, :], SEGMENTS, z, cross_products(z))
    return out


def _changes(sketch: ChangeSketch, stats: WindowStats, ref_n: tuple[int, ...] | None = None) -> list:
    n = ref_n if ref_n is not None else sketch.ref_n
    ref = ChangeReference(n, [(0, SEGMENTS)], [100] * SEGMENTS, [0] * SEGMENTS, 0.01)
    return segment_changes(sketch, window_change(stats), ref)


def test_values_are_clipped_offset_and_bounded_whatever_the_input() -> None:
    sketch = _sketch(np.random.default_rng(0))
    x = np.array([[1e30, -1e30, np.nan], [0.0, 0.0, 0.0]])
    z = sketch.values(x)
    assert z is not None and z.shape == (2, 3)
    assert np.all((z >= 0) & (z <= 2 * CLIP)) and z[0, 0] == 2 * CLIP and z[0, 1] == 0
    assert sketch.values(np.zeros((2, 2))) is None  # narrower than at fit
    assert ChangeSketch.from_dict(sketch.to_dict()) == sketch


def test_a_float32_view_reads_the_change_columns_of_its_float64_values() -> None:
    """The served view is float32 and is read in float64 a few rows at a time: the same change columns as its values
    read at once in float64, whatever a row's place in its batch (a window's sums over partitions of the data equal
    its sums over the whole); values near float32's largest, infinite or missing read as the float64 read reads
    them, clipped."""
    sketch = _sketch(np.random.default_rng(1))
    _, x = _rows(30_000, np.random.default_rng(2))  # more rows than one step reads
    x32 = x.astype(np.float32)
    got, want = sketch.values(x32), sketch.values(x32.astype(np.float64))
    assert got is not None and want is not None and got.dtype == np.float64
    assert np.abs(got - want).max() < 1e-12
    alone = sketch.values(x32[12_345:12_346])
    assert alone is not None and np.abs(alone[0] - got[12_345]).max() < 1e-12
    huge = np.array([[3e38, -np.inf, np.nan], [1.0, -3e38, 2.0]], dtype=np.float32)
    got, want = sketch.values(huge), sketch.values(huge.astype(np.float64))
    assert got is not None and want is not None and np.abs(got - want).max() < 1e-12
    assert got[0, 0] == 2 * CLIP and got[0, 1] == 0 and got[1, 1] == 0


def test_sums_add_across_batches_and_survive_the_sparse_export() -> None:
    rng = np.random.default_rng(1)
    sketch = _sketch(rng)
    seg, x = _rows(600, rng)
    whole = _window(sketch, seg, x)
    halves = _window(sketch, seg[:250], x[:250]) + _window(sketch, seg[250:], x[250:])
    for name in ("change_n", "change_sum", "change_sq", "change_cross"):
        assert getattr(halves, name) == pytest.approx(getattr(whole, name), rel=1e-12), name
    assert len(whole.change_cross) == SEGMENTS * len(column_pairs(3))
    seg_few = np.where(seg == 2, 1, seg)  # segment 2 holds nothing: the sparse export leaves it out
    few = _window(sketch, seg_few, x)
    back = stats_from_items(dict(stat_items(few, sparse_segments=True)))
    assert not any(k.startswith("change_sum:6") for k, _ in stat_items(few, sparse_segments=True))
    for name in ("change_sum", "change_sq", "change_cross"):
        got, want = getattr(back, name), getattr(few, name)
        assert got == pytest.approx(want[: len(got)]) and not any(want[len(got) :])


def test_clean_windows_report_no_change() -> None:
    rng = np.random.default_rng(2)
    sketch = _sketch(rng)
    flagged = 0
    for _ in range(40):
        seg, x = _rows(1000, rng)
        flagged += any(c.changed for c in _changes(sketch, _window(sketch, seg, x)))
    assert flagged <= 2  # a familywise rate of 1% over every segment and column, and an effect floor


UNEVEN = np.array([0.45, 0.3, 0.15, 0.07, 0.03])  # segments of a validation split of 1,000 rows: 30 to 450 rows
KINDS = ("normal", "skewed", "binary", "count", "rounded", "zero_inflated", "mixed")


def _kinds(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of columns of the kinds tables hold (:data:`KINDS`), each segment of :data:`UNEVEN` its own."""
    seg = rng.choice(len(UNEVEN), n, p=UNEVEN)
    normal, skewed = rng.normal(seg * 0.5, 1.0), rng.lognormal(0.0, 0.6 + 0.1 * seg)
    x = np.stack(
        [
            normal,
            skewed,
            (rng.random(n) < 0.2 + 0.1 * seg).astype(float),
            rng.poisson(1.5 + seg).astype(float),
            np.round(rng.normal(40, 12, n)),
            (rng.random(n) < 0.02) * rng.exponential(5.0, n),  # mostly 0: a reference segment may hold no other
            0.7 * normal + 0.5 * skewed + rng.normal(0.0, 0.4, n),  # skewed, and related to the others
        ],
        axis=1,
    )
    return seg, x


def _fitted_kinds(rng: np.random.Generator) -> tuple[ChangeSketch, ChangeReference]:
    """A sketch fitted as ``fit`` fits a table's on :func:`_kinds`, with a validation split of 1,000 rows."""
    size = len(UNEVEN)
    (_, x_t), (seg_v, x_v) = _kinds(3000, rng), _kinds(1000, rng)
    y_t, y_v = (x_t[:, 0] > 0.5).astype(np.int64), (x_v[:, 0] > 0.5).astype(np.int64)
    data = SegmentData(x_t, y_t, x_v, y_v, np.zeros((1000, 2)), y_v, np.arange(0), np.zeros(0), None, ("0", "1"))
    shape = ViewShape(tuple(ColumnGroup(name, (j,)) for j, name in enumerate(KINDS)), regions=False)
    sketch = define_change(data, shape, seg_v[None, :], size)
    assert sketch is not None
    return sketch, ChangeReference(sketch.ref_n, [(0, size)], [100] * size, [0] * size, 0.01)


def _kinds_changes(sketch: ChangeSketch, ref: ChangeReference, seg: np.ndarray, x: np.ndarray) -> list[SegmentChange]:
    return changes_of(sketch, ref, seg, x, len(UNEVEN))


def test_clean_windows_of_skewed_discrete_and_mostly_zero_columns_report_no_change() -> None:
    """A validation split of 1,000 rows in uneven segments reads a skewed, a discrete or a mostly-zero column's tails
    from a few rows, or none of its rare values at all: the test must not read a window's ordinary tail as a change
    (before the window's spread entered the test as a variance squared, and the shape was bounded, 19 of these 120
    windows reported one), while a column stuck or scaled inside one segment is still found there."""
    flagged = windows = 0
    for seed in range(8):
        rng = np.random.default_rng(100 + seed)
        sketch, ref = _fitted_kinds(rng)
        for _ in range(15):
            windows += 1
            flagged += any(c.changed for c in _kinds_changes(sketch, ref, *_kinds(500, rng)))
    assert flagged <= 0.05 * windows, (flagged, windows)

    rng = np.random.default_rng(200)
    sketch, ref = _fitted_kinds(rng)
    for column, how in ((3, "stuck"), (1, "scaled")):
        seg, x = _kinds(1000, rng)
        hit = np.flatnonzero(seg == 1)
        x[hit, column] = x[hit[0], column] if how == "stuck" else 3.0 * x[hit, column]
        found = _kinds_changes(sketch, ref, seg, x)
        assert [s for s, c in enumerate(found) if c.changed] == [1], (how, found)
        assert found[1].columns[0].column == KINDS[column], (how, found[1])


def test_a_column_stuck_at_a_constant_inside_a_thin_segment_is_found_there() -> None:
    """A spread collapsed to nothing is as far as a sample's variance can fall, but read linearly in the deviations
    a count column's kurtosis sets it was about one of them: the column stuck inside a segment of 7% of the rows was
    found in none of these windows, and inside one of 15% in 4 of these 10."""
    rng = np.random.default_rng(500)
    sketch, ref = _fitted_kinds(rng)
    column = KINDS.index("count")
    for s in (2, 3):
        found = 0
        for _ in range(10):
            seg, x = _kinds(1000, rng)
            hit = np.flatnonzero(seg == s)
            x[hit, column] = np.median(x[hit, column])
            changes = _kinds_changes(sketch, ref, seg, x)
            found += changes[s].changed and changes[s].columns[0].column == "count"
        assert found >= 9, (s, found)


def test_a_spread_halved_inside_a_segment_of_a_column_whose_segments_differ_in_spread_is_found_there() -> None:
    """A normal column whose segments differ only in spread (1 to 8) has, over all its rows, the tails of a mixture
    (a kurtosis far above 3), though each segment's are normal's. Read in the mixture's tails, its spread halved
    inside the segments of 45% and 30% of the rows was found in none of these windows; the segments' own tails find
    it in every one, and clean windows stay quiet."""
    scale = np.array([1.0, 1.5, 2.0, 4.0, 8.0])
    rng = np.random.default_rng(3)

    def rows(n: int) -> tuple[np.ndarray, np.ndarray]:
        seg = rng.choice(len(UNEVEN), n, p=UNEVEN)
        return seg, np.stack([rng.normal(0.0, scale[seg]), rng.normal(size=n)], axis=1)

    (_, x_t), (seg_v, x_v) = rows(3000), rows(1000)
    y_t, y_v = (x_t[:, 1] > 0).astype(np.int64), (x_v[:, 1] > 0).astype(np.int64)
    data = SegmentData(x_t, y_t, x_v, y_v, np.zeros((1000, 2)), y_v, np.arange(0), np.zeros(0), None, ("0", "1"))
    shape = ViewShape((ColumnGroup("a", (0,)), ColumnGroup("b", (1,))), regions=False)
    sketch = define_change(data, shape, seg_v[None, :], len(UNEVEN))
    assert sketch is not None
    ref = ChangeReference(sketch.ref_n, [(0, len(UNEVEN))], [100] * len(UNEVEN), [0] * len(UNEVEN), 0.01)
    for s in (0, 1):
        found = alarms = 0
        for _ in range(10):
            seg, x = rows(1000)
            alarms += any(c.changed for c in _kinds_changes(sketch, ref, seg, x))
            x[seg == s, 0] *= 0.5
            changes = _kinds_changes(sketch, ref, seg, x)
            found += changes[s].changed and changes[s].columns[0].column == "a"
        assert found >= 9 and alarms == 0, (s, found, alarms)


def test_a_pairs_correlation_factor_is_the_variance_of_its_fisher_z_over_a_normal_pairs() -> None:
    """Fisher's ``z`` of a correlation has variance ``1/(n − 3)`` for normal columns only: the factor fit measures is
    1 for a normal pair and, for a skewed pair, the variance its correlation shows over repeated samples."""
    rng = np.random.default_rng(7)

    def skewed(n: int) -> np.ndarray:
        a = rng.lognormal(0.0, 0.6, n)
        return np.stack([a, 0.7 * a + rng.normal(0.0, 0.5, n)], axis=1)

    a = rng.normal(size=100_000)
    normal = np.stack([a, 0.6 * a + 0.8 * rng.normal(size=100_000)], axis=1)
    assert correlation_factors(normal, [(0, 1)])[0] == pytest.approx(1.0, abs=0.05)
    n = 400
    fisher = [math.atanh(np.corrcoef(skewed(n).T)[0, 1]) for _ in range(2000)]
    seen = float(np.var(fisher)) * (n - 3)
    measured = correlation_factors(skewed(200_000), [(0, 1)])[0]
    assert seen > 1.5 and measured == pytest.approx(seen, rel=0.25), (seen, measured)
    constant = np.stack([np.ones(50), rng.normal(size=50)], axis=1)
    assert correlation_factors(constant, [(0, 1)])[0] == 1.0


@pytest.mark.parametrize(("how", "column"), [("zeroed", "a"), ("scaled", "c"), ("stuck", "c"), ("shuffled", "a ~ b")])
def test_a_column_broken_inside_one_segment_is_found_there(how: str, column: str) -> None:
    rng = np.random.default_rng(3)
    sketch = _sketch(rng)
    seg, x = _rows(1000, rng)
    hit = np.flatnonzero(seg == 2)
    if how == "zeroed":
        x[hit, 0] = 0.0
    elif how == "scaled":
        x[hit, 2] *= 100
    elif how == "stuck":
        x[hit, 2] = x[hit[0], 2]
    else:  # the values of other rows of the segment: its own distribution stays, its correlation with b goes
        x[hit, 0] = x[rng.permutation(hit), 0]
    changes = _changes(sketch, _window(sketch, seg, x))
    assert changes[2].changed and changes[2].columns[0].column == column, changes[2]
    assert [s for s, c in enumerate(changes) if c.changed] == [2]
    assert changes[2].score == max(c.score for c in changes)


def test_effects_beyond_the_score_cap_still_rank_by_their_size() -> None:
    """A column scaled inside a segment moves it by tens of its own deviations: the score (a bounded figure)
    is capped, the rank's effect is not, so the segment whose inputs moved most still ranks first rather than
    the share alone deciding between two capped ones."""
    rng = np.random.default_rng(3)
    sketch = _sketch(rng)
    seg, x = _rows(1000, rng)
    x[seg == 0, 2] *= 100
    x[seg == 1, 2] *= 10
    changes = _changes(sketch, _window(sketch, seg, x))
    assert changes[0].score == changes[1].score == MAX_SCORE
    assert changes[0].input_score > changes[1].input_score > MAX_SCORE


def test_a_segment_unseen_at_fit_is_changed_by_definition() -> None:
    rng = np.random.default_rng(4)
    sketch = _sketch(rng)
    seg, x = _rows(1000, rng)
    changes = _changes(sketch, _window(sketch, seg, x), ref_n=(*sketch.ref_n[:3], 0))
    assert changes[3].changed and changes[3].columns[0].kind == "share"
    assert not any(c.changed for c in changes[:3])


def test_the_labels_follow_the_change_within_the_same_budget() -> None:
    """A tenth of the traffic in the changed segment: with the focus about four labels in five are drawn
    there, and the expected number drawn stays the budget."""
    rng = np.random.default_rng(5)
    n = 1000
    ids = (rng.uniform(size=n) < 0.1).astype(np.int64)[None, :]  # segment 1: the changed one
    f = rng.uniform(0.6, 0.99, n)
    u = np.sqrt(f * (1 - f))
    g = focus_factors(ids, {1: 1.0}, n)
    assert g is not None and set(np.unique(g)) == {1.0, 1.0 + FOCUS}
    rate = rate_for(f, 100 / n, float(u.mean()), 0.5, spread=u, focus=g)
    pi = spread_probabilities(u, rate, float(u.mean()), 0.5, g, float(g.mean()))
    assert pi.sum() == pytest.approx(100, rel=1e-3)
    inside = pi[ids[0] == 1].sum()
    assert inside / pi.sum() > 0.7
    assert focus_factors(ids, {}, n) is None and focus_factors(None, {1: 1.0}, n) is None


def _confidence_changes(conf: np.ndarray, seg: np.ndarray, ref_conf: np.ndarray, ref_seg: np.ndarray) -> list:
    """The changes of a window whose sketched columns do not move, with confidences ``conf`` against a
    reference of ``ref_conf`` (only the model's confidence can show a change)."""
    ref_n = np.bincount(ref_seg, minlength=SEGMENTS)
    mean = np.bincount(ref_seg, weights=ref_conf, minlength=SEGMENTS) / ref_n
    square = np.bincount(ref_seg, weights=ref_conf**2, minlength=SEGMENTS) / ref_n
    seg_n = np.bincount(seg, minlength=SEGMENTS).tolist()
    window = WindowChange(
        [],
        [],
        [],
        seg_n,
        [0] * SEGMENTS,
        (),
        np.bincount(seg, weights=conf, minlength=SEGMENTS).tolist(),
        np.bincount(seg, weights=conf**2, minlength=SEGMENTS).tolist(),
    )
    ref = ChangeReference(
        ref_n.tolist(), [(0, SEGMENTS)], [100] * SEGMENTS, [0] * SEGMENTS, 0.01, mean, ref_n, square - mean**2
    )
    return segment_changes(None, window, ref)


def test_a_confidence_fallen_beyond_noise_is_a_change_that_ranks_by_nothing() -> None:
    """A model's confidence moves only when its inputs do: a segment whose confidence fell far beyond noise is
    changed (``model confidence``) although no sketched column shows it, with no input effect to rank it by;
    a confidence within noise, or risen, is no change."""
    rng = np.random.default_rng(7)

    def confidences(seg: np.ndarray, fallen: float) -> np.ndarray:
        out = rng.beta(8.0, 2.0, len(seg))
        out[seg == 1] -= fallen
        return np.clip(out, 0.0, 1.0)

    ref_seg = rng.integers(0, SEGMENTS, 4000)
    ref_conf = confidences(ref_seg, 0.0)
    quiet = 0
    for _ in range(40):
        seg = rng.integers(0, SEGMENTS, 1000)
        quiet += not any(c.changed for c in _confidence_changes(confidences(seg, 0.0), seg, ref_conf, ref_seg))
    assert quiet >= 38
    seg = rng.integers(0, SEGMENTS, 1000)
    found = _confidence_changes(confidences(seg, 0.1), seg, ref_conf, ref_seg)
    assert [c.changed for c in found] == [False, True, False, False]
    assert found[1].names == ["model confidence"] and found[1].columns[0].kind == "model_confidence"
    assert found[1].score == pytest.approx(found[1].columns[0].distance) and found[1].score > 0.5
    assert found[1].input_score == 0.0  # it tells that the inputs moved, not how far
    risen = _confidence_changes(confidences(seg, -0.1), seg, ref_conf, ref_seg)
    assert not any(c.changed for c in risen)


def test_a_share_of_novel_inputs_above_the_reference_is_a_change_that_ranks_by_nothing() -> None:
    """Novel inputs (the input PCA's error beyond its clean quantile) read the whole feature view: a segment
    whose share of them rose far beyond its reference share is changed (``novel inputs``), unranked; a share
    within noise is no change."""
    rng = np.random.default_rng(8)
    ref_n = [1000] * SEGMENTS

    def changes(novel_rate: list[float]) -> list:
        seg = rng.integers(0, SEGMENTS, 2000)
        novel = rng.uniform(size=len(seg)) < np.asarray(novel_rate)[seg]
        window = WindowChange(
            [], [], [], np.bincount(seg, minlength=SEGMENTS).tolist(), [0] * SEGMENTS, (), (), (),
            np.bincount(seg, weights=novel, minlength=SEGMENTS).astype(int).tolist(),
        )  # fmt: skip
        ref = ChangeReference(
            ref_n, [(0, SEGMENTS)], [100] * SEGMENTS, [0] * SEGMENTS, 0.01, novel=[0.01] * SEGMENTS, novel_n=ref_n
        )
        return segment_changes(None, window, ref)

    assert sum(any(c.changed for c in changes([0.01] * SEGMENTS)) for _ in range(40)) <= 2
    found = changes([0.01, 0.01, 0.3, 0.01])
    assert [c.changed for c in found] == [False, False, True, False]
    assert found[2].names == ["novel inputs"] and found[2].columns[0].kind == "novelty"
    assert found[2].input_score == 0.0 and found[2].score > 1.0
    # a thin segment's few novel rows (4 of 27 at a reference share of 1.5%) lie within the binomial tail's bound,
    # though the normal approximation would call them a change
    thin = WindowChange([], [], [], [27, 500, 500, 500], [0] * SEGMENTS, (), (), (), [4, 5, 5, 5])
    ref = ChangeReference(
        ref_n, [(0, SEGMENTS)], [100] * SEGMENTS, [0] * SEGMENTS, 0.01, novel=[0.015] * SEGMENTS, novel_n=ref_n
    )
    assert not segment_changes(None, thin, ref)[0].changed


def test_a_change_ranks_a_segment_cut_by_the_inputs_not_one_cut_by_the_models_output() -> None:
    """The oracle's failures far above a segment's calibration rate are a change either way; they rank a segment cut
    by the inputs (a shuffled column breaks invariants where it lives) but not one cut by the predicted class, where
    the rows of a fault land wherever in the inputs it lives; nor does a column's change."""
    seg_n = [500] * SEGMENTS
    fails = [5, 5, 60, 5]  # 1% at calibration, 12% in segment 2
    window = WindowChange([], [], [], seg_n, fails)

    def changes(by_output: list[bool]) -> list[SegmentChange]:
        ref = ChangeReference(
            [1000] * SEGMENTS, [(0, SEGMENTS)], [1000] * SEGMENTS, [10] * SEGMENTS, 0.01, by_output=by_output
        )
        return segment_changes(None, window, ref)

    by_inputs, by_output = changes([False] * SEGMENTS), changes([True] * SEGMENTS)
    assert [c.changed for c in by_inputs] == [c.changed for c in by_output] == [False, False, True, False]
    assert by_inputs[2].names == by_output[2].names == ["oracle failures"]
    assert by_inputs[2].input_score == pytest.approx(by_inputs[2].score) and by_inputs[2].input_score > 1.0
    assert by_output[2].input_score == 0.0 and by_output[2].score == pytest.approx(by_inputs[2].score)
    # a column zeroed inside segment 2: changed either way, ranked only where the segment is cut by the inputs
    rng = np.random.default_rng(3)
    sketch = _sketch(rng)
    seg, x = _rows(1000, rng)
    x[seg == 2, 0] = 0.0
    stats = _window(sketch, seg, x)
    zeroed = WindowChange(stats.change_n, stats.change_sum, stats.change_sq, stats.seg_n, stats.seg_fails)
    for output, ranked in ((False, True), (True, False)):
        ref = ChangeReference(
            sketch.ref_n, [(0, SEGMENTS)], [100] * SEGMENTS, [0] * SEGMENTS, 0.01, by_output=[output] * SEGMENTS
        )
        found = segment_changes(sketch, zeroed, ref)[2]
        assert found.changed and found.names[0] == "a" and (found.input_score > 0.5) == ranked


def _confidence_row(index: int, name: str, share: float, distance: float, contribution: float) -> SegmentRow:
    """A segment whose only change is its model confidence (a test that does not rank by effect)."""
    change = ColumnChange("model confidence", -distance, 1.0, distance, 1e-9, "model_confidence")
    return SegmentRow(
        index,
        "column",
        "dim",
        name,
        int(1000 * share),
        share,
        share,
        0.9,
        500,
        None,
        0.0,
        contribution,
        0.0,
        change=SegmentChange(True, distance, (change,), input_score=0.0),
    )


def test_changed_segments_without_ranked_evidence_rank_by_the_size_of_their_change() -> None:
    """Two segments whose confidence alone moved: the narrow one whose confidence fell by two deviations ranks
    before the wide one whose confidence fell by a few tenths, whichever contributes more; a segment whose
    inputs moved (ranked evidence) still comes first; scores tied at the cap rank by contribution."""
    narrow = _confidence_row(0, "narrow", 0.04, 2.25, 0.001)
    wide = _confidence_row(1, "wide", 0.67, 0.40, 0.010)
    assert [r.name for r in sorted([wide, narrow], key=rank)] == ["narrow", "wide"]
    moved = dataclasses.replace(
        _confidence_row(2, "moved", 0.2, 0.5, 0.0),
        change=SegmentChange(True, 0.7, (ColumnChange("x", 0.7, 1.0, 0.7, 1e-9),), input_score=0.7),
    )
    assert [r.name for r in sorted([wide, narrow, moved], key=rank)] == ["moved", "narrow", "wide"]
    # effects at the cap (a reference of one confidence) tie: the contribution decides, not the share
    hurt = _confidence_row(3, "hurt", 0.3, MAX_SCORE, 0.1)
    overlapping = _confidence_row(4, "overlapping", 0.35, MAX_SCORE, 0.03)
    assert [r.name for r in sorted([overlapping, hurt], key=rank)] == ["hurt", "overlapping"]


def test_the_labels_follow_the_tables_order_when_only_confidences_moved() -> None:
    """With no rank evidence anywhere, the focus follows the changed segments' scores (the narrow segment whose
    confidence fell by two deviations gets nearly all of it); once a segment's inputs moved, only such segments
    get a weight, as the table ranks them first."""
    narrow = _confidence_row(0, "narrow", 0.04, 2.25, 0.001)
    wide = _confidence_row(1, "wide", 0.67, 0.40, 0.010)
    weights = focus_weights([wide, narrow])
    assert weights[0] == 1.0 and weights[1] == pytest.approx((0.40 / 2.25) ** 4)
    moved = dataclasses.replace(
        _confidence_row(2, "moved", 0.2, 0.5, 0.0),
        change=SegmentChange(True, 0.7, (ColumnChange("x", 0.7, 1.0, 0.7, 1e-9),), input_score=0.7),
    )
    assert focus_weights([wide, narrow, moved]) == {2: 1.0}
    assert focus_weights([]) == {}


def test_a_dimension_whose_rows_moved_between_its_segments_is_told_from_one_whose_mix_drifted() -> None:
    """The shares of a clean window's segments are the reference's within noise; a segment of a tenth emptied into
    another moves them; a mix that drifts by less than a twentieth does not count, however many predictions show
    it."""
    rng = np.random.default_rng(11)
    reference = [1000, 2000, 3000, 4000]
    shares = np.asarray(reference) / sum(reference)
    moved = sum(shares_moved(rng.multinomial(800, shares).tolist(), reference, 10) for _ in range(200))
    assert moved <= 2
    emptied = [0, 2000 + 1000, 3000, 4000]
    assert shares_moved([x // 10 for x in emptied], reference, 10)
    drifted = [1300, 2000, 3000, 3700]  # 3% of the traffic moved: significant at a million rows, and small
    assert not shares_moved([x * 100 for x in drifted], reference, 10)
    assert not shares_moved([0, 0, 0, 0], reference) and not shares_moved([5], [5])


def test_a_changed_segment_whose_dimension_moved_ranks_after_one_whose_rows_stayed() -> None:
    """A column zeroed inside one category fills one bin of that column with the category's rows: the bin (its
    dimension's shares moved, its own grew) changed about as much as the category; the category, whose rows stayed,
    ranks first, and the labels' focus follows it."""

    def row(index: int, name: str, share: float, effect: float, moved: bool) -> SegmentRow:
        change = SegmentChange(True, effect, (ColumnChange("x", effect, 1.0, effect, 1e-9),), input_score=effect)
        return SegmentRow(
            index, "column", name.split("=")[0], name, int(1000 * share), share, share, 0.9, 500, None, 0.0, 0.0,
            0.0, change=change, moved=moved,
        )  # fmt: skip

    category = row(0, "city=a", 0.25, 0.77, False)
    destination = dataclasses.replace(row(1, "income=bin 2", 0.45, 1.0, True), reference_share=0.25)
    assert rank_evidence(destination) == pytest.approx(1.0 * 0.45**0.25 * 0.5)
    # the bins that lost rows to it hold only rows of their own: their change counts whole
    source = dataclasses.replace(row(2, "income=bin 1", 0.1, 1.0, True), reference_share=0.25)
    assert rank_evidence(source) == pytest.approx(1.0 * 0.1**0.25)
    assert [r.name for r in sorted([destination, category], key=rank)] == ["city=a", "income=bin 2"]
    weights = focus_weights([destination, category])
    assert weights[0] > weights[1]


def _related_sketch(rng: np.random.Generator) -> tuple[ChangeSketch, np.ndarray, np.ndarray]:
    """A sketch fitted as ``fit`` fits a table's (:func:`define_change`) on columns ``a``, ``b``, ``d = a + b`` (a
    column derived from two others) and an unrelated ``c``; and fresh rows ``(segment, x)`` to break."""
    n = 8000
    seg = rng.integers(0, SEGMENTS, n)
    a, b, c = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
    x = np.stack([a, b, c, a + b], axis=1)
    y = (a + b > 0).astype(np.int64)
    train, val, live = slice(0, 3000), slice(3000, 6000), slice(6000, None)
    data = SegmentData(
        x[train], y[train], x[val], y[val], np.zeros((3000, 2)), y[val], np.arange(0), np.zeros(0), None, ("0", "1")
    )
    shape = ViewShape(tuple(ColumnGroup(name, (j,)) for j, name in enumerate("abcd")), regions=False)
    sketch = define_change(data, shape, seg[None, val], SEGMENTS)
    assert sketch is not None
    return sketch, seg[live], x[live]


def test_a_table_sketches_the_relation_of_each_column_the_others_explain() -> None:
    sketch, _seg, _x = _related_sketch(np.random.default_rng(11))
    related = {sketch.columns[t] for t in sketch.relations}
    assert related == {"a", "b", "d"}  # c is unrelated to the others: no relation of it
    assert all(name.endswith(" from the others") for name in sketch.columns[-len(sketch.relations) :])
    assert ChangeSketch.from_dict(sketch.to_dict()) == sketch
    assert len(sketch.ref_cross) == SEGMENTS * len(sketch.pairs) == len(sketch.ref_pair_factor)
    for bad in (float("inf"), float("nan"), 0.0):  # a factor that would silence or break the pairs' test
        tampered = {**sketch.to_dict(), "ref_pair_factor": [bad, *sketch.ref_pair_factor[1:]]}
        with pytest.raises(ValueError, match="correlation factors"):
            ChangeSketch.from_dict(tampered)


def test_a_column_shuffled_inside_a_segment_breaks_its_relation_there_in_proportion_to_its_broken_rows() -> None:
    rng = np.random.default_rng(12)
    sketch, seg, x = _related_sketch(rng)

    def window(rows: np.ndarray) -> WindowStats:
        return change_window(sketch, seg, rows, SEGMENTS)

    assert not any(ch.changed for ch in _changes(sketch, window(x)))
    broken = x.copy()
    whole = np.flatnonzero(seg == 1)
    third = np.flatnonzero(seg == 2)[: int(np.sum(seg == 2)) // 3]
    for rows in (whole, third):  # d shuffled among these rows: its own distribution kept
        broken[rows, 3] = rng.permutation(broken[rows, 3])
    found = _changes(sketch, window(broken))
    assert found[1].changed and not found[0].changed and not found[3].changed
    # d's relation to a and b broke, so did theirs to d: every change reported is a relation
    assert {col.kind for col in found[1].columns} == {"relation"}
    assert not any(col.column == "d" for col in found[1].columns)  # no test of d's own moments finds it

    def lost(ch: SegmentChange) -> float:
        return max((c.distance for c in ch.columns if c.kind == "relation"), default=0.0)

    # the loss grows with the share of broken rows (a third of segment 2's, all of segment 1's), where the
    # correlation's Fisher z saturates near an exact relation
    assert 2.0 * lost(found[2]) < lost(found[1])
