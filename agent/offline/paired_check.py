"""``icos-agent check --challenger``: two versions of a model compared offline on one data set, the
``challenger`` section of the report.

Every row is paired: the champion's predictions (judged by its bundle, :func:`agent.offline.check.check_report`)
and the challenger's on the same inputs, judged by the challenger's bundle, whose ``pair`` calibration
(``fit --champion``) gives the label-free difference (:mod:`agent.estimation.pairs.paired`). With ``--labels N``,
``N`` disagreements are drawn uniformly (seeded) and their true labels revealed, as a live labeling sample
that prefers the disagreements would: the label-assisted difference. With labeled data the true difference
and each version's true accuracy are reported too.

A table of predictions (bundles fitted from tables) carries the challenger's predictions as another set of
probability columns: by default those its bundle was fitted on (``--challenger-proba-columns`` to name
others); the table is read batch by batch, both column sets side by side.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.data.limits import DataLimits
from agent.data.tables import TableBatch, TableColumns, iter_table
from agent.errors import UserError
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import headline_estimator
from agent.estimation.pairs.calibration import PairCalibration, pair_of_bundle
from agent.estimation.pairs.paired import PairSums
from agent.estimation.statistics.window import WindowStats
from agent.model.classifier import label_confidences, predicted_classes_of
from agent.offline.check_companions import CheckedBatch
from agent.results.paired import PairedModel, paired_entry
from invariants.bundle import Bundle
from invariants.compiled import CompiledOracle


def _challenger_pair(bundle: Bundle, where: str, champion_sha256: str | None) -> PairCalibration:
    """The comparison a challenger's bundle holds, checked against the champion; a :class:`UserError` naming
    the bundle otherwise."""
    try:
        return pair_of_bundle(bundle.pair, champion_sha256)
    except ValueError as exc:
        raise UserError(f"challenger bundle {where}: {exc}") from None


@dataclass
class _Disagreements:
    """A uniform sample of at most ``k`` disagreements of a stream (reservoir sampling): each one's ``g``
    and, revealed, its outcome ``d``."""

    k: int
    seed: int
    seen: int = 0
    g: list[float] = field(default_factory=list)
    d: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng([self.seed, 7])

    def add(self, g: np.ndarray, d: np.ndarray) -> None:
        for gi, di in zip(g.tolist(), d.tolist(), strict=True):
            if len(self.g) < self.k:
                self.g.append(gi)
                self.d.append(di)
            else:
                slot = int(self.rng.integers(0, self.seen + 1))
                if slot < self.k:
                    self.g[slot], self.d[slot] = gi, di
            self.seen += 1

    def sums(self) -> PairSums:
        """The labeled sums: each of the ``m`` sampled disagreements of ``n_D`` drawn with ``π = m / n_D``."""
        m = len(self.g)
        if not m:
            return PairSums()
        return PairSums.of_labeled(np.asarray(self.g), np.asarray(self.d), np.full(m, m / self.seen))


@dataclass
class PairedTally:
    """What a paired check adds up, batch by batch: the challenger's statistics, the pair's sums, the true
    outcomes when labeled, and the disagreements whose labels ``--labels`` reveals."""

    pair: PairCalibration
    labels: int = 0
    seed: int = 0
    challenger: WindowStats = field(default_factory=WindowStats)
    sums: PairSums = field(default_factory=PairSums)
    right: np.ndarray = field(default_factory=lambda: np.zeros(2, dtype=np.int64))
    labeled: int = 0
    drawn: _Disagreements | None = None

    def __post_init__(self) -> None:
        if self.labels:
            self.drawn = _Disagreements(self.labels, self.seed)

    def add(
        self,
        champion: tuple[np.ndarray, np.ndarray],
        challenger: tuple[np.ndarray, np.ndarray],
        challenger_stats: WindowStats,
        y: np.ndarray | None,
    ) -> None:
        """A batch: each version's probabilities and predicted classes, the challenger's statistics, the
        true classes (None: unlabeled)."""
        (pa, la), (pb, lb) = champion, challenger
        dis = self.pair.disagreements(pa, pb, la, lb)
        self.sums = self.sums + PairSums.of_disagreements(len(pa), dis)
        self.challenger = self.challenger + challenger_stats
        if y is None:
            return
        self.right += [int((la == y).sum()), int((lb == y).sum())]
        self.labeled += len(y)
        if self.drawn is not None:
            d = (lb[dis.rows] == y[dis.rows]).astype(np.float64) - (la[dis.rows] == y[dis.rows]).astype(np.float64)
            self.drawn.add(dis.g, d)

    def report(
        self,
        info: Mapping[str, Any],
        champion: tuple[WindowStats, PairedModel],
        challenger: PairedModel,
    ) -> dict[str, Any]:
        """The ``challenger`` section: what it is (``info``), the paired window of the whole data set, and the
        truth when every row is labeled."""
        sums = self.sums + (self.drawn.sums() if self.drawn is not None else PairSums())
        entry = paired_entry("all", sums, self.pair, champion, (self.challenger, challenger))
        out: dict[str, Any] = {**info, **entry.to_json(decimals=None)}
        if self.drawn is not None:
            for d in (out.get("difference"), out["differences"].get("with_labels")):
                if isinstance(d, dict) and "n_labels" in d:
                    d["seed"] = self.seed
        if self.labeled and self.labeled == sums.n:
            acc_a, acc_b = (float(r) / self.labeled for r in self.right)
            out["truth"] = {"difference": acc_b - acc_a, "champion": acc_a, "challenger": acc_b}
        return out


def _pair_info(name: str, sha256: str | None, pair: PairCalibration) -> dict[str, Any]:
    return {
        "model": {"name": name, "sha256": sha256},
        "calibration": {
            "corrupted_sets": pair.corrupted_sets,
            "rows": pair.rows,
            "disagreement_rate": pair.disagreement_rate,
            "model_error": list(pair.error),
            "level": pair.level,
        },
    }


def _challenger_stats(bundle: Bundle, cal: EstimatorCalibration, judged: Any) -> WindowStats:
    pred = judged.prediction
    return WindowStats.from_batch(
        judged.result.verdict,
        pred.confidences,
        cal,
        probabilities=pred.probabilities,
        labels=pred.predicted,
        features=judged.features,
        tdi_rules=judged.tdi_rules,
    )


@dataclass(frozen=True)
class ChallengerCheck:
    """The challenger of ``check --challenger``: its model and bundle (and ``judge``, the function that
    predicts and judges a batch with them, :func:`agent.offline.check.judge`)."""

    model: Any
    bundle: Bundle
    where: str

    def report(self, batch: CheckedBatch) -> dict[str, Any]:
        """The ``challenger`` section of a model check (module docstring)."""
        pair = _challenger_pair(self.bundle, self.where, batch.champion_sha256)
        cal = EstimatorCalibration.from_dict(self.bundle.estimator_calibration)
        metadata = batch.metadata
        judged = batch.judge(self.model, self.bundle, batch.x, dict(metadata) if metadata else None)
        pred_a, stats_a, model_a = batch.champion
        pred_b = judged.prediction
        tally = PairedTally(pair, batch.labels, batch.seed)
        tally.add(
            (pred_a.probabilities, pred_a.predicted),
            (pred_b.probabilities, pred_b.predicted),
            _challenger_stats(self.bundle, cal, judged),
            batch.y,
        )
        model_b = PairedModel(cal, headline_estimator(self.bundle.headline))
        return tally.report(_pair_info(self.model.name, self.model.sha256, pair), (stats_a, model_a), model_b)

    def sections(self, batch: CheckedBatch) -> Mapping[str, Any]:
        """Its section of a model check, as a check companion (:mod:`agent.offline.check_companions`)."""
        return {"challenger": self.report(batch)}


def _zipped(
    path: str | Path,
    champion: TableColumns,
    challenger: TableColumns,
    batch_rows: int,
    limits: DataLimits | None,
) -> Iterator[tuple[TableBatch, TableBatch]]:
    """The table read twice side by side: the champion's columns and the challenger's, batch by batch."""
    a = iter_table(path, champion, batch_rows=batch_rows, desc="check champion", limits=limits)
    b = iter_table(path, challenger, batch_rows=batch_rows, desc="check challenger", limits=limits)
    yield from zip(a, b, strict=True)


def check_table_pair(
    champion_bundle: Bundle,
    challenger_bundle: Bundle,
    where: str,
    path: str | Path,
    champion_columns: TableColumns,
    challenger_proba: Sequence[str] | None,
    *,
    batch_rows: int,
    limits: DataLimits | None,
    labels: int,
    seed: int,
) -> dict[str, Any]:
    """The ``challenger`` section of a table check: the table's champion columns (``champion_columns``, as
    the champion's check reads them) and the challenger's probability columns (``challenger_proba``, by
    default those its bundle was fitted on) with the challenger bundle's features."""
    table = challenger_bundle.table
    if table is None:
        raise UserError(f"challenger bundle {where} was fitted from an ONNX model: give --challenger MODEL")
    pair = _challenger_pair(challenger_bundle, where, None)
    proba = tuple(challenger_proba or table.proba_columns)
    cols_b = TableColumns(proba, tuple(table.feature_columns), champion_columns.label, champion_columns.metadata)
    judges = [
        _TableJudge.of(b, len(c.features))
        for b, c in ((champion_bundle, champion_columns), (challenger_bundle, cols_b))
    ]
    tally = PairedTally(pair, labels, seed)
    stats_a = WindowStats()
    for part_a, part_b in _zipped(path, champion_columns, cols_b, batch_rows, limits):
        (sa, la), (sb, lb) = judges[0].stats(part_a), judges[1].stats(part_b)
        y = None if part_b.y is None else _indices(part_b.y, challenger_bundle.classes)
        tally.add((part_a.probabilities, la), (part_b.probabilities, lb), sb, y)
        stats_a = stats_a + sa
    info = _pair_info(Path(where).name, None, pair)
    info["model"] = {"table": table.to_dict(), "proba_columns": list(proba)}
    return tally.report(info, (stats_a, judges[0].model), judges[1].model)


@dataclass(frozen=True)
class _TableJudge:
    """One version's bundle judging a table's batches."""

    bundle: Bundle
    oracle: CompiledOracle
    model: PairedModel

    @classmethod
    def of(cls, bundle: Bundle, n_features: int) -> _TableJudge:
        cal = EstimatorCalibration.from_dict(bundle.estimator_calibration)
        headline = headline_estimator(bundle.headline, with_model=False)
        return cls(bundle, CompiledOracle(bundle.oracle(), n_features, len(bundle.classes)), PairedModel(cal, headline))

    def stats(self, part: TableBatch) -> tuple[WindowStats, np.ndarray]:
        """The batch's statistics as this bundle judges it, and its predicted classes."""
        b = self.bundle
        if part.probabilities.shape[1] != len(b.classes):
            raise UserError(
                f"{part.probabilities.shape[1]} probability columns; the bundle has {len(b.classes)} classes"
            )
        predicted = predicted_classes_of(part.probabilities, b.decision_threshold)
        result, rules = self.oracle.judge_with_rules(
            part.x, part.probabilities, predicted, metadata=part.metadata or None, feature_names=b.feature_names
        )
        stats = WindowStats.from_batch(
            np.asarray(result.verdict, dtype=np.int8),
            label_confidences(part.probabilities, predicted),
            self.model.calibration,
            probabilities=part.probabilities,
            labels=predicted,
            features=part.x,
            tdi_rules=rules,
        )
        return stats, predicted


def _indices(y: np.ndarray, classes: Sequence[str]) -> np.ndarray:
    """The labels as class indices; ``__none__`` (none of the classes) counts as wrong for both versions."""
    from agent.data.files import label_indices

    return label_indices(y, list(classes), allow_none=True)
