"""The ordered ICOS oracle surrogate (paper §4.1) and its calibration metrics (§5.3).

ICOS checks a prediction against the input-data-dependent, then the training-data-dependent,
then the algorithm-dependent invariants; the first violation decides the outcome *fail* and
the remaining families are neglected ("When a failure is detected by one type of invariant,
the remaining ones are neglected"). Without any violation the outcome is *pass*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the oracle holds its parts; what reads only its verdicts loads none of them
    from invariants.adi import AlgorithmInvariants
    from invariants.idi import IdiRuleSet
    from invariants.tdi import TrainingInvariants

__all__ = ["FAMILIES", "VERDICTS", "Oracle", "OracleCalibration", "OracleResult", "Verdict", "calibrate"]


class Verdict(IntEnum):
    """The oracle's outcome for one prediction; the value is its int8 code in :class:`OracleResult`,
    stores and windows, in the order the families are checked."""

    PASS = 0
    IDI = 1
    TDI = 2
    ADI = 3

    @property
    def family(self) -> str:
        """The invariant family that failed the prediction (``"none"`` on pass)."""
        return "none" if self is Verdict.PASS else self.name.lower()

    @property
    def outcome(self) -> str:
        """``"pass"`` or ``"fail"``."""
        return "pass" if self is Verdict.PASS else "fail"

    @property
    def label(self) -> str:
        """The verdict's name in reports and JSON: ``"pass"`` or ``"fail:<family>"``."""
        return "pass" if self is Verdict.PASS else f"fail:{self.family}"


#: Verdict labels indexed by code.
VERDICTS: tuple[str, ...] = tuple(v.label for v in Verdict)
#: The invariant families in the order they are checked.
FAMILIES: tuple[str, ...] = tuple(v.family for v in Verdict if v is not Verdict.PASS)
_ADI_TEXT = "fail :- random forest over the probability vector predicts a misprediction (ADI)"


@dataclass
class OracleResult:
    """Per-sample outcome: ``verdict`` indexes :data:`VERDICTS` (int8 [N]); ``rule`` is the
    index of the violated rule within its family, -1 on pass (int32 [N]; 0 for the ADI forest)."""

    verdict: np.ndarray
    rule: np.ndarray

    @property
    def failed(self) -> np.ndarray:
        return np.asarray(self.verdict) != Verdict.PASS

    def names(self) -> list[str]:
        return [VERDICTS[v] for v in np.asarray(self.verdict).tolist()]

    def counts(self) -> dict[str, int]:
        tally = np.bincount(np.asarray(self.verdict, dtype=np.int64), minlength=len(VERDICTS))
        return {name: int(tally[i]) for i, name in enumerate(VERDICTS)}

    def __len__(self) -> int:
        return int(np.asarray(self.verdict).shape[0])


class Oracle:
    """IDI, then TDI, then ADI; each family may be absent."""

    def __init__(
        self,
        idi: IdiRuleSet | None,
        tdi: TrainingInvariants | None,
        adi: AlgorithmInvariants | None,
    ) -> None:
        self.idi = idi
        self.tdi = tdi
        self.adi = adi

    def judge(
        self,
        features: np.ndarray | None,
        probabilities: np.ndarray,
        predicted: np.ndarray,
        metadata: Mapping[str, Sequence[Any] | np.ndarray | Any] | None = None,
        feature_names: Sequence[str] | None = None,
    ) -> OracleResult:
        """Judge N predictions.

        ``features`` is the model input flattened to [N, D] (float32; needed by TDIs and by
        feature-based IDIs), ``probabilities`` the model's output [N, K], ``predicted`` its
        predicted class per sample. Later families only see the samples still passing.
        """
        predicted = np.asarray(predicted).reshape(-1).astype(np.int64)
        n = predicted.shape[0]
        verdict = np.zeros(n, dtype=np.int8)
        rule = np.full(n, -1, dtype=np.int32)
        if n == 0:
            return OracleResult(verdict, rule)
        flat: np.ndarray | None = None
        if features is not None:
            flat = np.asarray(features)
            flat = flat.reshape(flat.shape[0], -1)
            if flat.shape[0] != n:
                raise ValueError(f"{flat.shape[0]} inputs but {n} predicted")
        probs = np.asarray(probabilities)
        if probs.shape[0] != n:
            raise ValueError(f"{probs.shape[0]} probability vectors but {n} predicted")

        if self.idi is not None and self.idi.rules:
            fired = self.idi.evaluate(predicted, metadata, flat, feature_names)
            hit = fired >= 0
            verdict[hit] = Verdict.IDI
            rule[hit] = fired[hit]
        if self.tdi is not None:
            if flat is None:
                raise ValueError("training-data-dependent invariants need the input features")
            todo = np.flatnonzero(verdict == Verdict.PASS)
            if todo.size:
                fired = self.tdi.evaluate(flat[todo], predicted[todo])
                hit = fired >= 0
                verdict[todo[hit]] = Verdict.TDI
                rule[todo[hit]] = fired[hit]
        if self.adi is not None:
            todo = np.flatnonzero(verdict == Verdict.PASS)
            if todo.size:
                wrong = self.adi.evaluate(probs[todo])
                verdict[todo[wrong]] = Verdict.ADI
                rule[todo[wrong]] = 0
        return OracleResult(verdict, rule)

    def describe(self, result: OracleResult, i: int) -> str:
        """The clause that decided sample ``i`` (``"pass"`` when none fired)."""
        verdict, index = int(result.verdict[i]), int(result.rule[i])
        if verdict == Verdict.PASS:
            return Verdict.PASS.label
        if verdict == Verdict.IDI and self.idi is not None:
            return self.idi.describe(index)
        if verdict == Verdict.TDI and self.tdi is not None:
            return self.tdi.rules[index].text
        if verdict == Verdict.ADI:
            return _ADI_TEXT
        return VERDICTS[verdict]


@dataclass
class OracleCalibration:
    """Confusion counts of the oracle against the truth (paper §5.3), a positive being a *fail*.

    ``tpr = tp / (tp + fn)`` and ``fpr = fp / (fp + tn)``; a zero denominator gives 0.0 and
    the counts show why. ``per_family`` holds ``{"tp", "fp"}`` for each of :data:`FAMILIES`.
    """

    tpr: float
    fpr: float
    tp: int
    fp: int
    tn: int
    fn: int
    n: int
    per_family: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def f1(self) -> float:
        """``2 tp / (2 tp + fn + fp)``, 0.0 when nothing is positive."""
        denominator = 2 * self.tp + self.fn + self.fp
        return 2 * self.tp / denominator if denominator else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "tpr": self.tpr,
            "fpr": self.fpr,
            "f1": self.f1,
            "tp": self.tp,
            "fp": self.fp,
            "tn": self.tn,
            "fn": self.fn,
            "n": self.n,
            "per_family": {k: dict(v) for k, v in self.per_family.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OracleCalibration:
        """Inverse of :meth:`to_dict` (``f1`` is derived, not read); ``ValueError`` when malformed."""
        try:
            per_family = {str(k): {"tp": int(v["tp"]), "fp": int(v["fp"])} for k, v in dict(data["per_family"]).items()}
            out = cls(
                tpr=float(data["tpr"]),
                fpr=float(data["fpr"]),
                tp=int(data["tp"]),
                fp=int(data["fp"]),
                tn=int(data["tn"]),
                fn=int(data["fn"]),
                n=int(data["n"]),
                per_family=per_family,
            )
        except KeyError as exc:
            raise ValueError(f"calibration is missing {exc.args[0]!r}") from exc
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed calibration ({exc})") from exc
        if min(out.tp, out.fp, out.tn, out.fn) < 0 or out.tp + out.fp + out.tn + out.fn != out.n:
            raise ValueError("calibration counts are inconsistent")
        if not (0.0 <= out.tpr <= 1.0 and 0.0 <= out.fpr <= 1.0):
            raise ValueError("calibration rates must lie in [0, 1]")
        return out


def calibrate(result: OracleResult, wrong: np.ndarray) -> OracleCalibration:
    """TPR/FPR (and F1) of the oracle's *fail* against the true mispredictions ``wrong``."""
    failed = result.failed
    truth = np.asarray(wrong).reshape(-1).astype(bool)
    if truth.shape != failed.shape:
        raise ValueError(f"{failed.shape[0]} verdicts but {truth.shape[0]} truth flags")
    tp = int(np.count_nonzero(failed & truth))
    fp = int(np.count_nonzero(failed & ~truth))
    tn = int(np.count_nonzero(~failed & ~truth))
    fn = int(np.count_nonzero(~failed & truth))
    verdict = np.asarray(result.verdict)
    per_family = {
        v.family: {
            "tp": int(np.count_nonzero((verdict == v) & truth)),
            "fp": int(np.count_nonzero((verdict == v) & ~truth)),
        }
        for v in Verdict
        if v is not Verdict.PASS
    }
    return OracleCalibration(
        tpr=tp / (tp + fn) if tp + fn else 0.0,
        fpr=fp / (fp + tn) if fp + tn else 0.0,
        tp=tp,
        fp=fp,
        tn=tn,
        fn=fn,
        n=int(truth.shape[0]),
        per_family=per_family,
    )
