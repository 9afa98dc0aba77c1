"""What changed where, without labels: every segment's inputs in a window against that segment's own inputs at
``fit`` (DESIGN, "Diagnosis and comparison"; docs/diagnosis.md, "What changed").

A model confidently wrong on in-range inputs moves no label-free estimate, but its inputs moved: a column broken
upstream inside one category changes that column's distribution *inside that category*. The sketch reads it.

**The sketch** (:mod:`agent.estimation.segments.sketch`): a few *change columns* fixed at ``fit``, summed per
segment in every window, with the same sums of the labeled validation data as the reference.

**The test.** Per segment ``s`` and column ``c`` the window's first two moments are compared with the reference's by a
two-sample Hotelling test: ``d = (m₁ − r₁, e₂)``, the mean's shift and the second moment's about the reference mean,
``V`` the per-row covariance of ``(u, u²)`` (``u`` a value less the reference mean) at reference, from the segment's
variance and shape (skewness, kurtosis) pulled toward the column's over all segments by :data:`PRIOR_ROWS` rows so that
a thin segment's few rows do not make their own noise look like a change, the kurtosis never below the segments' own
averaged over their rows (a few rows draw few of a column's tails), the correlation of ``(u, u²)`` at most
:data:`~agent.estimation.segments.moments.MAX_MOMENT_CORRELATION`. ``T² = dᵀ (V/m + W/n)⁻¹ d`` with ``W`` the
window's covariance: ``V`` at the window's own variance where it is the wider (Welch; ``u²`` spreads as that variance
squared), which is χ² with 2 degrees of freedom under no change: ``p = exp(−T²/2)``. A mean shift (a column zeroed,
swapped, offset) moves ``m₁``; a spread change (stuck at a constant, scaled, blurred) moves ``e₂``, read where it fell
on the scale of the standard deviation (:func:`~agent.estimation.segments.moments.narrowed`: a spread collapsed to
nothing is as far as it can fall). A segment of :data:`MIN_REFERENCE_SHAPE` validation rows is read a second time in
its own deviations (:func:`moments_test`, one more test per column in the Bonferroni factor): a bin of the column is
far narrower than the column, and a spread collapsed there is the pulled yardstick's noise. The reported ``distance``
(what ranks the segment) stays the first reading's. A column mostly at one value has a point column too (its share
there: :meth:`_Moments.points`, a likelihood-ratio test of two proportions with Cohen's ``h`` for effect), where
zeroing its few other values barely moves its moments, and its moments are read again among its rows off that value
(:meth:`_Moments.off_points`), where scaling it moves them by the scale itself. Every sketched pair is
tested by Fisher's ``z`` of its correlation, its variance ``1/(n − 3)`` times the sketch's factor for the pair in the
segment (:func:`~agent.estimation.segments.sketch.correlation_factors`: a skewed or heavy-tailed pair's correlation
varies several times more than a normal pair's); a column and its relation (``a ~ the others``) by the same test, its
effect the share of the column's variance the relation no longer explains (:meth:`_Moments._relation_lost`). The
oracle's failure rate is one more column (a shuffled column breaks the invariants mined between columns even where its
own distribution stays): a one-sided two-proportion test of the segment's failures against its calibration split's. The
model's confidence is one more: a one-sided test of the segment's mean confidence against its reference's (a model's
outputs move only when its inputs do, so a confidence fallen far beyond noise is a change of the inputs even where no
sketched column or pair shows it, e.g. a column shuffled inside a bin of itself; the segment's label-free estimate is
then no longer to be believed). So is the segment's share of novel inputs (whose reconstruction by the input PCA errs
beyond the clean 99% quantile, :func:`~agent.estimation.statistics.window.novel_inputs`), one-sided against its
reference share: it reads the whole feature view, the columns the sketch leaves out too (a categorical column broken
inside one category).

A segment's columns are tested when it had :data:`MIN_REFERENCE_COLUMNS` validation rows, their correlations when it
had :data:`MIN_REFERENCE_PAIRS`. A segment is **changed** when a column's ``p``, times the number of tests in the
window (Bonferroni: every segment, every column), is below :data:`ALPHA` *and* its per-row effect ``D = √(dᵀ V⁻¹ d)``
(in reference standard deviations; the larger reading where it has two) is at least :data:`MIN_DISTANCE`: significant
and large enough to matter. A segment (almost) unseen at fit (fewer than :data:`MIN_REFERENCE` validation rows) that
now holds a significant share of the window is changed by definition: nothing at fit looked like its inputs. Its
**score** is the largest effect among its changed columns (:data:`MAX_SCORE` for an unseen segment): how far its
inputs moved, whatever its size, so that the segment the fault lives in (all its rows moved) outranks the segments
that only share some of its rows. The segment is ranked by the effects of the other tests alone (``input_score``, not
capped: a segment's own deviations inside a bin of a column are far narrower than the column's, so its effects can
pass :data:`MAX_SCORE`, and capped ones would tie and leave the rank to the share): the confidence and the novel
inputs (:data:`UNRANKED`) tell that the inputs moved, not how far, and a narrower segment inside the one a fault lives
in often holds more of its least confident or novel rows. No test ranks a segment cut by the model's own output (the
predicted class): a fault sends its rows, their changed inputs and the oracle's failures among them, to the classes
they are now predicted as, wherever in the inputs it lives; such a segment says where the model's answers went, the
segments cut by the inputs where the inputs broke."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.estimation.segments.moments import (
    PRIOR_ROWS,
    central,
    correlation,
    g_statistic,
    moments_test,
    pulled,
    shape_of,
)
from agent.estimation.segments.sketch import CLIP, ChangeSketch

#: Familywise false-alarm rate of the window's change tests (Bonferroni over segments × columns): low, since
#: the moments' normal approximation errs on the side of alarms in thin segments and heavy tails.
ALPHA = 0.001
#: Smallest effect reported as a change, by the kind of test: a column's per-row distance (reference
#: standard deviations of ``(z, z²)``), a pair's correlation (difference of Fisher's ``z``), the oracle's
#: failure rate and the model's confidence (their standard deviations at reference), the share of novel inputs
#: (the standard deviation of one reference input's novelty: a whole standard deviation, since the novelty
#: threshold is one split's 99% quantile and a clean segment's share moves by several points around it).
MIN_DISTANCE = {
    "column": 0.5,
    "pair": 0.4,
    "relation": 0.25,
    "point": 0.5,
    "oracle": 0.25,
    "model_confidence": 0.25,
    "novelty": 1.0,
    "share": 0.0,
}
#: Predictions a segment needs in a window before its inputs are tested.
MIN_ROWS = 20
#: Validation rows below which a segment counts as unseen at fit.
MIN_REFERENCE = 5
#: Validation rows a segment needs for its columns' moments, and for their correlations, to be tested: fewer
#: cannot tell a change from the noise of their own third and fourth moments.
MIN_REFERENCE_COLUMNS, MIN_REFERENCE_PAIRS = 20, 20
#: Validation rows a segment needs for its columns to be tested in its own deviations too
#: (:func:`moments_test`): fewer make its own variance and shape too noisy a yardstick.
MIN_REFERENCE_SHAPE = 100
#: The score of a segment unseen at fit, and the cap of any score: the largest mean shift (in standard
#: deviations) the clipped columns can show.
MAX_SCORE = 2 * CLIP
#: Name of the oracle's failure rate among the change columns of a report.
ORACLE_COLUMN = "oracle failures"
#: Name of the model's mean confidence among the change columns of a report.
CONFIDENCE_COLUMN = "model confidence"
#: Name of a segment's share of novel inputs among the change columns of a report.
NOVELTY_COLUMN = "novel inputs"
#: The tests that tell that a segment's inputs moved but not how far (they do not rank it: every segment holding
#: some of the moved rows shows them, the narrower ones often more).
UNRANKED = frozenset({"model_confidence", "novelty"})
#: Name of a segment's share, for a segment unseen at fit.
SHARE_COLUMN = "share (unseen at fit)"
#: Changed columns a segment reports (the largest effects).
REPORTED_COLUMNS = 3


@dataclass(frozen=True)
class ColumnChange:
    """One change column of one segment: its mean shift and spread ratio in reference standard deviations, the
    per-row effect ``distance`` and the test's ``p`` (before the window's Bonferroni factor)."""

    column: str
    shift: float
    spread: float
    distance: float
    p: float
    #: which test: ``column`` (its first two moments), ``pair`` (a correlation), ``oracle``,
    #: ``model_confidence``, ``novelty``, ``share``
    kind: str = "column"
    #: the effect the test's threshold reads, where it is not ``distance`` (:meth:`_Moments.columns`)
    effect: float | None = None

    @property
    def test_effect(self) -> float:
        """The effect :data:`MIN_DISTANCE` is compared with: ``effect`` where set, else ``distance``."""
        return self.distance if self.effect is None else self.effect

    def to_json(self, decimals: int | None = None) -> dict[str, Any]:
        def r(v: float) -> float:
            return round(v, decimals) if decimals is not None else v

        return {
            "column": self.column,
            "shift": r(self.shift),
            "spread": r(self.spread),
            "distance": r(self.distance),
            "p": float(f"{self.p:.3g}"),
            "kind": self.kind,
        }


@dataclass(frozen=True)
class SegmentChange:
    """What changed in one segment: ``changed`` (see the module docstring), its ``score`` (0 when unchanged) and
    its changed columns, the largest effect first."""

    changed: bool
    score: float
    columns: tuple[ColumnChange, ...] = ()
    #: the largest effect among its changed columns whose test ranks (not :data:`UNRANKED`), not capped like
    #: ``score`` (:data:`MAX_SCORE` for an unseen segment): what ranks it
    input_score: float = 0.0

    @property
    def names(self) -> list[str]:
        return [c.column for c in self.columns]

    def to_json(self, decimals: int | None = None) -> dict[str, Any]:
        def r(v: float) -> float:
            return round(v, decimals) if decimals is not None else v

        return {
            "changed": self.changed,
            "score": r(self.score),
            "columns": [c.to_json(decimals) for c in self.columns],
        }


UNCHANGED = SegmentChange(False, 0.0)


@dataclass(frozen=True)
class WindowChange:
    """The window's per-segment sums of the sketch (:class:`~agent.estimation.statistics.window.WindowStats`'s
    ``change_*``), of the oracle's failures and of the model's confidence, as the test reads them."""

    n: Sequence[int]
    sums: Sequence[float]
    squares: Sequence[float]
    seg_n: Sequence[int]
    seg_fails: Sequence[int]
    cross: Sequence[float] = ()
    seg_conf: Sequence[float] = ()
    seg_conf_sq: Sequence[float] = ()
    seg_novel: Sequence[int] = ()


@dataclass(frozen=True)
class ChangeReference:
    """What the test reads of the segments at fit besides the sketch: every segment's validation rows ``n``, the
    span ``(start, end)`` of every dimension's segments, and per segment the calibration split's predictions and
    the oracle's failures among them with the whole split's failure rate (the prior of thin segments); per segment
    its own mean confidence on the validation data, the validation rows behind it and its confidence's variance
    there (:func:`pulled`; empty: the confidence is not tested); per segment its own share of novel inputs
    there and the rows behind it (empty: novelty is not tested).

    Its own, not the figures its estimators read (pulled toward the dimension's by as much as the dimension's
    segments differ little, up to thousands of pseudo-rows): a segment predicted less confidently than its
    dimension's average would read as a fall in every window against a pulled mean, with the pseudo-rows' false
    precision."""

    n: Sequence[int]
    spans: Sequence[tuple[int, int]]
    cal_n: Sequence[int]
    cal_fails: Sequence[int]
    rate: float
    conf: Sequence[float] = ()
    conf_n: Sequence[float] = ()
    conf_var: Sequence[float] = ()
    novel: Sequence[float] = ()
    novel_n: Sequence[float] = ()
    #: per segment, whether its dimension is cut by the model's own output (the predicted class): no test ranks it
    #: (empty: none is)
    by_output: Sequence[bool] = ()


def segment_changes(sketch: ChangeSketch | None, window: WindowChange, ref: ChangeReference) -> list[SegmentChange]:
    """Every segment's :class:`SegmentChange` in the window (see the module docstring)."""
    size = len(ref.n)
    out = [UNCHANGED] * size
    c = sketch.base if sketch is not None else 0  # the moments tested: no relation's, no point's
    tested = [s for s in range(size) if s < len(window.seg_n) and window.seg_n[s] >= MIN_ROWS]
    if not tested:
        return out
    # the pairs, and each point's share and its column's moments off it (:meth:`_Moments.off_points`)
    pairs = len(sketch.pairs) + 2 * len(sketch.points) if sketch is not None else 0
    # every column is read twice where the segment's own spread is a yardstick too (:func:`moments_test`)
    shaped = sum(1 for s in tested if sketch is not None and sketch.ref_n[s] >= MIN_REFERENCE_SHAPE)
    tests = max(len(tested) * (c + pairs + 3) + shaped * (c + len(sketch.points) if sketch is not None else 0), 1)
    moments = _Moments.of(sketch, size) if sketch is not None and len(window.n) == size else None
    for a, b in ref.spans:
        total, total_ref = max(sum(window.seg_n[a:b]), 1), max(sum(ref.n[a:b]), 1)
        for s in (s for s in tested if a <= s < b):
            if ref.n[s] < MIN_REFERENCE:
                share = window.seg_n[s] / total
                share_ref = (ref.n[s] + 0.5) / total_ref
                column = ColumnChange(SHARE_COLUMN, share / share_ref, 1.0, MAX_SCORE, 0.0, "share")
                out[s] = SegmentChange(True, MAX_SCORE, (column,), MAX_SCORE)
                continue
            found: list[ColumnChange] = []
            if moments is not None and sketch is not None and window.n[s] >= MIN_ROWS:
                if sketch.ref_n[s] >= MIN_REFERENCE_COLUMNS:
                    found += moments.columns(sketch, window, s)
                    found += moments.points(sketch, window, s)
                    found += moments.off_points(sketch, window, s)
                if sketch.ref_n[s] >= MIN_REFERENCE_PAIRS:
                    found += moments.correlations(sketch, window, s)
            found += _failures(ref, window, s)
            found += _confidence(ref, window, s)
            found += _novelty(ref, window, s)
            changed = [x for x in found if x.p * tests <= ALPHA and x.test_effect >= MIN_DISTANCE[x.kind]]
            if changed:
                changed.sort(key=lambda x: -x.distance)
                # not capped: a segment's effect is in its own reference deviations, which inside a bin of the
                # column are far narrower than the column's (a column scaled inside its top bin moves it 17 of them),
                # and a capped effect would leave the rank to the share alone, the wider segment first
                inputs = max((x.distance for x in changed if x.kind not in UNRANKED), default=0.0)
                if s < len(ref.by_output) and ref.by_output[s]:
                    inputs = 0.0  # where the model's answers went, not where its inputs broke
                score = min(changed[0].distance, MAX_SCORE)
                out[s] = SegmentChange(True, score, tuple(changed[:REPORTED_COLUMNS]), inputs)
    return out


class _Moments:
    """The reference moments as ``[S, C]`` arrays, with every column's moments over all segments."""

    def __init__(self, n: np.ndarray, m: list[np.ndarray], whole: list[np.ndarray], cross: np.ndarray) -> None:
        self.n, self.m, self.whole, self.cross = n, m, whole, cross
        #: per column, the segments' own kurtosis averaged over their rows (the column's tails within a segment)
        self.tails = _tails(n[:, None], m, whole)
        #: per point column, the reference of its column's rows off the point (:meth:`off_points`; None: no points)
        self.off: list[tuple[np.ndarray, list[np.ndarray], tuple[float, ...], float]] | None = None

    def with_off_points(self, sketch: ChangeSketch) -> _Moments:
        """Itself, with the reference of every point column's column among the rows off its point: per segment
        the rows, their raw moments, the moments over all segments and the segments' kurtosis averaged."""
        self.off = []
        for k, (base, z0) in enumerate(sketch.point_bases):
            at = self.m[0][:, sketch.first_point + k] * self.n
            rows = np.maximum(self.n - at, 0.0)
            own = [(self.m[p][:, base] * self.n - at * z0 ** (p + 1)) / np.maximum(rows, 1.0) for p in range(4)]
            total, at_all = float(self.n.sum()), float(at.sum())
            off_all = max(total - at_all, 1.0)
            whole = tuple(float((self.whole[p][base] * total - at_all * z0 ** (p + 1)) / off_all) for p in range(4))
            tails = _tails(rows[:, None], [x[:, None] for x in own], [np.asarray([w]) for w in whole])
            self.off.append((rows, own, whole, float(tails[0])))
        return self

    @classmethod
    def of(cls, sketch: ChangeSketch, size: int) -> _Moments:
        c = len(sketch.columns)
        n = np.asarray(sketch.ref_n, dtype=np.float64)
        sums = [np.asarray(m, dtype=np.float64).reshape(size, c) for m in sketch.ref_moments]
        rows = max(float(n.sum()), 1.0)
        whole = [x.sum(axis=0) / rows for x in sums]  # every dimension counts each row once: the same means
        means = [x / np.maximum(n, 1.0)[:, None] for x in sums]
        pairs = len(sketch.pairs)
        cross = np.asarray(sketch.ref_cross, dtype=np.float64).reshape(size, pairs) / np.maximum(n, 1.0)[:, None]
        out = cls(n, means, whole, cross)
        return out.with_off_points(sketch) if sketch.points else out

    def correlations(self, sketch: ChangeSketch, window: WindowChange, s: int) -> list[ColumnChange]:
        """Every sketched pair's correlation in the window against the segment's at reference (Fisher's z: a
        shuffled or swapped column loses the correlation it had with the others)."""
        pairs = sketch.pairs
        c = len(sketch.columns)
        first_relation = sketch.base
        if not pairs or len(window.cross) < (s + 1) * len(pairs):
            return []
        n, m = float(window.n[s]), float(self.n[s])
        if n <= 3 or m <= 3:
            return []
        out = []
        for k, (i, j) in enumerate(pairs):
            ref = correlation(self.m[0][s, i], self.m[0][s, j], self.m[1][s, i], self.m[1][s, j], self.cross[s, k])
            a, b = window.sums[s * c + i] / n, window.sums[s * c + j] / n
            aa, bb = window.squares[s * c + i] / n, window.squares[s * c + j] / n
            live = correlation(a, b, aa, bb, window.cross[s * len(pairs) + k] / n)
            if ref is None or live is None:
                continue
            d = math.atanh(live) - math.atanh(ref)
            # Fisher's 1/(n − 3) is a normal pair's variance: fit's factor scales it to this pair's in this segment
            z = d / math.sqrt(sketch.pair_factor(s, k) * (1.0 / (n - 3) + 1.0 / (m - 3)))
            p = math.erfc(abs(z) / math.sqrt(2.0))
            name = sketch.pair_name(i, j)
            if j < first_relation:
                out.append(ColumnChange(name, live - ref, 1.0, abs(d), p, "pair"))
                continue
            lost = self._relation_lost(s, i, j, (a, b, aa, bb, window.cross[s * len(pairs) + k] / n), k)
            whole = self.whole[1][i] - self.whole[0][i] ** 2
            if lost is not None and whole > 1e-12:
                change = ColumnChange(name, live - ref, 1.0, lost[0] / whole, p, "relation", effect=lost[0] / lost[1])
                out.append(change)
        return out

    def _relation_lost(
        self, s: int, i: int, j: int, live: tuple[float, float, float, float, float], k: int
    ) -> tuple[float, float] | None:
        """How much more of column ``i``'s variance its relation ``j`` (the others' fit of it) leaves unexplained in
        segment ``s`` in the window than at reference (at least 0), and ``i``'s reference variance there (None when
        either column is constant there): the mean square of ``i`` less the reference's regression on ``j`` (``c =
        cov / var(j)``), centered on the window's own means, minus the reference's ``var(i) (1 − ρ²)``. A relation
        broken in a share ``φ`` of the segment's rows (their ``i`` replaced by values of its distribution there)
        loses ``2 φ ρ² var(i)``: linear in the share, where the correlation's Fisher ``z`` saturates. Its ``distance``
        (what ranks the segment) is this loss in ``i``'s variance over all segments, the same unit in every segment
        (in ``i``'s own variance, a bin of ``i`` would read any loss many times larger); the threshold reads it in
        the segment's own."""
        a, b = self.m[0][s, i], self.m[0][s, j]
        var_i, var_j = self.m[1][s, i] - a * a, self.m[1][s, j] - b * b
        cov = self.cross[s, k] - a * b
        if var_i <= 1e-12 or var_j <= 1e-12:
            return None
        c = cov / var_j
        la, lb, laa, lbb, lab = live
        live_sq = (laa - la * la) - 2.0 * c * (lab - la * lb) + c * c * (lbb - lb * lb)
        return max(live_sq - (var_i - c * cov), 0.0), var_i

    def columns(self, sketch: ChangeSketch, window: WindowChange, s: int) -> list[ColumnChange]:
        """Every sketched column's first two moments against the segment's at reference; not the relations (each a
        mix of the other columns, tested one by one: in a segment that received a fault's rows the mix of their
        unusual other columns reads as one more, larger change of the receiving segment's own inputs)."""
        c = len(sketch.columns)
        n, m = float(window.n[s]), float(self.n[s])
        return [
            _moment_change(
                sketch.columns[j],
                tuple(float(x[s, j]) for x in self.m),
                tuple(float(x[j]) for x in self.whole),
                float(self.tails[j]),
                (m, n),
                (window.sums[s * c + j], window.squares[s * c + j]),
            )
            for j in range(sketch.base)
        ]

    def off_points(self, sketch: ChangeSketch, window: WindowChange, s: int) -> list[ColumnChange]:
        """The moments of each point column's column among the rows *not* at its point, against the segment's at
        reference (:meth:`columns`' test), named ``<column> other than <value>``: scaling a column mostly at 0 leaves
        its share at 0 as it was and moves its moments over all rows by a fraction of its spread (the rows at 0 are
        most of them), but its other values' moments by the scale itself. No new sums: the rows at the point all read
        the same value ``z₀``, so the other rows' sums of ``zᵏ`` are the column's less the point's count times
        ``z₀ᵏ``."""
        c, first = len(sketch.columns), sketch.first_point
        out = []
        for k, (base, z0) in enumerate(sketch.point_bases):
            if base < 0 or self.off is None:
                continue
            rows, own, whole, tails = self.off[k]
            at = window.sums[s * c + first + k]
            n, m = float(window.n[s]) - at, float(rows[s])
            if n < MIN_ROWS or m < MIN_REFERENCE_COLUMNS:
                continue
            live = (window.sums[s * c + base] - at * z0, window.squares[s * c + base] - at * z0 * z0)
            name = f"{sketch.columns[base]} other than {sketch.columns[first + k].rsplit(' at ', 1)[-1]}"
            out.append(_moment_change(name, tuple(float(x[s]) for x in own), whole, tails, (m, n), live))
        return out

    def points(self, sketch: ChangeSketch, window: WindowChange, s: int) -> list[ColumnChange]:
        """Every point column's share (the rows at a column's most common value) against the segment's at
        reference, pulled toward the column's over all segments by :data:`PRIOR_ROWS` rows: the likelihood-ratio
        test of two proportions (G, χ² with one degree of freedom: the normal approximation errs by orders of
        magnitude at a share near 0 or 1, where a zero-inflated column's is), its effect Cohen's ``h = |2 asin √p −
        2 asin √q|`` (Cohen 1988, §6.2: a proportion's difference on the scale where its noise is even). ``shift``
        is the share's change."""
        c = len(sketch.columns)
        n, m = float(window.n[s]), float(self.n[s])
        out = []
        for j in range(sketch.first_point, c):
            q = (m * self.m[0][s, j] + PRIOR_ROWS * self.whole[0][j]) / (m + PRIOR_ROWS)
            p = min(max(window.sums[s * c + j] / n, 0.0), 1.0)
            g = g_statistic(p * n, n, q * (m + PRIOR_ROWS), m + PRIOR_ROWS)
            h = abs(2.0 * math.asin(math.sqrt(p)) - 2.0 * math.asin(math.sqrt(min(max(q, 0.0), 1.0))))
            out.append(ColumnChange(sketch.columns[j], p - q, 1.0, h, math.erfc(math.sqrt(g / 2.0)), "point"))
        return out


def _tails(rows: np.ndarray, m: list[np.ndarray], whole: list[np.ndarray]) -> np.ndarray:
    """Per column, the segments' own kurtosis averaged over their ``rows`` ``[S, C]`` (those of at least
    :data:`MIN_REFERENCE_COLUMNS` rows whose spread is not nil), from their raw moments ``m`` and the columns' over
    all segments ``whole``."""
    c2, _, c4 = central(*m)
    whole_c2 = np.maximum(whole[1] - whole[0] ** 2, 1e-12)
    seen = (rows >= MIN_REFERENCE_COLUMNS) & (c2 > 1e-4 * whole_c2[None, :])
    kurt = np.where(seen, c4 / np.where(seen, c2 * c2, 1.0), 0.0)
    weight = np.where(seen, rows, 0.0)
    return (kurt * weight).sum(axis=0) / np.maximum(weight.sum(axis=0), 1.0)  # type: ignore[no-any-return]


def _moment_change(
    name: str,
    own_raw: tuple[float, ...],
    whole_raw: tuple[float, ...],
    tails: float,
    rows: tuple[float, float],
    live: tuple[float, float],
) -> ColumnChange:
    """One column's first two moments in a segment against its reference (the module docstring's test): ``own_raw``
    and ``whole_raw`` its first four raw moments in the segment and over all segments at reference, ``tails`` the
    segments' own kurtosis averaged, ``rows`` the reference's rows and the window's, ``live`` the window's sums of
    ``z`` and ``z²``."""
    m, n = rows
    own, whole = central(*own_raw), central(*whole_raw)
    r1 = own_raw[0]
    floor = 1e-4 * max(whole[0], 1e-6)
    d1 = live[0] / n - r1
    # the second moment's shift about the reference mean: the window's mean square deviation from it
    e2 = live[1] / n - own_raw[1] - 2 * r1 * d1
    var_w = max(live[1] / n - (live[0] / n) ** 2, 0.0)
    skew, kurt = shape_of(own, whole, m, floor, tails)
    spread = max(pulled(own[0], whole[0], m), floor)
    # in the segment's variance pulled toward the column's (a thin segment's few rows are a noisy yardstick)
    d_sq, t2 = moments_test((spread, spread), (skew, kurt), var_w, n, m, d1, e2)
    test_sq = d_sq
    if m >= MIN_REFERENCE_SHAPE:  # and in its own deviations (:func:`moments_test`)
        c2 = max(own[0], floor)
        own_sq, own_t2 = moments_test((max(spread, c2), c2), (skew, kurt), var_w, n, m, d1, e2)
        test_sq, t2 = max(test_sq, own_sq), max(t2, own_t2)
    sd_r = math.sqrt(spread)
    effect = math.sqrt(test_sq) if test_sq > d_sq else None
    return ColumnChange(name, d1 / sd_r, math.sqrt(var_w) / sd_r, math.sqrt(d_sq), math.exp(-t2 / 2.0), effect=effect)


def _failures(ref: ChangeReference, window: WindowChange, s: int) -> list[ColumnChange]:
    """The oracle's failure rate of segment ``s`` against its calibration split's (one-sided: more failures), by the
    two-proportion test: its standard error from the rate both samples share under no change (the window's failures
    and the reference's pooled), not the reference's alone, which a thin segment's few calibration rows read low
    (a rate read from few rows errs low more often than high, and the normal tail above a low rate is too thin).
    The effect is in standard deviations of the reference's rate."""
    if s >= len(window.seg_fails) or s >= len(ref.cal_n):
        return []
    n = float(window.seg_n[s])
    m = float(ref.cal_n[s])
    rate = (ref.cal_fails[s] + PRIOR_ROWS * ref.rate) / (m + PRIOR_ROWS)
    rate = min(max(rate, 0.5 / (m + PRIOR_ROWS + n)), 1 - 1e-9)
    sd = math.sqrt(rate * (1 - rate))
    pooled = (window.seg_fails[s] + rate * (m + PRIOR_ROWS)) / (n + m + PRIOR_ROWS)
    pooled = min(max(pooled, rate), 1 - 1e-9)
    d = window.seg_fails[s] / n - rate
    z = d / (math.sqrt(pooled * (1 - pooled)) * math.sqrt(1.0 / n + 1.0 / (m + PRIOR_ROWS)))
    p = 0.5 * math.erfc(z / math.sqrt(2.0))
    return [ColumnChange(ORACLE_COLUMN, d / sd, 1.0, max(d / sd, 0.0), p, "oracle")]


def _confidence(ref: ChangeReference, window: WindowChange, s: int) -> list[ColumnChange]:
    """The model's mean confidence in segment ``s`` against its reference's (one-sided: it fell), in standard
    deviations of the confidence at reference (a two-sample test, each sample with its own variance)."""
    if s >= len(ref.conf_var) or s >= len(window.seg_conf) or s >= len(window.seg_conf_sq):
        return []
    n, m = float(window.seg_n[s]), float(ref.conf_n[s])
    mean = window.seg_conf[s] / n
    var_w = max(window.seg_conf_sq[s] / n - mean * mean, 0.0)
    sd = math.sqrt(max(ref.conf_var[s], 1e-6))
    d = ref.conf[s] - mean
    z = d / math.sqrt(var_w / n + sd * sd / m)
    p = 0.5 * math.erfc(z / math.sqrt(2.0))
    effect = min(max(d / sd, 0.0), MAX_SCORE)  # a reference of one confidence makes any fall "infinitely" large
    return [ColumnChange(CONFIDENCE_COLUMN, -d / sd, math.sqrt(var_w) / sd, effect, p, "model_confidence")]


def _novelty(ref: ChangeReference, window: WindowChange, s: int) -> list[ColumnChange]:
    """Segment ``s``'s share of novel inputs against its reference share (one-sided: more), in standard
    deviations of a reference input's novelty (a Bernoulli trial)."""
    if s >= len(ref.novel) or s >= len(window.seg_novel):
        return []
    n, m = float(window.seg_n[s]), float(ref.novel_n[s])
    rate = min(max(ref.novel[s], 0.5 / (m + n)), 1 - 1e-9)  # a segment never novel at fit still has a floor of noise
    sd = math.sqrt(rate * (1 - rate))
    share = window.seg_novel[s] / n
    d = share - rate
    z = d / (sd * math.sqrt(1.0 / n + 1.0 / m))
    p = 0.5 * math.erfc(z / math.sqrt(2.0))
    if share > rate:  # a thin segment's few novel rows: the Chernoff bound of the binomial tail, not the normal one
        p = max(p, math.exp(-n * _kl(min(share, 1 - 1e-12), rate)))
    effect = min(max(d / sd, 0.0), MAX_SCORE)
    return [ColumnChange(NOVELTY_COLUMN, d / sd, 1.0, effect, p, "novelty")]


def _kl(q: float, r: float) -> float:
    """The Kullback-Leibler divergence of Bernoulli(``q``) from Bernoulli(``r``): ``P(share ≥ q) ≤ exp(−n·KL)``."""
    return q * math.log(q / r) + (1 - q) * math.log((1 - q) / (1 - r))
