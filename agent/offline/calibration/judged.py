"""One labeled calibration set as the estimators' calibration reads it: judged by the oracle, with the
model's confidence, whether each prediction was right, and the per-sample inputs of ``shift_aware``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from agent.estimation.statistics.reference import InputReference
from agent.estimation.statistics.window import SampleExtras
from agent.offline.viewing import Viewed
from invariants.oracle import Oracle


@dataclass(frozen=True)
class JudgedSet:
    """One labeled calibration set: oracle verdicts, top-class probabilities, correctness, true
    classes (for label-shift resampling) and the optional per-sample inputs of the full model."""

    name: str
    verdicts: np.ndarray
    confidences: np.ndarray
    correct: np.ndarray
    y: np.ndarray | None = None
    extras: SampleExtras | None = None

    def take(self, idx: np.ndarray) -> JudgedSet:
        """The same set restricted to the rows ``idx``."""
        return JudgedSet(
            self.name,
            np.asarray(self.verdicts)[idx],
            np.asarray(self.confidences)[idx],
            np.asarray(self.correct)[idx],
            None if self.y is None else np.asarray(self.y)[idx],
            None if self.extras is None else self.extras.take(idx),
        )


def judge_set(
    name: str,
    viewed: Viewed,
    y: np.ndarray,
    oracle: Oracle,
    reference: InputReference,
    *,
    metadata: Mapping[str, np.ndarray] | None = None,
    feature_names: Sequence[str] | None = None,
) -> JudgedSet:
    """The model's view of one (clean or corrupted) copy of the calibration split, judged by ``oracle``
    and labeled with its true classes ``y``. ``metadata`` (IDI fields of the calibration samples) holds for
    every copy, since a corruption does not change where an input comes from; the values the rules read
    of named inputs come with the (corrupted) view."""
    pred, feats = viewed.prediction, viewed.features
    meta = {**(metadata or {}), **viewed.rule_values}
    result = oracle.judge(feats, pred.probabilities, pred.predicted, metadata=meta or None, feature_names=feature_names)
    tdi = oracle.tdi
    rules = tdi.rule_index(feats) if tdi is not None else np.zeros(len(feats), dtype=np.int64)
    extras = SampleExtras.compute(pred.probabilities, pred.predicted, feats, rules, reference)
    return JudgedSet(name, result.verdict, pred.confidences, pred.predicted == y, np.asarray(y), extras)
