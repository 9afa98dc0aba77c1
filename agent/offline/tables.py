"""``fit`` and ``check`` for any model, from tables of its predictions (no ONNX model needed).

A reference table (features, predicted probabilities, labels, :func:`read_reference`) replaces the model
and its training and validation files (:func:`agent.offline.fit.fit_table_bundle`): its rows are split,
stratified by label, into a training part (the TDIs) and a validation part, which
:func:`invariants.fitting.fit_oracle` splits again into ADI training and the calibration split, exactly as
for a model's bundle. Everything that needs only predictions is fitted: IDI (user rules), TDI, ADI, the
oracle's TPR/FPR and the classic estimators (``icos``, ``icos_corrected``, ``avg_conf``, ``cbpe``,
``atc``, ``doc``). ``shift_aware`` is not: it learns from corrupted copies of the calibration inputs
passed through the model. The bundle's headline is chosen among the others from their errors on
simulated shifts of the calibration split (:mod:`agent.offline.calibration.estimators.headline_choice`; ``cbpe``
unless another clearly does better), and the evidence is kept in the bundle. Bundles fitted before the
choice keep their manifest's headline (:data:`~agent.estimation.estimators.registry.TABLE_HEADLINE` when it
names none).

``check`` streams the production table in bounded batches and adds up the window statistics
(:class:`~agent.estimation.statistics.window.WindowStats` are additive), so a file of any length is judged
in the memory of one batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.core.label_values import NONE_INDEX
from agent.data.files import label_indices
from agent.data.limits import DataLimits
from agent.data.tables import DEFAULT_BATCH_ROWS, TableBatch, TableColumns, iter_table
from agent.errors import UserError
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.evidence import evidence_section
from agent.estimation.estimators.registry import NEEDS_LABELS, estimate_window, headline_estimator
from agent.estimation.intervals import Estimate
from agent.estimation.segments.segmentation import truth_counts
from agent.estimation.segments.table import segment_table
from agent.estimation.statistics.window import WindowStats
from agent.model.classifier import label_confidences, predicted_classes_of
from agent.offline.check import labeled_sections
from agent.results.estimate import estimates_json
from agent.results.segments import segments_json
from agent.results.window import flag_sections
from invariants.bundle import Bundle
from invariants.compiled import CompiledOracle
from invariants.oracle import VERDICTS


def read_reference(
    path: str | Path, columns: TableColumns, batch_rows: int = DEFAULT_BATCH_ROWS, limits: DataLimits | None = None
) -> TableBatch:
    """The whole reference table (fitting needs every row at once), read in batches within ``limits``
    (the whole table counts against ``max_bytes``). Every row is checked (finite features, probabilities
    that sum to 1) before it is split into training and validation parts."""
    parts = list(iter_table(path, columns, batch_rows=batch_rows, desc="read reference", limits=limits, whole=True))
    if not parts:
        raise UserError(f"{path}: the reference table has no rows")
    ys = [p.y for p in parts]
    return TableBatch(
        np.concatenate([p.x for p in parts]),
        np.concatenate([p.probabilities for p in parts]),
        None if any(y is None for y in ys) else np.concatenate([y for y in ys if y is not None]),
        {m: np.concatenate([p.metadata[m] for p in parts]) for m in columns.metadata},
    )


@dataclass
class Tally:
    """What ``check`` adds up over the batches of one span of rows (the file, or one chunk)."""

    start: int = 0
    stats: WindowStats | None = None
    verdicts: np.ndarray = field(default_factory=lambda: np.zeros(len(VERDICTS), dtype=np.int64))
    labeled: int = 0
    correct: int = 0
    #: labels of none of the model's classes among them (counted as wrong)
    none: int = 0
    #: oracle fail (positive) against model wrong: tp, fp, tn, fn
    confusion: np.ndarray = field(default_factory=lambda: np.zeros(4, dtype=np.int64))
    #: the revealed labels (``check --labels``): a uniform sample of this tally's rows
    revealed: _Reservoir | None = None
    #: per segment, the labeled rows and the right ones (empty: no segments or no labels)
    truth_n: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    truth_right: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def n(self) -> int:
        return 0 if self.stats is None else self.stats.n

    def add(
        self,
        stats: WindowStats,
        verdicts: np.ndarray,
        wrong: np.ndarray | None,
        none: int = 0,
        truth: tuple[list[int], list[int]] | None = None,
    ) -> None:
        self.stats = stats if self.stats is None else self.stats + stats
        self.none += none
        if truth is not None:
            self.add_truth(truth)
        self.verdicts += np.bincount(verdicts.astype(np.int64), minlength=len(VERDICTS))
        if wrong is not None:
            failed = verdicts != 0
            self.labeled += len(wrong)
            self.correct += int((~wrong).sum())
            self.confusion += [
                int((failed & wrong).sum()),
                int((failed & ~wrong).sum()),
                int((~failed & ~wrong).sum()),
                int((~failed & wrong).sum()),
            ]

    def add_truth(self, counts: tuple[list[int], list[int]]) -> None:
        n, right = (np.asarray(c, dtype=np.int64) for c in counts)
        if len(self.truth_n) != len(n):
            self.truth_n, self.truth_right = np.zeros_like(n), np.zeros_like(n)
        self.truth_n += n
        self.truth_right += right

    def segments(self, calibration: EstimatorCalibration, estimates: dict[str, Estimate]) -> dict[str, Any]:
        """``segments`` and ``segment_drop`` of this span (the true accuracy per segment when every row is
        labeled)."""
        if self.stats is None:
            return {}
        truth = None
        if self.labeled and self.labeled == self.n and len(self.truth_n):
            truth = (self.truth_n.tolist(), self.truth_right.tolist())
        table = segment_table(self.stats, calibration, estimates, truth=truth)
        return segments_json(table, decimals=None) if table is not None else {}

    def report(self, calibration: EstimatorCalibration, headline: str) -> dict[str, Any]:
        stats = self.stats
        if stats is not None and self.revealed is not None:
            stats = stats + self.revealed.stats()
        window = estimate_window(stats, calibration) if stats is not None else None
        estimates = window.estimates if window is not None else {}
        out: dict[str, Any] = {
            "n": self.n,
            "headline": headline,
            "verdicts": {name: int(c) for name, c in zip(VERDICTS, self.verdicts, strict=True)},
            "estimates": estimates_json(estimates, calibration, decimals=None),
        }
        if window is not None:
            out.update(flag_sections(window, headline, calibration))
        labeled = [n for n in estimates if n in NEEDS_LABELS] if self.revealed is not None else []
        for name in labeled:  # the estimators of the revealed labels say how many and how they were drawn
            assert self.revealed is not None
            out["estimates"][name].update(n_labels=self.revealed.size, seed=self.revealed.seed)
        if self.labeled and self.labeled == self.n:
            none = {"n": self.none, "share": self.none / self.labeled}
            tp, fp, tn, fn = (int(v) for v in self.confusion)
            out.update(labeled_sections(self.correct / self.labeled, none, (tp, fp, tn, fn), estimates))
        out.update(self.segments(calibration, estimates))
        return out


def _slices(batches: Iterator[TableBatch], chunk_rows: int | None) -> Iterator[tuple[bool, TableBatch]]:
    """The batches cut at chunk boundaries: ``(starts_a_chunk, rows)``."""
    filled = 0
    for batch in batches:
        i = 0
        while i < len(batch):
            take = len(batch) - i if chunk_rows is None else min(len(batch) - i, chunk_rows - filled)
            part = batch if take == len(batch) else _take(batch, slice(i, i + take))
            yield chunk_rows is not None and filled == 0, part
            filled = 0 if chunk_rows is None else (filled + take) % chunk_rows
            i += take


class _Reservoir:
    """A uniform sample of at most ``k`` rows of a stream (reservoir sampling, Vitter's algorithm R): the
    labels ``check --labels`` reveals in a table read batch by batch, whatever its length. Keeps each
    sampled row's top-class probability and whether the prediction was right."""

    def __init__(self, k: int, seed: int, stream: int) -> None:
        self.k, self.seed, self.seen = k, seed, 0
        self.rng = np.random.default_rng([seed, stream])
        self.conf = np.zeros(k)
        self.right = np.zeros(k, dtype=bool)

    @property
    def size(self) -> int:
        return min(self.seen, self.k)

    def add(self, conf: np.ndarray, right: np.ndarray) -> None:
        t = self.seen + np.arange(len(conf))
        fill = t < self.k
        self.conf[t[fill]], self.right[t[fill]] = conf[fill], right[fill]
        slot = self.rng.integers(0, t + 1)
        for i in np.flatnonzero(~fill & (slot < self.k)):  # expected k·ln(n/k) replacements in all
            self.conf[slot[i]], self.right[slot[i]] = conf[i], right[i]
        self.seen += len(conf)

    def stats(self) -> WindowStats:
        return WindowStats.of_labeled_sample(self.conf[: self.size], self.right[: self.size])


def _take(batch: TableBatch, rows: slice) -> TableBatch:
    return TableBatch(
        batch.x[rows],
        batch.probabilities[rows],
        None if batch.y is None else batch.y[rows],
        {k: v[rows] for k, v in batch.metadata.items()},
    )


def _labeled(
    part: TableBatch, bundle: Bundle, cal: EstimatorCalibration, predicted: np.ndarray, rules: np.ndarray | None
) -> tuple[np.ndarray | None, int, tuple[list[int], list[int]] | None]:
    """A batch's labels, where it has them: which predictions were wrong, how many labels say none of the
    classes (``__none__``) and every segment's labeled and right predictions (None without segments)."""
    if part.y is None:
        return None, 0, None
    labeled = label_indices(part.y, bundle.classes, allow_none=True)
    wrong = labeled != predicted
    none = int(np.count_nonzero(labeled == NONE_INDEX))
    truth = None
    if cal.segments is not None:
        truth = truth_counts(cal.segments.ids(part.x, predicted, rules, len(part)), cal.segments.size, ~wrong)
    return wrong, none, truth


def _asked(chunk_rows: int | None, labels: int, columns: TableColumns) -> None:
    """The chunks and revealed labels asked of ``check`` are possible."""
    if chunk_rows is not None and chunk_rows < 1:
        raise UserError("--chunk-size must be at least 1 row")
    if labels < 0:
        raise UserError("--labels must be 0 or more")
    if labels and columns.label is None:
        raise UserError("--labels reveals true labels of the data: the table has no label column (--label-column)")


@dataclass(frozen=True)
class _TableCheck:
    """What judges a production table's batches: the bundle, its compiled oracle and estimators'
    calibration, and the file (named in the user's mistakes)."""

    bundle: Bundle
    oracle: CompiledOracle
    cal: EstimatorCalibration
    path: str | Path

    def part(self, part: TableBatch) -> _JudgedPart:
        """One batch judged: its statistics, verdicts, labels and top-class probabilities."""
        n_classes = len(self.bundle.classes)
        if part.probabilities.shape[1] != n_classes:
            raise UserError(
                f"{self.path}: {part.probabilities.shape[1]} classes of probabilities; the bundle has {n_classes}"
            )
        predicted = predicted_classes_of(part.probabilities, self.bundle.decision_threshold)
        result, rules = self.oracle.judge_with_rules(
            part.x,
            part.probabilities,
            predicted,
            metadata=part.metadata or None,
            feature_names=self.bundle.feature_names,
        )
        verdicts = np.asarray(result.verdict, dtype=np.int8)
        conf = label_confidences(part.probabilities, predicted)
        stats = WindowStats.from_batch(
            verdicts,
            conf,
            self.cal,
            probabilities=part.probabilities,
            labels=predicted,
            features=part.x,
            tdi_rules=rules,
        )
        wrong, none, truth = _labeled(part, self.bundle, self.cal, predicted, rules)
        return _JudgedPart(stats, verdicts, wrong, none, truth, conf)


@dataclass(frozen=True)
class _JudgedPart:
    """A judged batch: what its tallies add up (:meth:`Tally.add`), and its top-class probabilities (what
    the revealed labels keep)."""

    stats: WindowStats
    verdicts: np.ndarray
    wrong: np.ndarray | None
    none: int
    truth: tuple[list[int], list[int]] | None
    conf: np.ndarray

    def into(self, tally: Tally) -> None:
        tally.add(self.stats, self.verdicts, self.wrong, self.none, self.truth)


def _tallied(
    judge: _TableCheck,
    batches: Iterator[TableBatch],
    chunk_rows: int | None,
    labels: int,
    seed: int,
) -> tuple[Tally, list[Tally]]:
    """The whole table's tally and each chunk's (none without ``chunk_rows``), their revealed labels drawn."""
    total = Tally(revealed=_Reservoir(labels, seed, 0) if labels else None)
    chunks: list[Tally] = []
    for new_chunk, part in _slices(batches, chunk_rows):
        judged = judge.part(part)
        judged.into(total)
        if chunk_rows is not None:
            if new_chunk:
                revealed = _Reservoir(labels, seed, len(chunks) + 1) if labels else None
                chunks.append(Tally(start=total.n - len(part), revealed=revealed))
            judged.into(chunks[-1])
        if labels:
            if judged.wrong is None:
                raise UserError(f"{judge.path}: --labels needs every row labeled; a batch has no labels")
            for tally in (total, *chunks[-1:]):
                assert tally.revealed is not None
                tally.revealed.add(judged.conf, ~judged.wrong)
    if total.stats is None:
        raise UserError(f"{judge.path}: the table has no rows")
    return total, chunks


def check_table_report(
    bundle: Bundle,
    path: str | Path,
    columns: TableColumns,
    *,
    chunk_rows: int | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    limits: DataLimits | None = None,
    labels: int = 0,
    seed: int = 0,
) -> dict[str, Any]:
    """Verdicts, every estimate and the segments for a production table, read ``batch_rows`` at a time; the
    truth (per segment too) and the oracle's TPR/FPR/F1 when it has labels. ``chunk_rows`` adds the same per
    chunk of rows (NannyML's size-based chunking): ``chunks`` in the report. ``limits`` bound the file's
    columns and rows and one batch's bytes, not the file's length. ``labels`` > 0 reveals that many true
    labels, drawn uniformly (seeded by ``seed``) from the whole table and, separately, from each chunk, and
    reports the label-assisted estimate ``with_labels`` from them (prediction-powered inference)."""
    _asked(chunk_rows, labels, columns)
    cal = EstimatorCalibration.from_dict(bundle.estimator_calibration)
    judge = _TableCheck(bundle, CompiledOracle(bundle.oracle(), len(columns.features), len(bundle.classes)), cal, path)
    headline = headline_estimator(bundle.headline, with_model=False)
    batches = iter_table(path, columns, batch_rows=batch_rows, desc="check", limits=limits)
    total, chunks = _tallied(judge, batches, chunk_rows, labels, seed)
    report = {
        "n": total.n,
        "model": {"table": bundle.table.to_dict() if bundle.table else None, "sha256": bundle.model_sha256},
        **{k: v for k, v in total.report(cal, headline).items() if k != "n"},
        **evidence_section(cal.headline, shift_aware=False),
    }
    if bundle.decision_threshold is not None:
        report["decision_threshold"] = bundle.decision_threshold
    if chunk_rows is not None:
        report["chunk_size"] = chunk_rows
        report["chunks"] = [{"start": c.start, "end": c.start + c.n, **c.report(cal, headline)} for c in chunks]
    return report
