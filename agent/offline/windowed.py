"""``check`` cut into windows, over data read in batches: every batch is judged as ``check`` judges it, its rows
go to their window (a bucket of time, or of row count) and each window adds up the same additive statistics as
an agent's window (:class:`~agent.estimation.statistics.window.WindowStats`) in a
:class:`~agent.offline.tables.Tally`, as ``check`` does over a table. Memory holds one batch and one tally per
window, whatever the data's length.

Because the sums are additive, the estimates of a window do not depend on how its rows were cut into batches,
partitions or files, nor on their order: only the order of floating-point additions differs, by far less than
1e-9 (``tests/property/test_partitioned_estimates.py`` checks every estimate, interval and segment).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.core.label_values import NONE_INDEX
from agent.data.files import label_indices
from agent.data.frame_rows import FrameRows, rebatched
from agent.data.tables import DEFAULT_BATCH_ROWS, TableBatch
from agent.errors import UserError
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.evidence import evidence_section
from agent.estimation.estimators.registry import headline_estimator
from agent.estimation.segments.segmentation import truth_counts
from agent.estimation.segments.table import SegmentTable, segment_table
from agent.estimation.statistics.window import WindowStats
from agent.model.classifier import OnnxClassifier, Prediction, predicted_classes_of
from agent.offline.check import Judged, calibration_summary, judge
from agent.offline.tables import Tally
from agent.results.window import WindowEntry, window_entry
from invariants.bundle import Bundle
from invariants.compiled import CompiledOracle
from invariants.oracle import OracleResult

#: Classes up to which a window's CBPE figures are kept per class (the agent's default cap).
PER_CLASS_CAP = 20


@dataclass(frozen=True)
class Windowing:
    """How rows are cut into windows: by time (``width_ns`` nanoseconds, buckets aligned on the epoch in UTC),
    or by row count (``rows`` consecutive rows, in the order they are read); neither: one window of all."""

    width_ns: int | None = None
    rows: int | None = None

    def __post_init__(self) -> None:
        if self.width_ns is not None and self.width_ns <= 0:
            raise UserError("a time window must be longer than zero")
        if self.rows is not None and self.rows < 1:
            raise UserError("a window of rows must hold at least 1 row")
        if self.width_ns is not None and self.rows is not None:
            raise UserError("windows are cut by time or by row count, not both")

    @staticmethod
    def of(window: str | int | None) -> Windowing:
        """``"1h"``, ``"15min"``, ``"1 hour"`` (anything pandas reads as a duration): time windows; an int: windows
        of that many rows; None: one window."""
        if window is None:
            return Windowing()
        if isinstance(window, bool) or not isinstance(window, (str, int)):
            raise UserError(f"window: a duration such as '1h' or a number of rows; got {window!r}")
        if isinstance(window, int):
            return Windowing(rows=window)
        import pandas as pd

        try:
            width = pd.Timedelta(window)
        except ValueError:
            raise UserError(f"window {window!r}: not a duration (e.g. '1h', '15min', '1 day')") from None
        return Windowing(width_ns=int(width.value))

    @property
    def by_time(self) -> bool:
        return self.width_ns is not None

    def keys(self, offset: int, n: int, timestamps: np.ndarray | None) -> np.ndarray:
        """The window of each of ``n`` rows read after ``offset`` others (int64 window indices)."""
        if self.width_ns is not None:
            if timestamps is None:
                raise UserError("time windows need timestamps: give timestamp= (a column, or one timestamp per row)")
            return np.floor_divide(timestamps, self.width_ns)
        if self.rows is not None:
            return (offset + np.arange(n, dtype=np.int64)) // self.rows
        return np.zeros(n, dtype=np.int64)

    def bounds(self, key: int) -> tuple[int, int]:
        """Window ``key``'s start and end: nanoseconds since the epoch for time windows, else row numbers
        (the end excluded)."""
        if self.width_ns is not None:
            return key * self.width_ns, (key + 1) * self.width_ns
        if self.rows is not None:
            return key * self.rows, (key + 1) * self.rows
        return 0, 0

    def report_bounds(self, key: int) -> dict[str, str | int]:
        """Window ``key``'s ``start`` and ``end`` as the reports give them: ISO 8601 times in UTC for time windows
        (``2026-02-01T09:00:00+00:00``, as ``to_df()``'s timestamps print), else row numbers (the end excluded)."""
        start, end = self.bounds(key)
        if self.width_ns is None:
            return {"start": start, "end": end}
        import pandas as pd

        return {k: pd.Timestamp(ns, unit="ns", tz="UTC").isoformat() for k, ns in (("start", start), ("end", end))}


@dataclass(frozen=True)
class Added:
    """A batch as :meth:`Windowed.add` judged it: the model's prediction and verdicts, the labels as class indices
    (None: none given) and every row's window."""

    judged: Judged
    y: np.ndarray | None
    keys: np.ndarray


@dataclass
class Windowed:
    """``check`` over windows of a model's data: add batches (:meth:`add`), then read the result. ``model`` None:
    a bundle fitted from a reference table (``fit --reference``), whose batches come with the model's logged
    probabilities (:meth:`add_table`)."""

    model: OnnxClassifier | None
    bundle: Bundle
    windowing: Windowing = field(default_factory=Windowing)
    total: Tally = field(default_factory=Tally)
    windows: dict[int, Tally] = field(default_factory=dict)
    seen: int = 0
    _table_oracle: CompiledOracle | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.calibration = EstimatorCalibration.from_dict(self.bundle.estimator_calibration)
        self.headline = headline_estimator(self.bundle.headline, with_model=self.model is not None)
        self.classes = list(self.bundle.classes if self.model is None else self.model.classes)

    def add(self, rows: FrameRows) -> Added | None:
        """Judge one batch and add each row to its window (and to the total); what was judged (None: no rows)."""
        if len(rows) == 0:
            return None
        if self.model is None:
            raise UserError("a bundle fitted from a reference table judges logged probabilities: add_table")
        return self._judged(judge_rows(self.model, self.bundle, rows), rows.y, rows.timestamps)

    def add_table(self, batch: TableBatch, timestamps: np.ndarray | None = None) -> Added | None:
        """A batch of logged rows (features and the model's probabilities) judged as ``check`` judges a table with
        a bundle fitted from a reference table, each row added to its window."""
        if len(batch) == 0:
            return None
        if self._table_oracle is None:
            self._table_oracle = CompiledOracle(self.bundle.oracle(), batch.x.shape[1], len(self.classes))
        return self._judged(judge_table(self.bundle, self._table_oracle, batch), batch.y, timestamps)

    def _judged(self, judged: Judged, labels: np.ndarray | None, timestamps: np.ndarray | None) -> Added:
        n = len(judged.prediction.predicted)
        y = label_indices(labels, self.classes, allow_none=True) if labels is not None else None
        keys = self.windowing.keys(self.seen, n, timestamps)
        self.seen += n
        found = np.unique(keys).tolist()
        if len(found) == 1:  # the whole batch in one window: its sums computed once, for the window and the total
            self._add((self.total, self.windows.setdefault(int(found[0]), Tally())), judged, y, None)
            return Added(judged, y, keys)
        self._add((self.total,), judged, y, None)
        for key in found:
            idx = np.flatnonzero(keys == key)
            self._add((self.windows.setdefault(int(key), Tally()),), judged, y, idx)
        return Added(judged, y, keys)

    def _add(self, tallies: tuple[Tally, ...], judged: Judged, y: np.ndarray | None, idx: np.ndarray | None) -> None:
        """The rows ``idx`` of the batch (None: all) added to each of ``tallies``, their sums computed once."""
        pred = judged.prediction

        def part(a: np.ndarray | None) -> np.ndarray | None:
            return a if a is None or idx is None else a[idx]

        verdicts = np.asarray(part(np.asarray(judged.result.verdict, dtype=np.int8)))
        predicted = np.asarray(part(pred.predicted))
        features, rules = part(judged.features), part(judged.tdi_rules)
        stats = WindowStats.from_batch(
            verdicts,
            np.asarray(part(pred.confidences)),
            self.calibration,
            probabilities=part(pred.probabilities),
            labels=predicted,
            features=features,
            tdi_rules=rules,
        )
        labels = part(y)
        wrong, none, truth = None, 0, None
        if labels is not None:
            wrong = labels != predicted
            none = int(np.count_nonzero(labels == NONE_INDEX))
            seg = self.calibration.segments
            if seg is not None:
                truth = truth_counts(seg.ids(features, predicted, rules, len(predicted)), seg.size, ~wrong)
        for i, tally in enumerate(tallies):
            tally.add(stats if i == 0 else stats.copy(), verdicts, wrong, none, truth)

    def add_all(self, batches: Iterable[FrameRows], batch_rows: int = DEFAULT_BATCH_ROWS) -> Windowed:
        """Every batch, regrouped into batches of ``batch_rows`` (:func:`~agent.data.frame_rows.rebatched`)."""
        for rows in rebatched(batches, batch_rows):
            self.add(rows)
        return self

    def partials(self) -> list[tuple[int, str]]:
        """Every window's tally as JSON (:func:`tally_json`): what one partition of a distributed run hands on, to
        be merged (:meth:`merge`) with the other partitions' tallies of the same window."""
        return [(k, tally_json(t)) for k, t in self.ordered()]

    def merge(self, key: int, tally: Tally) -> None:
        """Add another partition's tally of window ``key`` (to the window and to the total)."""
        merged_into(self.windows.setdefault(key, Tally()), tally)
        merged_into(self.total, tally)
        self.seen += tally.n

    def ordered(self) -> list[tuple[int, Tally]]:
        """The windows in the order of their keys (time, or rows)."""
        return sorted(self.windows.items())

    def entry(self, name: str, tally: Tally) -> WindowEntry:
        """A window estimated once, as an agent's window is (every estimator, the flag, the segments)."""
        if tally.stats is None:
            raise UserError("the data has no rows")
        return window_entry(
            name, tally.stats, self.calibration, self.headline, self.classes, per_class_cap=PER_CLASS_CAP
        )

    def segments(self, entry: WindowEntry, tally: Tally) -> SegmentTable | None:
        """The window's segment table, with every segment's true accuracy when each of its rows is labeled."""
        truth = None
        if tally.labeled and tally.labeled == tally.n and len(tally.truth_n):
            truth = (tally.truth_n.tolist(), tally.truth_right.tolist())
        return segment_table(entry.stats, self.calibration, entry.estimates, truth=truth)

    def report(self) -> dict[str, Any]:
        """``check``'s report of all the rows (every section but ``classes``, whose per-class figures ``check``
        computes from every row at once), and ``windows``: the same for every window, with its bounds."""
        if self.total.stats is None:
            raise UserError("the data has no rows")
        out: dict[str, Any] = {
            "n": self.total.n,
            "model": (
                {
                    "table": self.bundle.table.to_dict() if self.bundle.table else None,
                    "sha256": self.bundle.model_sha256,
                }
                if self.model is None
                else {"name": self.model.name, "sha256": self.model.sha256}
            ),
            **{k: v for k, v in self.total.report(self.calibration, self.headline).items() if k != "n"},
            **evidence_section(self.calibration.headline, shift_aware=self.calibration.shift is not None),
            "calibration": calibration_summary(self.calibration),
        }
        if self.windowing.by_time or self.windowing.rows is not None:
            out["windows"] = [
                {**self.windowing.report_bounds(k), **t.report(self.calibration, self.headline)}
                for k, t in self.ordered()
            ]
        return out


def judge_table(bundle: Bundle, oracle: CompiledOracle, batch: TableBatch) -> Judged:
    """Logged rows judged as ``check`` judges a table (:mod:`agent.offline.tables`): the predicted class from the
    logged probabilities (with the bundle's decision threshold), the oracle over the feature columns."""
    if batch.probabilities.shape[1] != len(bundle.classes):
        raise UserError(
            f"{batch.probabilities.shape[1]} classes of probabilities; the bundle has {len(bundle.classes)}"
        )
    predicted = predicted_classes_of(batch.probabilities, bundle.decision_threshold)
    result, rules = oracle.judge_with_rules(
        batch.x, batch.probabilities, predicted, metadata=batch.metadata or None, feature_names=bundle.feature_names
    )
    return Judged(Prediction(batch.probabilities, predicted), result, rules, batch.x)


def judge_rows(model: OnnxClassifier, bundle: Bundle, rows: FrameRows) -> Judged:
    """The batch judged as ``check`` judges it. A batch of one row is judged as two copies of it: onnxruntime
    computes a one-row product by another kernel (GEMV), whose float32 result may differ in its last bits from the
    same row's in a batch, and the estimates must not depend on how the data was cut."""
    if len(rows) != 1:
        return judge(model, bundle, rows.x, rows.metadata or None)
    x = {k: np.repeat(v, 2, axis=0) for k, v in rows.x.items()} if isinstance(rows.x, dict) else np.repeat(rows.x, 2, 0)
    meta = {k: np.repeat(v, 2, axis=0) for k, v in rows.metadata.items()}
    two = judge(model, bundle, x, meta or None)
    pred = two.prediction
    first = slice(0, 1)
    return Judged(
        Prediction(pred.probabilities[first], pred.predicted[first], {k: v[first] for k, v in pred.extra.items()}),
        OracleResult(two.result.verdict[first], two.result.rule[first]),
        None if two.tdi_rules is None else two.tdi_rules[first],
        None if two.features is None else two.features[first],
    )


def tally_json(tally: Tally) -> str:
    """A tally's additive parts as JSON (its statistics, verdict counts, labels, the oracle's confusion and the
    labels per segment); a tally with revealed labels (``check --labels``) has no such form."""
    if tally.revealed is not None:
        raise ValueError("a tally with revealed labels is a sample, not a sum: it does not merge")
    return json.dumps(
        {
            "stats": None if tally.stats is None else tally.stats.to_dict(),
            "verdicts": tally.verdicts.tolist(),
            "labeled": tally.labeled,
            "correct": tally.correct,
            "none": tally.none,
            "confusion": tally.confusion.tolist(),
            "truth_n": tally.truth_n.tolist(),
            "truth_right": tally.truth_right.tolist(),
        }
    )


def tally_of_json(text: str) -> Tally:
    """Inverse of :func:`tally_json`."""
    d = json.loads(text)
    return Tally(
        stats=None if d["stats"] is None else WindowStats.from_dict(d["stats"]),
        verdicts=np.asarray(d["verdicts"], dtype=np.int64),
        labeled=int(d["labeled"]),
        correct=int(d["correct"]),
        none=int(d["none"]),
        confusion=np.asarray(d["confusion"], dtype=np.int64),
        truth_n=np.asarray(d["truth_n"], dtype=np.int64),
        truth_right=np.asarray(d["truth_right"], dtype=np.int64),
    )


def merged_into(into: Tally, other: Tally) -> None:
    """``other``'s sums added to ``into``'s."""
    if other.stats is None:
        return
    into.stats = other.stats.copy() if into.stats is None else into.stats + other.stats
    into.verdicts = into.verdicts + other.verdicts
    into.labeled += other.labeled
    into.correct += other.correct
    into.none += other.none
    into.confusion = into.confusion + other.confusion
    if len(other.truth_n):
        into.add_truth((other.truth_n.tolist(), other.truth_right.tolist()))


def realized_accuracy(tally: Tally) -> float | None:
    """The window's realized accuracy (None: not every row labeled)."""
    return tally.correct / tally.labeled if tally.labeled and tally.labeled == tally.n else None


def alert_of(entry: WindowEntry, reference: float, margin: float, floor: float = 0.0) -> bool | None:
    """``IcosEstimatedAccuracyLow`` on one window (``deploy/alerts/source.yaml``): the headline lies more than
    ``margin`` below the reference accuracy and the reference above its 95% interval (widened where the flag is
    raised), or the headline lies below ``floor``. None: an empty window."""
    if entry.headline is None:
        return None
    e = entry.headline[1]
    return bool((e.value + margin < reference and e.upper < reference) or e.value < floor)
