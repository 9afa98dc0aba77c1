"""Realized accuracy from delayed labels, over the same windows as the live estimates.

A labeled prediction belongs to a window by its *prediction* time (not the label's arrival time):
"the realized accuracy of the last hour" is the accuracy of the predictions made in the last hour
that have been labeled so far. The count window ``last<N>`` holds the ``N`` most recent labeled
predictions (by prediction time).

For every window, :class:`RealizedWindows` reports on the labeled predictions in it:

* the realized accuracy (share of correct predictions) with its Wilson 95% interval; a label of none of the
  model's classes (``__none__``, :mod:`agent.core.label_values`) counts as wrong, and the share of such
  labels is reported on its own (``none_of_the_classes``). No label source weighs more than
  ``labels.max_source_share`` of a window in them (nor in the probability errors): a source over it has its
  labels down-weighted (:mod:`agent.labels.source_cap`; ``capped_labels`` counts them), the accuracy is then
  the weighted share and its interval the Wilson interval at the Kish effective number of labels;
* every estimator computed on *the same labeled predictions* (their verdicts and confidences, with
  the runtime's calibration), and its absolute error ``|estimate − realized accuracy|`` — the
  comparison is between equal sets of predictions. When every prediction of the window kept the
  inputs of the full ``shift_aware`` model (margin, TDI leaf, input PCA error; stored with it),
  ``shift_aware`` is computed with the full model, exactly as the live windows do, so its error is
  the error of the value the dashboard shows; otherwise (e.g. predictions stored before these
  inputs were kept) it uses the reduced model;
* the model's probabilistic error against the one-hot truth, with the instruments BenchMetrics Prob
  (Canbek 2023, §5 and Appendix B, Table 10) finds robust: MAE = mean |c − p|, MSE = mean (c − p)²,
  RMSE = √MSE, the mean running over every instance and class (for two classes this is the paper's
  binary definition). The paper's less robust instruments (LogLoss, percentage errors, median or
  geometric-mean summaries) are deliberately absent. This is the definition of
  ``agent.audits.mutation.robustness.probability_errors`` too.

Labels of the labeling sample (``labels.sample_rate``) also give every time window the estimator
``with_labels``, the prediction-powered accuracy of *all* the window's predictions, exact up to its
interval whatever the shift: :meth:`RealizedWindows.labeled_sums` gives the sample's additive sums
(:meth:`~agent.estimation.statistics.window.WindowStats.of_labeled_sample`), which a report adds to the
window's statistics before estimating it. Count windows have none (their labeled predictions are not
the window's latest predictions).

Every labeled prediction of the labeling sample keeps its segment numbers (stored with it, in both store
backends), so each window's labels give its segments their realized accuracy too
(:meth:`RealizedWindows.segment_labels`, :class:`~agent.estimation.segments.realized.SegmentLabels`): the
labels of every replica with a shared store, and of predictions made before a restart.

The labeled samples are kept in memory (at most ``capacity``, the newest by prediction time, and
only those a window can still hold); statistics are recomputed when read (cached for a second).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.core.label_values import NONE_INDEX
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import estimate_all
from agent.estimation.intervals import Estimate, wilson
from agent.estimation.segments.realized import SegmentLabels
from agent.estimation.statistics.class_metrics import realized_class_metrics
from agent.estimation.statistics.window import WindowStats
from agent.judging.windows import count_window_name
from agent.labels.rows import LabeledRows
from agent.labels.source_cap import NO_CAP, capped_group_weights, capped_weights, source_codes


@dataclass(frozen=True)
class ProbabilityErrors:
    """MAE, MSE and RMSE of probabilities against one-hot truth (BenchMetrics Prob's robust instruments)."""

    mae: float
    mse: float
    rmse: float

    def to_dict(self) -> dict[str, float]:
        return {"mae": self.mae, "mse": self.mse, "rmse": self.rmse}


def probability_errors(abs_err: np.ndarray, sq_err: np.ndarray, n_classes: np.ndarray) -> ProbabilityErrors:
    """From per-prediction sums over classes: MAE = Σ|c−p| / ΣK, MSE = Σ(c−p)² / ΣK, RMSE = √MSE."""
    cells = float(np.sum(n_classes))
    if cells <= 0:
        return ProbabilityErrors(0.0, 0.0, 0.0)
    mse = float(np.sum(sq_err)) / cells
    return ProbabilityErrors(float(np.sum(abs_err)) / cells, mse, math.sqrt(mse))


@dataclass(frozen=True)
class RealizedWindow:
    """Realized accuracy of the labeled predictions of one window, and how the estimators did on them."""

    n: int
    correct: int
    accuracy: Estimate
    estimates: dict[str, Estimate] = field(default_factory=dict)
    abs_errors: dict[str, float] = field(default_factory=dict)
    probability_errors: ProbabilityErrors = ProbabilityErrors(0.0, 0.0, 0.0)
    #: the ``lab_*`` sums of the labeled predictions of the labeling sample (``with_labels``'s side)
    sample: WindowStats = field(default_factory=WindowStats)
    #: precision, recall and F1 per class of the labeled predictions (None: class names not given)
    classes: dict[str, Any] | None = None
    #: labeled predictions whose input belongs to none of the model's classes (label ``__none__``)
    none_of_the_classes: int = 0
    #: the labeling sample's labels per segment of the bundle's segmentation (None: no segments, or none kept)
    segments: SegmentLabels | None = None
    #: their share of the labels' weight after the source cap (None: their plain share)
    none_weight: float | None = None
    #: labels down-weighted because their source held more than ``labels.max_source_share`` of the window's
    capped: int = 0

    @property
    def none_share(self) -> float:
        if self.none_weight is not None:
            return self.none_weight
        return self.none_of_the_classes / self.n if self.n else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "n_sampled": self.sample.lab_n,
            "correct": self.correct,
            "accuracy": self.accuracy.to_dict(),
            "none_of_the_classes": {"n": self.none_of_the_classes, "share": self.none_share},
            "capped_labels": self.capped,
            "estimates": {k: e.to_dict() for k, e in self.estimates.items()},
            "abs_error": dict(self.abs_errors),
            "probability_error": self.probability_errors.to_dict(),
            **({"classes": self.classes} if self.classes is not None else {}),
        }


def realized_window(
    rows: LabeledRows,
    calibration: EstimatorCalibration,
    classes: Sequence[str] | None = None,
    *,
    per_class: bool = True,
    max_source_share: float = NO_CAP,
) -> RealizedWindow | None:
    """The realized statistics of a set of labeled predictions (``None`` when empty); with the model's
    ``classes``, their per-class precision, recall and F1 too (``per_class=False``: only the means). No source
    weighs more than ``max_source_share`` of the accuracy, the share of ``__none__`` labels and the probability
    errors (:mod:`agent.labels.source_cap`)."""
    n = rows.n
    if n == 0:
        return None
    correct = int(np.sum(rows.correct))
    f, capped = capped_weights(rows.source, None, max_source_share)  # type: ignore[arg-type]
    total = float(np.sum(f))
    acc = float(np.sum(f * rows.correct)) / total
    if capped:  # the Wilson interval at the Kish effective number of labels
        n_eff = total * total / float(np.sum(f * f))
        lo, hi = wilson(acc * n_eff, n_eff)
        lo, hi = min(lo, acc), max(hi, acc)
    else:
        lo, hi = wilson(correct, n)
    shift = calibration.shift
    extras = rows.sample_extras() if shift is not None else None
    stats = WindowStats.of_samples(
        rows.verdict, rows.confidence, calibration.atc_threshold, extras, shift.reference if shift else None
    )
    ests = estimate_all(stats, calibration)
    none = rows.label == NONE_INDEX if rows.label is not None else np.zeros(n, dtype=bool)
    return RealizedWindow(
        n=n,
        correct=correct,
        accuracy=Estimate(acc, lo, hi, n),
        estimates=ests,
        abs_errors={k: abs(e.value - acc) for k, e in ests.items()},
        probability_errors=probability_errors(f * rows.abs_err, f * rows.sq_err, f * rows.n_classes),
        sample=_labeled_sample(rows, calibration),
        classes=_class_figures(rows, classes, per_class),
        none_of_the_classes=int(np.count_nonzero(none)),
        none_weight=float(np.sum(f * none)) / total,
        capped=capped,
        segments=sample_segment_labels(rows, calibration, max_source_share),
    )


def sample_segment_labels(
    rows: LabeledRows, calibration: EstimatorCalibration, max_source_share: float = NO_CAP
) -> SegmentLabels | None:
    """Per segment of the calibration's segmentation, the labels of the labeling sample among ``rows`` that
    kept their segment numbers, each weighted by ``1/π`` of its draw (1 where the draws were equal) and, within
    each segment, no source over ``max_source_share`` of its labels' weight (:mod:`agent.labels.source_cap`).
    None without segments or without such labels. Rows of another segmentation (another count of dimensions)
    are left out."""
    seg = calibration.segments
    ids = rows.segments
    if seg is None or ids is None or ids.shape[1] != len(seg.dimensions) or rows.n == 0:
        return None
    keep = rows.sampled & (ids >= 0).all(axis=1) & (ids < seg.size).all(axis=1)  # type: ignore[operator]
    if not keep.any():
        return None
    p = rows.draw_probability[keep]  # type: ignore[index]
    weights = np.where(np.isfinite(p) & (p > 0), 1.0 / np.where(p > 0, p, 1.0), 1.0)
    kept_ids = ids[keep].T
    d = kept_ids.shape[0]
    codes, n_sources = source_codes(rows.source[keep])  # type: ignore[index]
    capped = capped_group_weights(
        kept_ids.reshape(-1), seg.size, np.tile(codes, d), n_sources, np.tile(weights, d), max_source_share
    )
    return SegmentLabels.of(kept_ids, seg.size, rows.correct[keep], capped.reshape(d, -1))


def _labeled_sample(rows: LabeledRows, calibration: EstimatorCalibration) -> WindowStats:
    """The ``lab_*`` sums of the labeling sample among ``rows`` (weighted ones where every draw
    probability is known, per segment too where every one kept its segments), with the calibration's
    per-prediction predictor."""
    s = rows.sampled
    out = WindowStats.of_labeled_sample(
        rows.confidence[s],
        rows.correct[s],
        predicted_correct=calibration.predicted_correct(rows.confidence[s], rows.verdict[s]),
        draw_probability=rows.draw_probability[s],  # type: ignore[index]
    )
    seg, ids = calibration.segments, rows.segments[s]  # type: ignore[index]
    if out.lab_ipw_n and seg is not None and ids.shape[1] == len(seg.dimensions) and bool((ids >= 0).all()):
        # every weighted label knows its segments: with_labels can be post-stratified on them
        out.add_segment_labels(
            ids.T,
            seg.size,
            rows.confidence[s],
            rows.correct[s],
            rows.draw_probability[s],  # type: ignore[index]
        )
    return out


def _class_figures(rows: LabeledRows, classes: Sequence[str] | None, per_class: bool) -> dict[str, Any] | None:
    if not classes or rows.label is None or rows.predicted is None:
        return None
    out = realized_class_metrics(rows.label, rows.predicted, len(classes), classes)
    if not per_class:
        del out["per_class"]
    return out


def _take(rows: LabeledRows, idx: np.ndarray) -> LabeledRows:
    return LabeledRows(*(getattr(rows, f)[idx] for f in LabeledRows.__dataclass_fields__))


def _concat(parts: list[LabeledRows]) -> LabeledRows:
    if not parts:
        return LabeledRows.empty()
    if len(parts) == 1:
        return parts[0]
    width = max(p.segments.shape[1] for p in parts)  # type: ignore[union-attr]
    parts = [p if p.segments.shape[1] == width else _widened(p, width) for p in parts]  # type: ignore[union-attr]
    return LabeledRows(*(np.concatenate([getattr(p, f) for p in parts]) for f in LabeledRows.__dataclass_fields__))


def _widened(rows: LabeledRows, width: int) -> LabeledRows:
    """``rows`` with ``width`` segment columns, unknown (-1) where they kept fewer (none, or another bundle's)."""
    return dataclasses.replace(rows, segments=np.full((rows.n, width), -1, dtype=np.int64))


class RealizedWindows:
    """Labeled predictions of one model, kept for the time windows and the count window (thread-safe)."""

    def __init__(
        self, time_windows: Mapping[str, float], count: int | None, capacity: int, max_source_share: float = NO_CAP
    ) -> None:
        self.time = dict(time_windows)
        #: ``labels.max_source_share``: one source's labels weigh at most this share of a window's
        self.max_source_share = float(max_source_share)
        self.count = count
        self.count_name = count_window_name(count) if count else None
        self.capacity = int(capacity)
        self._parts: list[LabeledRows] = []
        self._lock = threading.Lock()
        self._version = 0
        self._cache: tuple[tuple[int, EstimatorCalibration, int], dict[str, RealizedWindow | None]] | None = None

    @property
    def names(self) -> list[str]:
        return [*self.time, *([self.count_name] if self.count_name else [])]

    def add(self, rows: LabeledRows) -> None:
        if rows.n == 0:
            return
        with self._lock:
            self._parts.append(rows)
            self._version += 1

    def reset(self, rows: LabeledRows | None = None) -> None:
        with self._lock:
            self._parts = [rows] if rows is not None and rows.n else []
            self._version += 1

    def _compact(self, now: float) -> LabeledRows:
        """All kept samples sorted by prediction time, pruned to what a window can hold (lock held)."""
        rows = _concat(self._parts)
        if rows.n == 0:
            return rows
        order = np.argsort(rows.timestamp, kind="stable")
        keep = np.zeros(rows.n, dtype=bool)
        if self.time:
            keep |= rows.timestamp[order] >= now - max(self.time.values())
        if self.count:
            keep[-self.count :] = True
        idx = order[keep][-self.capacity :]
        rows = _take(rows, idx)
        self._parts = [rows]
        return rows

    @property
    def size(self) -> int:
        with self._lock:
            return sum(p.n for p in self._parts)

    def compute(
        self,
        calibration: EstimatorCalibration,
        now: float,
        classes: Sequence[str] | None = None,
        *,
        per_class: bool = True,
    ) -> dict[str, RealizedWindow | None]:
        """Per window name, its :class:`RealizedWindow` (``None`` when it holds no labeled prediction);
        ``classes`` (the model's class names) adds the per-class figures."""
        key = (self._version, calibration, int(now))
        cached = self._cache
        if cached is not None and cached[0][0] == key[0] and cached[0][1] is calibration and cached[0][2] == key[2]:
            return cached[1]
        with self._lock:
            rows = self._compact(now)
        out: dict[str, RealizedWindow | None] = {}
        for name, seconds in self.time.items():
            in_window = _take(rows, np.flatnonzero(rows.timestamp >= now - seconds))
            out[name] = realized_window(
                in_window, calibration, classes, per_class=per_class, max_source_share=self.max_source_share
            )
        if self.count and self.count_name:
            last = _take(rows, np.arange(max(rows.n - self.count, 0), rows.n))
            out[self.count_name] = realized_window(
                last, calibration, classes, per_class=per_class, max_source_share=self.max_source_share
            )
        self._cache = (key, out)
        return out

    def labeled_sums(
        self,
        calibration: EstimatorCalibration,
        now: float,
        classes: Sequence[str] | None = None,
        *,
        per_class: bool = True,
    ) -> dict[str, WindowStats]:
        """Per time window holding labeled predictions of the labeling sample, their ``lab_*`` sums."""
        realized = self.compute(calibration, now, classes, per_class=per_class)
        return {name: w.sample for name, w in self._time_windows(realized) if w.sample.lab_n}

    def segment_labels(
        self,
        calibration: EstimatorCalibration,
        now: float,
        classes: Sequence[str] | None = None,
        *,
        per_class: bool = True,
    ) -> dict[str, SegmentLabels]:
        """Per time window whose labeling sample kept segment numbers, its labels per segment."""
        realized = self.compute(calibration, now, classes, per_class=per_class)
        return {name: w.segments for name, w in self._time_windows(realized) if w.segments is not None}

    def _time_windows(self, realized: Mapping[str, RealizedWindow | None]) -> list[tuple[str, RealizedWindow]]:
        """The time windows of ``realized`` that hold labeled predictions (count windows have no labeling sample)."""
        return [(name, w) for name in self.time if (w := realized.get(name)) is not None]
