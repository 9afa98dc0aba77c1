"""Where a window's drop is: every segment's share now and at reference, its estimated accuracy, and its
contribution to the window's drop from the reference (DESIGN, "Diagnosis and comparison").

:func:`segment_table` reads a window's per-segment sums (:class:`~agent.estimation.statistics.window.WindowStats`
``seg_*``) with the bundle's :class:`~agent.estimation.segments.segmentation.Segmentation`; it is what every surface
renders (``/v1/estimates``, ``check``, the fleet, the metrics) and what any other reader of the per-segment
picture should call.

**The segment's estimate.** A segment's reference is its own part of the labeled validation data: its
accuracy ``a_s`` and mean confidence, pulled toward the whole set's by as many pseudo-predictions as the
dimension's segments differ little (:class:`~agent.estimation.segments.segmentation.DimensionPrior`: a thin segment does
not read its noise as its accuracy, a segment unseen at fit is read as the model's whole), and its oracle
TPR/FPR on the calibration split. The registered estimators whose spec says they run on a segment's sums
(``on_segments``: ``icos``, ``icos_corrected``, ``avg_conf``, ``doc``) estimate it with that reference as
their calibration (:func:`segment_estimates`). The segment headline is :data:`SEGMENT_HEADLINE`, ``doc``:
the segment's reference accuracy moved by the change of its mean confidence. With the segment's own
reference it reads exactly ``a_s`` on data like the validation data, whatever the segment's calibration (a
segment the model is overconfident on is not read as a drop), it needs only the confidence sums, and,
unlike ``icos_corrected``, it does not divide a fail share by a TPR − FPR measured on a few of the
segment's errors.

**Reconciled with the learnt estimator.** ``shift_aware`` (the estimator learnt from corrupted copies of
the calibration inputs, :data:`LEARNT`) reads what confidence alone does not: input novelty, agreement with
the TDI leaves, the class mix; on shifted data its window estimate errs less than a confidence estimate
(docs/estimation.md). Each dimension's segments are adjusted to add up to it:

* where it finds *less* accuracy than the segments' ``doc`` estimates add up to, the difference is placed on
  the segments whose inputs moved away from their reference, in proportion to their excess novel inputs
  (inputs whose PCA reconstruction error lies above the clean 99% quantile,
  :func:`~agent.estimation.statistics.window.novel_inputs`: the segment's share of them above its reference share
  by more than :data:`NOVELTY_Z` binomial standard errors, times its predictions); with no such segment
  nothing is placed;
* where it finds *more*, the segments' losses (their ``doc`` below their reference) shrink in proportion
  (confidence fell further than accuracy: blurred inputs the model still gets right), so the ranking within
  the dimension stays and the sizes follow the better window estimate.

The adjustment is each segment's ``adjusted``. This holds whichever estimator the bundle's headline is (a
bundle whose headline is ``cbpe`` still shows where ``shift_aware`` sees a drop); bundles without a
``shift_aware`` calibration (fitted from a table) keep the segments' ``doc`` estimates.

**Contribution.** With reference share ``q_s`` and accuracy ``a_s``, live share ``p_s`` and estimate ``â_s``,
a dimension's drop ``Σ q_s a_s − Σ p_s â_s`` is the mix part ``Σ (q_s − p_s) a_s`` (a change of traffic
mix, harmless in itself) plus the within part ``Σ p_s (a_s − â_s)``; a segment's contribution is its own loss
``p_s (a_s − â_s)``, shrunk toward 0 by :data:`~agent.estimation.intervals.Z95` standard errors of ``a_s −
â_s`` (the sampling noise of the live confidence and of the reference accuracy), so that a segment within
noise of its reference contributes nothing.

**Rank.** Segments whose inputs changed (:mod:`agent.estimation.segments.change`) come first, by the size of
their change (:func:`rank`; those whose confidence or novel inputs alone moved by the size of that): a model
confidently wrong on changed inputs moves no estimate, so a change is never ranked below "no drop"; the
others follow by contribution.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.estimation.estimators.calibrated import EstimatesCalibration
from agent.estimation.estimators.registry import REGISTRY
from agent.estimation.estimators.shift_calibration import ShiftCalibration
from agent.estimation.intervals import Z95, Estimate, clip01
from agent.estimation.segments import scope
from agent.estimation.segments.change import UNCHANGED, SegmentChange
from agent.estimation.segments.segmentation import DimensionPrior, Segmentation, label_of
from agent.estimation.segments.window_change import padded_change, window_changes
from agent.estimation.statistics.items import SEGMENT_STATS
from agent.estimation.statistics.window import WindowStats

#: The estimator of a segment's accuracy (see the module docstring for why).
SEGMENT_HEADLINE = "doc"
#: Standard errors by which a segment's share of novel inputs must exceed its reference to take a share of
#: the learnt estimator's drop beyond the segments' own estimates.
NOVELTY_Z = 2.0
#: How much a changed segment's share weighs in its rank beside the size of its change (:func:`rank`).
SHARE_POWER = 0.25
#: How much a changed segment's evidence weighs in its rank where it gained rows in a dimension whose shares moved
#: (:func:`rank_evidence`): half, so that of a segment whose rows stayed and one that gained rows, changed about as
#: much, the first ranks first.
MOVED_WEIGHT = 0.5
#: Pseudo-counts pulling a segment's TDI/ADI TPR and FPR toward the oracle's on the whole calibration split.
RATE_PRIOR = 10.0
#: The estimator whose drop beyond the segments' estimates is placed on them by input novelty: the one learnt
#: from the model's corrupted inputs (its spec ``needs_model``).
LEARNT = next(n for n, spec in REGISTRY.items() if spec.needs_model and not spec.needs_labels)


@dataclass(frozen=True)
class SegmentRow:
    """One segment of one window (see the module docstring for the figures)."""

    index: int
    kind: str
    dimension: str
    name: str
    #: the window's predictions in it, and its share of the dimension's
    n: int
    share: float
    reference_share: float
    reference_accuracy: float
    #: validation predictions behind the reference
    reference_n: int
    #: the segment headline (None: no prediction of the window is in it)
    estimate: Estimate | None
    #: how far its estimate was moved so that its dimension adds up to the learnt estimate (module docstring)
    adjusted: float
    contribution: float
    #: ``(a_s − â_s)`` in standard errors of its noise
    z: float
    #: realized accuracy of its labeled predictions (None: none labeled)
    truth_accuracy: float | None = None
    truth_n: int = 0
    #: realized accuracy, with its interval, of the labels drawn in it (:mod:`agent.estimation.segments.realized`)
    realized: Estimate | None = None
    realized_n: int = 0
    #: what changed in its inputs, label-free (:mod:`agent.estimation.segments.change`)
    change: SegmentChange = UNCHANGED
    #: its dimension's shares moved (:func:`~agent.estimation.segments.scope.shares_moved`): rows moved between its
    #: segments, so a change in it may be of rows changed elsewhere
    moved: bool = False

    @property
    def label(self) -> str:
        """The segment's label of the Prometheus series."""
        return label_of(self.name)

    @property
    def status(self) -> str:
        """``dropping`` (its label-free estimate fell beyond noise), ``changed_cost_unknown`` (its inputs changed
        but no label-free estimate moved and no label measured it: a model confidently wrong on changed inputs
        looks like this, so it is never read as "no drop"), ``changed`` (its inputs changed; the labels drawn
        in it measure the cost) or ``ok``."""
        if self.contribution > 0:
            return "dropping"
        if self.change.changed:
            return "changed" if self.realized is not None else "changed_cost_unknown"
        return "ok"

    @property
    def estimable(self) -> bool:
        """Whether its label-free estimate can be trusted: not when its inputs changed (the estimators are
        calibrated on inputs like the reference's; on changed inputs a confident model may be wrong)."""
        return self.estimate is not None and not self.change.changed

    def to_json(self, decimals: int | None = None) -> dict[str, Any]:
        def r(v: float) -> float:
            return round(v, decimals) if decimals is not None else v

        out: dict[str, Any] = {
            "kind": self.kind,
            "dimension": self.dimension,
            "name": self.name,
            "n": self.n,
            "share": r(self.share),
            "reference_share": r(self.reference_share),
            "estimate": None
            if self.estimate is None
            else {"value": r(self.estimate.value), "lower": r(self.estimate.lower), "upper": r(self.estimate.upper)},
            "reference_accuracy": r(self.reference_accuracy),
            "contribution": r(self.contribution),
            "z": r(self.z),
        }
        if self.adjusted:
            out["adjusted"] = r(self.adjusted)
        if self.truth_accuracy is not None:
            out["truth_accuracy"] = r(self.truth_accuracy)
            out["truth_n"] = self.truth_n
        if self.realized is not None:
            e = self.realized
            out["realized"] = {"n": self.realized_n, "value": r(e.value), "lower": r(e.lower), "upper": r(e.upper)}
        out["status"] = self.status
        out["change"] = self.change.to_json(decimals)
        if self.estimate is not None and not self.estimable:
            out["estimable"] = False
            out["why"] = "its inputs changed (" + ", ".join(self.change.names) + "): labels measure its accuracy"
        return out


@dataclass(frozen=True)
class DimensionDrop:
    """A dimension's split of the window's drop: ``mix`` (shares moved), ``within`` (segments lost accuracy),
    ``adjusted`` (how far the segments' estimates were moved toward the learnt estimate, share-weighted)."""

    dimension: str
    kind: str
    mix: float
    within: float
    adjusted: float
    #: its shares moved beyond noise (:func:`~agent.estimation.segments.scope.shares_moved`)
    moved: bool = False

    def to_json(self, decimals: int | None = None) -> dict[str, Any]:
        def r(v: float) -> float:
            return round(v, decimals) if decimals is not None else v

        return {
            "kind": self.kind,
            "mix": r(self.mix),
            "within": r(self.within),
            "adjusted": r(self.adjusted),
            "shares_moved": self.moved,
        }


@dataclass(frozen=True)
class SegmentTable:
    """One window's segments, ranked by evidence of a drop (:func:`rank`), and each dimension's drop."""

    estimator: str
    reference_accuracy: float
    rows: tuple[SegmentRow, ...]
    dimensions: tuple[DimensionDrop, ...]

    def top(self, k: int) -> tuple[SegmentRow, ...]:
        return self.rows[:k]

    def rows_json(self, decimals: int | None = None) -> list[dict[str, Any]]:
        return [row.to_json(decimals) for row in self.rows]

    def changed_shares(self) -> dict[str, float]:
        """Per dimension, the share of its predictions in segments whose inputs changed (:mod:`.scope`)."""
        return scope.changed_shares((r.dimension, r.share, r.change.changed) for r in self.rows)

    @property
    def widespread(self) -> bool:
        """Whether the change is across the traffic, in no one segment (:func:`.scope.widespread`)."""
        return scope.widespread(self.changed_shares())

    def drop_json(self, decimals: int | None = None) -> dict[str, Any]:
        def r(v: float) -> float:
            return round(v, decimals) if decimals is not None else v

        shares = self.changed_shares()
        return {
            "estimator": self.estimator,
            "reference_accuracy": r(self.reference_accuracy),
            "dimensions": {
                d.dimension: {**d.to_json(decimals), "changed_share": r(shares.get(d.dimension, 0.0))}
                for d in self.dimensions
            },
            "widespread": scope.widespread(shares),
        }


class SegmentsCalibration(EstimatesCalibration, Protocol):
    """What the segments' table reads of a calibration: the estimators' part and the segments fixed at fit
    (the bundle's aggregate meets it; the segments do not import the aggregate, which sits above them)."""

    @property
    def segments(self) -> Segmentation | None: ...


@dataclass(frozen=True)
class SegmentCalibration:
    """A segment's own calibration, as the ``on_segments`` estimators read it (meets
    :class:`~agent.estimation.estimators.calibrated.EstimatesCalibration`): the segment's rates, counts,
    accuracy and mean confidence; the whole split's confidence offsets, ATC threshold and predictor; no
    ``shift_aware`` regressions (they are fitted on whole windows)."""

    tpr: float
    fpr: float
    n_wrong: int
    n_right: int
    accuracy: float
    avg_conf: float
    atc_threshold: float
    conf_offsets: tuple[float, ...]
    predictor: str
    #: a segment is not post-stratified further (its ``with_labels`` is never computed)
    segment_strata: tuple[tuple[str, int, int], ...] = ()
    shift: ShiftCalibration | None = None

    @property
    def n(self) -> int:
        return self.n_wrong + self.n_right


def segment_calibration(calibration: SegmentsCalibration, index: int) -> SegmentCalibration:
    """The calibration an estimator reads for segment ``index``: the segment's reference accuracy and mean
    confidence (pulled toward the whole set's by its dimension's prior,
    :class:`~agent.estimation.segments.segmentation.DimensionPrior`) and its oracle TPR/FPR (pulled toward the
    oracle's)."""
    seg = calibration.segments
    assert seg is not None
    ref, prior = seg.reference, seg.priors[seg.dimension_of(index)]
    m = prior.strength
    wrong, right = ref.cal_wrong[index], ref.cal_right[index]
    return SegmentCalibration(
        tpr=(ref.cal_fail_wrong[index] + RATE_PRIOR * calibration.tpr) / (wrong + RATE_PRIOR),
        fpr=(ref.cal_fail_right[index] + RATE_PRIOR * calibration.fpr) / (right + RATE_PRIOR),
        n_wrong=wrong,
        n_right=right,
        accuracy=(ref.correct[index] + m * prior.accuracy) / (ref.n[index] + m),
        avg_conf=seg.pulled_confidence(index)[0],
        atc_threshold=calibration.atc_threshold,
        conf_offsets=calibration.conf_offsets,
        predictor=calibration.predictor,
    )


def segment_stats(stats: WindowStats, index: int) -> WindowStats:
    """The sums of segment ``index`` as a window of its own (what the ``on_segments`` estimators read)."""
    fails = stats.seg_fails[index] if index < len(stats.seg_fails) else 0
    return WindowStats(
        n=stats.seg_n[index],
        fails=fails,
        conf_sum=stats.seg_conf[index],
        conf_sq_sum=stats.seg_conf_sq[index],
    )


def segment_estimates(stats: WindowStats, calibration: SegmentsCalibration, index: int) -> dict[str, Estimate]:
    """Every registered estimator that runs on a segment's sums (``on_segments``), on segment ``index``."""
    sub = segment_stats(stats, index)
    if sub.n <= 0:
        return {}
    cal = segment_calibration(calibration, index)
    out: dict[str, Estimate] = {}
    for name, spec in REGISTRY.items():
        if spec.on_segments:
            est = spec.formula(sub, cal)
            if est is not None:
                out[name] = est
    return out


def _widened(e: Estimate, value: float, reference_se: float) -> Estimate:
    """``e`` moved to ``value``, its interval widened by the reference accuracy's own uncertainty."""
    lo, hi = e.value - e.lower, e.upper - e.value
    extra = (Z95 * reference_se) ** 2
    return Estimate(
        clip01(value), clip01(value - math.sqrt(lo * lo + extra)), clip01(value + math.sqrt(hi * hi + extra)), e.n
    )


def segment_table(
    stats: WindowStats,
    calibration: SegmentsCalibration,
    estimates: Mapping[str, Estimate] | None = None,
    *,
    truth: tuple[Sequence[int], Sequence[int]] | None = None,
) -> SegmentTable | None:
    """The window's segments (None: the bundle has none, or the statistics are of another segmentation);
    ``estimates``: the window's estimates (:data:`LEARNT`'s drop beyond the segments' estimates is placed on
    the segments by input novelty); ``truth``: per segment, labeled predictions and the right ones among
    them."""
    seg = calibration.segments
    if seg is None or len(stats.seg_n) > seg.size or stats.n <= 0 or not any(stats.seg_n):
        return None
    if len(stats.seg_n) < seg.size:  # sums rebuilt from an export that holds only the segments with predictions
        stats = _padded(stats, seg.size)
    stats = padded_change(stats, seg)
    learnt = (estimates or {}).get(LEARNT)
    changes = window_changes(stats, seg, calibration.fpr)
    rows: list[SegmentRow] = []
    drops: list[DimensionDrop] = []
    for d, (_, a, b) in enumerate(seg.spans()):
        found, drop = _dimension(stats, calibration, d, learnt, truth)
        moved = scope.shares_moved(stats.seg_n[a:b], seg.reference.n[a:b], len(seg.dimensions))
        rows += [dataclasses.replace(r, change=changes[r.index], moved=moved) for r in found]
        drops.append(dataclasses.replace(drop, moved=moved))
    rows.sort(key=rank)
    return SegmentTable(SEGMENT_HEADLINE, seg.priors[0].accuracy, tuple(rows), tuple(drops))


def rank(row: SegmentRow) -> tuple[float, ...]:
    """The order of the table, by evidence of a drop: segments whose inputs changed first, by the size of their
    change (the segment a fault lives in moved all its rows; the segments sharing some of them moved less)
    times their share to the power :data:`SHARE_POWER` (a change as large over more rows is more evidence: of
    a segment and a narrower one inside it, both wholly changed, the wider one holds more of the change), less
    where it gained rows in a dimension whose shares moved (:func:`rank_evidence`);
    changed segments with no such evidence (only their confidence or novel inputs moved, or a segment cut by the
    model's output, whatever moved) by their ``score`` (a
    segment whose confidence fell by two deviations before a wider one whose confidence fell by a few tenths;
    scores tied at :data:`~agent.estimation.segments.change.MAX_SCORE` by contribution), then the others by their
    contribution."""
    loss = row.share * (row.reference_accuracy - _value(row))
    return (-float(row.change.changed), -rank_evidence(row), -change_size(row), -row.contribution, -loss, row.index)


def rank_evidence(row: SegmentRow) -> float:
    """A changed segment's evidence in :func:`rank`: the size of its inputs' change (not its confidence's) times
    its share to the power :data:`SHARE_POWER`, times :data:`MOVED_WEIGHT` where its dimension's shares moved and its
    own grew (0 when unchanged): a column zeroed inside one category sends those rows into one bin of that column,
    which then holds them beside its own, and its change (of the category's column, of its own) is where the rows
    went, not where they broke. A segment that lost rows or kept its share holds only rows of its own."""
    if not row.change.changed:
        return 0.0
    gained = row.moved and row.share > row.reference_share
    return row.change.input_score * row.share**SHARE_POWER * (MOVED_WEIGHT if gained else 1.0)


def change_size(row: SegmentRow) -> float:
    """A changed segment's ``score`` (0 when unchanged): what orders, in :func:`rank`, the changed segments with
    no rank evidence (only their confidence or novel inputs moved)."""
    return row.change.score if row.change.changed else 0.0


def _padded(stats: WindowStats, size: int) -> WindowStats:
    """``stats`` with every per-segment sum as long as ``size`` (the segments past its end hold nothing)."""
    out = stats.copy()
    for name in SEGMENT_STATS:
        values = getattr(out, name)
        values.extend([0] * (size - len(values)))
    return out


@dataclass(frozen=True)
class _Base:
    """A segment's ``doc`` estimate, its (pulled) reference accuracy and that accuracy's standard error."""

    estimate: Estimate
    accuracy: float
    se: float


def _estimates(
    stats: WindowStats, calibration: SegmentsCalibration, a: int, b: int, prior: DimensionPrior
) -> tuple[dict[int, _Base], dict[int, float]]:
    """The segment headline of every segment of ``a … b − 1`` with a prediction, and each one's excess
    novel inputs (its weight in the reconciliation)."""
    seg = calibration.segments
    assert seg is not None
    ref, formula = seg.reference, REGISTRY[SEGMENT_HEADLINE].formula
    novel = stats.seg_novel if len(stats.seg_novel) == seg.size else [0] * seg.size
    base: dict[int, _Base] = {}
    weights: dict[int, float] = {}
    for s in range(a, b):
        n_s = stats.seg_n[s]
        if n_s <= 0:
            continue
        cal = segment_calibration(calibration, s)
        est = formula(segment_stats(stats, s), cal)
        if est is None:
            continue
        se_ref = math.sqrt(cal.accuracy * (1 - cal.accuracy) / (ref.n[s] + prior.strength))
        base[s] = _Base(est, cal.accuracy, se_ref)
        weights[s] = n_s * _excess_novelty(novel[s] / n_s, n_s, *seg.pulled_novelty(s))
    return base, weights


def _dimension(
    stats: WindowStats,
    calibration: SegmentsCalibration,
    d: int,
    learnt: Estimate | None,
    truth: tuple[Sequence[int], Sequence[int]] | None,
) -> tuple[list[SegmentRow], DimensionDrop]:
    """The rows of dimension ``d``'s segments and its drop (see the module docstring)."""
    seg = calibration.segments
    assert seg is not None
    dim, a, b = seg.spans()[d]
    prior, ref = seg.priors[d], seg.reference
    n_d = sum(stats.seg_n[a:b])
    ref_d = max(sum(ref.n[a:b]), 1)
    base, weights = _estimates(stats, calibration, a, b, prior)
    estimated = {s: x.estimate.value for s, x in base.items()}
    references = {s: x.accuracy for s, x in base.items()}
    adjusted = _reconciled(learnt, estimated, references, stats.seg_n, weights, n_d)
    rows: list[SegmentRow] = []
    mix = within = moved_total = 0.0
    for s in range(a, b):
        n_s = stats.seg_n[s]
        p, q = (n_s / n_d if n_d else 0.0), ref.n[s] / ref_d
        acc = (ref.correct[s] + prior.strength * prior.accuracy) / (ref.n[s] + prior.strength)
        mix += (q - p) * acc
        truth_n, truth_acc = _truth(truth, s)
        name = dim.segments[s - a]
        x = base.get(s)
        if x is None:
            rows.append(
                SegmentRow(
                    s, dim.kind, dim.name, name, n_s, p, q, acc, ref.n[s], None, 0.0, 0.0, 0.0, truth_acc, truth_n
                )
            )
            continue
        moved = adjusted.get(s, 0.0)
        value = x.estimate.value + moved
        loss = x.accuracy - value
        within += p * loss
        moved_total += p * moved
        var_c = max(stats.seg_conf_sq[s] / n_s - (stats.seg_conf[s] / n_s) ** 2, 0.0)
        se = math.sqrt(var_c / n_s + x.se * x.se)
        shrunk = math.copysign(max(abs(loss) - Z95 * se, 0.0), loss)
        estimate = _widened(x.estimate, value, x.se)
        z = loss / se if se > 0 else 0.0
        rows.append(
            SegmentRow(
                s,
                dim.kind,
                dim.name,
                name,
                n_s,
                p,
                q,
                x.accuracy,
                ref.n[s],
                estimate,
                moved,
                p * shrunk,
                z,
                truth_acc,
                truth_n,
            )
        )
    return rows, DimensionDrop(dim.name, dim.kind, mix, within, moved_total)


def _value(row: SegmentRow) -> float:
    return row.estimate.value if row.estimate is not None else row.reference_accuracy


def _truth(truth: tuple[Sequence[int], Sequence[int]] | None, s: int) -> tuple[int, float | None]:
    if truth is None or s >= len(truth[0]) or truth[0][s] <= 0:
        return 0, None
    return int(truth[0][s]), truth[1][s] / truth[0][s]


def _excess_novelty(share: float, n: int, expected: float, rows: float) -> float:
    """How far a segment's share of novel inputs lies above its reference share ``expected`` over ``rows``
    (pulled toward the dimension's, :meth:`~agent.estimation.segments.segmentation.Segmentation.pulled_novelty`),
    beyond :data:`NOVELTY_Z` binomial standard errors of their difference (0 when within them, or without
    novelty)."""
    if share <= 0 or n <= 0:
        return 0.0
    p0 = max(expected, 0.5 / (rows + n))  # a segment never novel at fit still has a floor of noise
    se = math.sqrt(p0 * (1 - p0) * (1.0 / n + 1.0 / rows))
    return max(share - expected - NOVELTY_Z * se, 0.0)


def _reconciled(
    learnt: Estimate | None,
    estimated: dict[int, float],
    references: dict[int, float],
    counts: Sequence[int],
    weights: dict[int, float],
    n_d: int,
) -> dict[int, float]:
    """Per segment, how far its estimate moves so that the dimension adds up to the learnt estimate (see the
    module docstring): a (negative) gap ``Δ`` placed as ``Δ · (n_d / n_s) · w_s / Σ w`` by excess novelty
    ``w``; a positive one taken off the segments' losses in proportion."""
    if learnt is None or n_d <= 0 or not estimated:
        return {}
    summed = sum(counts[s] * v for s, v in estimated.items()) / n_d
    gap = learnt.value - summed
    if gap < 0:
        total = sum(weights.values())
        if total <= 0:
            return {}
        return {s: max(gap * (n_d / counts[s]) * w / total, -estimated[s]) for s, w in weights.items() if w > 0}
    losses = {s: max(references[s] - v, 0.0) for s, v in estimated.items()}
    lost = sum(counts[s] * loss for s, loss in losses.items()) / n_d
    if gap <= 0 or lost <= 0:
        return {}
    keep = min(gap / lost, 1.0)
    return {s: keep * loss for s, loss in losses.items() if loss > 0}
