"""``check --challenger`` cut into windows: beside :class:`~agent.offline.windowed.Windowed` (the champion), the
challenger judges every batch too, and each window adds up the pair's sums and the challenger's statistics in a
:class:`~agent.offline.paired_check.PairedTally` (additive, as the champion's), estimated once per window by
:func:`~agent.results.paired.paired_entry`, as an agent estimates its challenger's windows."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agent.errors import UserError
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import headline_estimator
from agent.estimation.pairs.calibration import pair_of_bundle
from agent.estimation.statistics.window import WindowStats
from agent.model.classifier import OnnxClassifier
from agent.offline.check import judge
from agent.offline.paired_check import PairedTally
from agent.offline.windowed import Added, Windowed
from agent.results.paired import PairedEntry, PairedModel, paired_entry
from invariants.bundle import Bundle


@dataclass
class WindowedPair:
    """The challenger (``model`` and its ``bundle``, fitted as the challenger of ``champion``'s model) per window
    of ``champion``."""

    champion: Windowed
    model: OnnxClassifier
    bundle: Bundle
    windows: dict[int, PairedTally] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.champion.model is None:
            raise UserError("a challenger is compared with a model: this bundle was fitted from logged predictions")
        try:
            self.pair = pair_of_bundle(self.bundle.pair, self.champion.model.sha256)
        except ValueError as exc:
            raise UserError(f"challenger bundle: {exc}") from None
        self.calibration = EstimatorCalibration.from_dict(self.bundle.estimator_calibration)
        self.headline = headline_estimator(self.bundle.headline)
        self.total = PairedTally(self.pair)

    def add(self, rows_x: object, metadata: dict[str, np.ndarray] | None, added: Added) -> None:
        """The challenger's judgement of the batch the champion judged (``added``), row by row into its windows."""
        judged = judge(self.model, self.bundle, rows_x, metadata)
        a, b = added.judged.prediction, judged.prediction
        verdicts = np.asarray(judged.result.verdict, dtype=np.int8)

        def into(tally: PairedTally, idx: np.ndarray | None) -> None:
            def part(v: np.ndarray | None) -> np.ndarray | None:
                return v if v is None or idx is None else v[idx]

            stats = WindowStats.from_batch(
                np.asarray(part(verdicts)),
                np.asarray(part(b.confidences)),
                self.calibration,
                probabilities=part(b.probabilities),
                labels=part(b.predicted),
                features=part(judged.features),
                tdi_rules=part(judged.tdi_rules),
            )
            tally.add(
                (np.asarray(part(a.probabilities)), np.asarray(part(a.predicted))),
                (np.asarray(part(b.probabilities)), np.asarray(part(b.predicted))),
                stats,
                part(added.y),
            )

        into(self.total, None)
        for key in np.unique(added.keys).tolist():
            idx = np.flatnonzero(added.keys == key)
            into(self.windows.setdefault(int(key), PairedTally(self.pair)), None if len(idx) == len(verdicts) else idx)

    def entry(self, name: str, key: int | None) -> PairedEntry:
        """Window ``key`` (None: every row) of the pair, estimated once."""
        tally = self.total if key is None else self.windows[key]
        champion = self.champion.total if key is None else self.champion.windows[key]
        assert champion.stats is not None
        return paired_entry(
            name,
            tally.sums,
            self.pair,
            (champion.stats, PairedModel(self.champion.calibration, self.champion.headline)),
            (tally.challenger, PairedModel(self.calibration, self.headline)),
        )
