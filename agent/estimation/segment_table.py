"""Where a window's drop is: every segment's share now and at reference, its estimated accuracy, and its
contribution to the window's drop from the reference (DESIGN, "Diagnosis and comparison").

:func:`segment_table` reads a window's per-segment sums (:class:`~agent.estimation.statistics.WindowStats`
``seg_*``) with the bundle's :class:`~agent.estimation.segments.Segmentation`; it is what every surface
renders (``/v1/estimates``, ``check``, the fleet, the metrics) and what any other reader of the per-segment
picture should call.

**The segment's estimate.** A segment's reference is its own part of the labeled validation data: its
accuracy ``a_s`` and mean confidence (pulled toward the whole set's by :data:`REFERENCE_PRIOR`
pseudo-predictions, so that a thin segment does not read its noise as its accuracy), its oracle TPR/FPR on the
calibration split. Of the registered estimators, those whose spec says they run on a segment's sums
(``on_segments``: ``icos``, ``icos_corrected``, ``avg_conf``, ``doc``) can estimate it with that reference as
their calibration (:func:`segment_estimates`). The segment headline is :data:`SEGMENT_HEADLINE`, ``doc``:
the segment's reference accuracy moved by the change of its mean confidence. With the segment's own
reference it reads exactly ``a_s`` on data like the validation data, whatever the segment's calibration
(a segment the model is overconfident on is not read as a drop), it needs only the confidence sums, and,
unlike ``icos_corrected``, it does not divide a fail share by a TPR − FPR measured on a few of the
segment's errors.

**What the headline sees beyond confidence.** Where the window's headline (``shift_aware`` reads input
novelty, TDI agreement and more) finds less accuracy than the segments' ``doc`` estimates add up to, the
difference is placed on the segments whose inputs moved away from their reference: in each dimension, in
proportion to their excess input novelty (their mean PCA reconstruction error above the reference's by more
than :data:`NOVELTY_Z` standard errors, times their predictions). The segments of a dimension then add up to
the headline. Without a ``shift_aware`` reference (table bundles) nothing is placed.

**Contribution.** With reference share ``q_s`` and accuracy ``a_s``, live share ``p_s`` and estimate ``â_s``,
a dimension's drop ``Σ q_s a_s − Σ p_s â_s`` is the mix part ``Σ (q_s − p_s) a_s`` (a change of traffic
mix, harmless in itself) plus the within part ``Σ p_s (a_s − â_s)``; segments are ranked by their own loss
``p_s (a_s − â_s)``, shrunk toward 0 by :data:`~agent.estimation.intervals.Z95` standard errors of ``a_s −
â_s`` (the sampling noise of the live confidence and of the reference accuracy), so that a segment within
noise of its reference contributes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators import REGISTRY
from agent.estimation.intervals import Z95, Estimate, clip01
from agent.estimation.segments import Segmentation, label_of
from agent.estimation.statistics import WindowStats

#: The estimator of a segment's accuracy (see the module docstring for why).
SEGMENT_HEADLINE = "doc"
#: Pseudo-predictions pulling a segment's reference accuracy and confidence toward the whole validation set's.
REFERENCE_PRIOR = 5.0
#: Standard errors by which a segment's mean input novelty must exceed its reference to take a share of the
#: headline's drop beyond the segments' own estimates.
NOVELTY_Z = 2.0
#: Pseudo-counts pulling a segment's TDI/ADI TPR and FPR toward the oracle's on the whole calibration split.
RATE_PRIOR = 10.0


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
    #: the part of the estimate placed on it from the window headline's drop beyond the segments' estimates
    allocated: float
    contribution: float
    #: ``(a_s − â_s)`` in standard errors of its noise
    z: float
    #: realized accuracy of its labeled predictions (None: none labeled)
    truth_accuracy: float | None = None
    truth_n: int = 0

    @property
    def label(self) -> str:
        """The segment's label of the Prometheus series."""
        return label_of(self.name)

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
        if self.allocated:
            out["allocated"] = r(self.allocated)
        if self.truth_accuracy is not None:
            out["truth_accuracy"] = r(self.truth_accuracy)
            out["truth_n"] = self.truth_n
        return out


@dataclass(frozen=True)
class DimensionDrop:
    """A dimension's split of the window's drop: ``mix`` (shares moved), ``within`` (segments lost accuracy),
    ``allocated`` (of ``within``: the headline's drop beyond the segments' own estimates)."""

    dimension: str
    kind: str
    mix: float
    within: float
    allocated: float

    def to_json(self, decimals: int | None = None) -> dict[str, Any]:
        def r(v: float) -> float:
            return round(v, decimals) if decimals is not None else v

        return {"kind": self.kind, "mix": r(self.mix), "within": r(self.within), "allocated": r(self.allocated)}


@dataclass(frozen=True)
class SegmentTable:
    """One window's segments, ranked by contribution (largest first), and each dimension's drop."""

    estimator: str
    reference_accuracy: float
    rows: tuple[SegmentRow, ...]
    dimensions: tuple[DimensionDrop, ...]

    def top(self, k: int) -> tuple[SegmentRow, ...]:
        return self.rows[:k]

    def rows_json(self, decimals: int | None = None) -> list[dict[str, Any]]:
        return [row.to_json(decimals) for row in self.rows]

    def drop_json(self, decimals: int | None = None) -> dict[str, Any]:
        return {
            "estimator": self.estimator,
            "reference_accuracy": round(self.reference_accuracy, decimals)
            if decimals is not None
            else self.reference_accuracy,
            "dimensions": {d.dimension: d.to_json(decimals) for d in self.dimensions},
        }


@dataclass(frozen=True)
class _Reference:
    """The whole validation set's accuracy, confidence and novelty (what thin segments are pulled toward)."""

    accuracy: float
    conf: float
    novelty: float
    novelty_sd: float


def _whole(seg: Segmentation) -> _Reference:
    ref = seg.reference
    _, a, b = seg.spans()[0]
    n = max(sum(ref.n[a:b]), 1)
    mean = sum(ref.novelty[a:b]) / n
    var = max(sum(ref.novelty_sq[a:b]) / n - mean * mean, 0.0)
    return _Reference(sum(ref.correct[a:b]) / n, sum(ref.conf[a:b]) / n, mean, math.sqrt(var))


def segment_calibration(calibration: EstimatorCalibration, index: int) -> EstimatorCalibration:
    """The calibration an estimator reads for segment ``index``: the segment's reference accuracy and mean
    confidence (pulled toward the whole set's) and its oracle TPR/FPR (pulled toward the oracle's)."""
    seg = calibration.segments
    assert seg is not None
    ref, whole = seg.reference, _whole(seg)
    m = REFERENCE_PRIOR
    accuracy = (ref.correct[index] + m * whole.accuracy) / (ref.n[index] + m)
    conf = (ref.conf[index] + m * whole.conf) / (ref.n[index] + m)
    wrong, right = ref.cal_wrong[index], ref.cal_right[index]
    tpr = (ref.cal_fail_wrong[index] + RATE_PRIOR * calibration.tpr) / (wrong + RATE_PRIOR)
    fpr = (ref.cal_fail_right[index] + RATE_PRIOR * calibration.fpr) / (right + RATE_PRIOR)
    return replace(
        calibration,
        tpr=tpr,
        fpr=fpr,
        n_wrong=wrong,
        n_right=right,
        accuracy=accuracy,
        avg_conf=conf,
        shift=None,
        headline=None,
        segments=None,
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


def segment_estimates(stats: WindowStats, calibration: EstimatorCalibration, index: int) -> dict[str, Estimate]:
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
    calibration: EstimatorCalibration,
    headline: Estimate | None = None,
    *,
    truth: tuple[Sequence[int], Sequence[int]] | None = None,
) -> SegmentTable | None:
    """The window's segments (None: the bundle has none, or the statistics are of another segmentation);
    ``headline``: the window's headline estimate, whose drop beyond the segments' estimates is placed on the
    segments by input novelty; ``truth``: per segment, labeled predictions and the right ones among them."""
    seg = calibration.segments
    if seg is None or len(stats.seg_n) != seg.size or stats.n <= 0 or not any(stats.seg_n):
        return None
    formula = REGISTRY[SEGMENT_HEADLINE].formula
    ref, whole = seg.reference, _whole(seg)
    rows: list[SegmentRow] = []
    drops: list[DimensionDrop] = []
    novelty = stats.seg_novelty if len(stats.seg_novelty) == seg.size else [0.0] * seg.size
    for dim, a, b in seg.spans():
        n_d = sum(stats.seg_n[a:b])
        ref_d = max(sum(ref.n[a:b]), 1)
        base: dict[int, tuple[Estimate, float, float]] = {}
        weights: dict[int, float] = {}
        for s in range(a, b):
            n_s = stats.seg_n[s]
            cal = segment_calibration(calibration, s)
            if n_s <= 0:
                continue
            est = formula(segment_stats(stats, s), cal)
            if est is None:
                continue
            se_ref = math.sqrt(cal.accuracy * (1 - cal.accuracy) / (ref.n[s] + REFERENCE_PRIOR))
            base[s] = (est, cal.accuracy, se_ref)
            weights[s] = n_s * _excess_novelty(novelty[s] / n_s, n_s, ref, s, whole)
        estimated = {s: e.value for s, (e, _, _) in base.items()}
        allocated = _allocation(headline, estimated, stats.seg_n, weights, n_d)
        mix = within = placed = 0.0
        for s in range(a, b):
            n_s = stats.seg_n[s]
            p = n_s / n_d if n_d else 0.0
            q = ref.n[s] / ref_d
            cal_acc = (ref.correct[s] + REFERENCE_PRIOR * whole.accuracy) / (ref.n[s] + REFERENCE_PRIOR)
            mix += (q - p) * cal_acc
            truth_n, truth_acc = _truth(truth, s)
            if s not in base:
                rows.append(
                    SegmentRow(s, dim.kind, dim.name, dim.segments[s - a], n_s, p, q, cal_acc, ref.n[s], None, 0.0,
                               0.0, 0.0, truth_acc, truth_n)
                )  # fmt: skip
                continue
            est, acc, se_ref = base[s]
            moved = allocated.get(s, 0.0)
            value = est.value + moved
            loss = acc - value
            within += p * loss
            placed += p * moved
            var_c = max(stats.seg_conf_sq[s] / n_s - (stats.seg_conf[s] / n_s) ** 2, 0.0)
            se = math.sqrt(var_c / n_s + se_ref * se_ref)
            shrunk = math.copysign(max(abs(loss) - Z95 * se, 0.0), loss)
            rows.append(
                SegmentRow(
                    s,
                    dim.kind,
                    dim.name,
                    dim.segments[s - a],
                    n_s,
                    p,
                    q,
                    acc,
                    ref.n[s],
                    _widened(est, value, se_ref),
                    moved,
                    p * shrunk,
                    loss / se if se > 0 else 0.0,
                    truth_acc,
                    truth_n,
                )
            )
        drops.append(DimensionDrop(dim.name, dim.kind, mix, within, placed))
    rows.sort(key=lambda r: (-r.contribution, -(r.share * (r.reference_accuracy - _value(r))), r.index))
    return SegmentTable(SEGMENT_HEADLINE, whole.accuracy, tuple(rows), tuple(drops))


def _value(row: SegmentRow) -> float:
    return row.estimate.value if row.estimate is not None else row.reference_accuracy


def _truth(truth: tuple[Sequence[int], Sequence[int]] | None, s: int) -> tuple[int, float | None]:
    if truth is None or s >= len(truth[0]) or truth[0][s] <= 0:
        return 0, None
    return int(truth[0][s]), truth[1][s] / truth[0][s]


def _excess_novelty(mean: float, n: int, ref: Any, s: int, whole: _Reference) -> float:
    """How far a segment's mean input novelty lies above its reference, beyond :data:`NOVELTY_Z` standard
    errors (0 when within them, or without novelty)."""
    m = REFERENCE_PRIOR
    ref_n = ref.n[s]
    ref_mean = (ref.novelty[s] + m * whole.novelty) / (ref_n + m)
    ref_sq = (ref.novelty_sq[s] + m * (whole.novelty_sd**2 + whole.novelty**2)) / (ref_n + m)
    sd = math.sqrt(max(ref_sq - ref_mean * ref_mean, 0.0))
    if mean <= 0 or ref_mean <= 0:
        return 0.0
    return max(mean - ref_mean - NOVELTY_Z * sd / math.sqrt(n), 0.0)


def _allocation(
    headline: Estimate | None, estimated: dict[int, float], counts: Sequence[int], weights: dict[int, float], n_d: int
) -> dict[int, float]:
    """Per segment, its share of the headline's drop beyond what the segments' estimates add up to (see the
    module docstring): ``Δ · (n_d / n_s) · w_s / Σ w`` for ``Δ`` the (negative) difference."""
    total = sum(weights.values())
    if headline is None or total <= 0 or n_d <= 0:
        return {}
    summed = sum(counts[s] * v for s, v in estimated.items()) / n_d
    gap = headline.value - summed
    if gap >= 0:
        return {}
    return {s: max(gap * (n_d / counts[s]) * w / total, -estimated[s]) for s, w in weights.items() if w > 0}
