"""Why a bundle's headline estimator is its headline: the evidence recorded at ``fit`` (JSON-able).

:func:`agent.offline.calibration.estimators.headline_choice.choose_headline` measures every label-free estimator on
windows of held-out reference rows under simulated shifts (:mod:`agent.offline.calibration.shift_windows`)
and keeps its choice and the figures it rests on here. The bundle stores it in its estimator
calibration (``estimator_calibration.headline``), and ``check`` and ``GET /v1/estimates`` show it next
to the headline. Bundles fitted before it have none and keep the headline their manifest names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The criterion the choice minimises (:mod:`agent.offline.calibration.estimators.headline_choice`).
CRITERION = "largest over kinds of shift of the mean absolute error relative to the best estimator's in that kind"


@dataclass(frozen=True)
class EstimatorErrors:
    """One estimator's absolute errors on the simulated windows: their ``mean``, the largest (``worst``),
    the mean per kind of window (``by_kind``) and its largest (``worst_kind``); ``ratio``: the choice's
    criterion (NaN for an estimator not eligible)."""

    mean: float
    worst: float
    by_kind: Mapping[str, float]
    ratio: float = float("nan")

    @property
    def worst_kind(self) -> float:
        return max(self.by_kind.values(), default=self.mean)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean,
            "worst": self.worst,
            "worst_kind": self.worst_kind,
            "by_kind": dict(self.by_kind),
            "ratio": None if math.isnan(self.ratio) else self.ratio,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EstimatorErrors:
        return cls(
            mean=float(d["mean"]),
            worst=float(d["worst"]),
            by_kind={str(k): float(v) for k, v in dict(d.get("by_kind") or {}).items()},
            ratio=float("nan") if d.get("ratio") is None else float(d["ratio"]),
        )


@dataclass(frozen=True)
class HeadlineEvidence:
    """The headline's choice and what it rests on.

    ``chosen``: the headline estimator; ``default``: the one kept unless the evidence favours another
    (``shift_aware`` where the bundle has it, else ``cbpe``); ``best``: the candidate with the lowest
    criterion; ``support``: the share of bootstrap resamples of the windows in which ``best`` had a
    lower criterion than ``default`` (1 when they are the same);
    ``windows``/``window_size``/``rows``/``folds``/``seed``: how the windows were drawn
    (``rows``: held-out rows they come from, in ``folds`` folds, each estimated by estimators
    calibrated on the other folds); ``kinds``: windows per kind of shift; ``errors``: every candidate's
    :class:`EstimatorErrors`; ``reason``: the choice in one sentence.
    """

    chosen: str
    default: str
    best: str
    support: float
    windows: int
    window_size: int
    rows: int
    folds: int
    seed: int
    kinds: Mapping[str, int]
    errors: Mapping[str, EstimatorErrors]
    reason: str
    criterion: str = CRITERION
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "default": self.default,
            "best": self.best,
            "criterion": self.criterion,
            "support": self.support,
            "windows": self.windows,
            "window_size": self.window_size,
            "rows": self.rows,
            "folds": self.folds,
            "seed": self.seed,
            "kinds": dict(self.kinds),
            "errors": {k: v.to_dict() for k, v in self.errors.items()},
            "reason": self.reason,
            **({"notes": list(self.notes)} if self.notes else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HeadlineEvidence:
        errors = {str(k): EstimatorErrors.from_dict(v) for k, v in dict(d["errors"]).items()}
        chosen = str(d["chosen"])
        if chosen not in errors:
            raise ValueError(f"headline evidence chooses {chosen!r} but measured {sorted(errors)}")
        return cls(
            chosen=chosen,
            default=str(d["default"]),
            best=str(d.get("best", chosen)),
            support=float(d["support"]),
            windows=int(d["windows"]),
            window_size=int(d["window_size"]),
            rows=int(d["rows"]),
            folds=int(d["folds"]),
            seed=int(d["seed"]),
            kinds={str(k): int(v) for k, v in dict(d["kinds"]).items()},
            errors=errors,
            reason=str(d["reason"]),
            criterion=str(d.get("criterion", CRITERION)),
            notes=tuple(str(v) for v in d.get("notes") or ()),
        )


#: Why a bundle's headline comes without evidence.
NO_EVIDENCE_MODEL = (
    "the bundle was fitted before headlines were chosen from evidence, or from too few calibration rows to choose "
    "on; shift_aware, calibrated on corrupted copies of the calibration split, is its headline"
)
NO_EVIDENCE_TABLE = (
    "the bundle was fitted before headlines were chosen from evidence, or from too few calibration rows to choose on"
)


def evidence_section(evidence: HeadlineEvidence | None, *, shift_aware: bool) -> dict[str, Any]:
    """The ``headline_evidence`` entry of ``check --json`` and ``GET /v1/estimates``: the evidence's
    JSON, or None and ``headline_note`` saying why there is none (``shift_aware``: the bundle has the
    ``shift_aware`` calibration, so it was fitted with a model)."""
    if evidence is None:
        return {"headline_evidence": None, "headline_note": NO_EVIDENCE_MODEL if shift_aware else NO_EVIDENCE_TABLE}
    return {"headline_evidence": evidence.to_dict()}
