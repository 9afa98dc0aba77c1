"""A column mostly at one value (zero-inflated) broken inside one segment: its point column's share finds it where
its moments cannot (:meth:`agent.estimation.segments.change._Moments.points`), and its other values' moments find it
scaled (:meth:`agent.estimation.segments.change._Moments.off_points`)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from agent.estimation.segments.change import MIN_DISTANCE, ChangeReference, SegmentChange
from agent.estimation.segments.sketch import ChangeSketch
from agent.offline.calibration.segments.change import define_change
from agent.offline.calibration.segments.data import ColumnGroup, SegmentData, ViewShape
from agent.results.segments import segment_lines
from tests.support.change_windows import changes_of

#: Segment shares of one categorical dimension.
SHARES = np.array([0.45, 0.3, 0.15, 0.07, 0.03])
NAMES = ("age", "visits", "flag", "balance")


def _rows(n: int, rng: np.random.Generator, nonzero: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows: a normal column, a count, a binary column and ``balance``, zero but in a share ``nonzero`` of the
    rows (then a skewed amount)."""
    seg = rng.choice(len(SHARES), n, p=SHARES)
    x = np.stack(
        [
            rng.normal(40 + 2 * seg, 12, n),
            rng.poisson(2 + seg).astype(float),
            (rng.random(n) < 0.3).astype(float),
            (rng.random(n) < nonzero) * np.round(rng.exponential(50.0, n) + 1, 2),
        ],
        axis=1,
    )
    return seg, x


def _fitted(rng: np.random.Generator, nonzero: float = 0.1) -> tuple[ChangeSketch, ChangeReference]:
    (_, x_t), (seg_v, x_v) = _rows(3000, rng, nonzero), _rows(1000, rng, nonzero)
    y_t, y_v = (x_t[:, 0] > 40).astype(np.int64), (x_v[:, 0] > 40).astype(np.int64)
    data = SegmentData(x_t, y_t, x_v, y_v, np.zeros((1000, 2)), y_v, np.arange(0), np.zeros(0), None, ("0", "1"))
    shape = ViewShape(tuple(ColumnGroup(name, (j,)) for j, name in enumerate(NAMES)), regions=False)
    size = len(SHARES)
    sketch = define_change(data, shape, seg_v[None, :], size)
    assert sketch is not None
    return sketch, ChangeReference(sketch.ref_n, [(0, size)], [100] * size, [0] * size, 0.01)


def _changes(sketch: ChangeSketch, ref: ChangeReference, seg: np.ndarray, x: np.ndarray) -> list[SegmentChange]:
    return changes_of(sketch, ref, seg, x, len(SHARES))


def test_only_a_column_mostly_at_one_value_gets_a_point_column_and_it_counts_the_rows_there() -> None:
    sketch, _ = _fitted(np.random.default_rng(0))
    assert sketch.points == ((3, 0.0),)  # not the normal column, the count nor the binary one
    assert sketch.columns[sketch.first_point :] == ("balance at 0",)
    x = np.array([[40.0, 2.0, 1.0, 0.0], [40.0, 2.0, 0.0, 12.5], [40.0, 2.0, 0.0, np.nan]])
    for view in (x, x.astype(np.float32)):  # fit's float64 rows and the served float32 view read alike
        z = sketch.values(view)
        assert z is not None
        assert z[:, -1].tolist() == [1.0, 0.0, 0.0]  # a missing value is at no value
    restored = ChangeSketch.from_dict(sketch.to_dict())
    assert restored == sketch and restored.base == sketch.base


@pytest.mark.parametrize("nonzero", [0.1, 0.2])
def test_a_mostly_zero_column_zeroed_inside_a_segment_is_found_there_by_its_share_at_zero(nonzero: float) -> None:
    """Zeroing a column non-zero in a tenth of a segment's rows moves its mean and second moment by a third of a
    deviation each, and the two moves go together: its moments read about 0.34, under their threshold
    (``MIN_DISTANCE["column"]``), in every window here. Its share at 0 rises from 0.9 to 1, Cohen's ``h`` 0.64."""
    found = quiet = 0
    for seed in range(6):
        rng = np.random.default_rng(seed)
        sketch, ref = _fitted(rng, nonzero)
        for s, rows in ((1, 500), (2, 2000)):
            seg, x = _rows(rows, rng, nonzero)
            quiet += not any(c.changed for c in _changes(sketch, ref, seg, x))
            x[seg == s, 3] = 0.0
            changes = _changes(sketch, ref, seg, x)
            top = changes[s].columns[0] if changes[s].changed else None
            found += top is not None and top.column == "balance at 0" and top.kind == "point"
            assert [t for t, c in enumerate(changes) if c.changed] in ([s], []), changes
            moments = [c for c in changes[s].columns if c.column == "balance"]
            assert all(c.distance < MIN_DISTANCE["column"] + 0.3 for c in moments)
    assert quiet == 12
    assert found >= 11, found


@pytest.mark.parametrize(("nonzero", "scale"), [(0.1, 10.0), (0.2, 3.0)])
def test_a_mostly_zero_column_scaled_inside_a_segment_is_found_by_its_other_values(
    nonzero: float, scale: float
) -> None:
    """A unit changed upstream inside one segment: the rows at 0 stay there, so the share does not move, and the
    moments over all rows move by a fraction of the column's spread (its rows at 0 are most of them, and its kurtosis
    makes the yardstick wide): found in at most one of these windows before. Its other values' moments move by the
    scale itself."""
    found = 0
    for seed in range(6):
        rng = np.random.default_rng(seed)
        sketch, ref = _fitted(rng, nonzero)
        seg, x = _rows(2000, rng, nonzero)
        x[seg == 1, 3] *= scale
        changes = _changes(sketch, ref, seg, x)
        assert [t for t, c in enumerate(changes) if c.changed] in ([1], []), changes
        top = changes[1].columns[0] if changes[1].changed else None
        found += top is not None and top.column == "balance other than 0" and top.kind == "column" and top.shift > 1
    assert found >= 5, found


def test_a_point_change_reads_as_a_share_in_checks_text() -> None:
    rng = np.random.default_rng(3)
    sketch, ref = _fitted(rng)
    seg, x = _rows(2000, rng)
    x[seg == 1, 3] = 0.0
    change = _changes(sketch, ref, seg, x)[1]
    row = {
        "name": "segment=1",
        "share": 0.3,
        "reference_share": 0.3,
        "estimate": None,
        "contribution": 0.0,
        "status": "changed_cost_unknown",
        "change": change.to_json(),
    }
    text = "\n".join(segment_lines({"segments": [row], "segment_drop": {"estimator": "cbpe", "dimensions": {}}}))
    assert re.search(r"inputs changed \(balance at 0: share \+0\.\d\d\)", text), text
