"""What the bundle says about every window, as a result: the headline estimator and the evidence it was
chosen on, the oracle's TPR/FPR on the calibration split and the model's accuracy there (what the relative
alerts compare the headline with, ``icos_reference_accuracy_ratio``) — the same in ``/v1/estimates``, the
fleet's document, the metrics and the line ``check`` prints of the headline's choice."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.evidence import evidence_section


def evidence_lines(doc: Mapping[str, Any]) -> list[str]:
    """Why the headline is the headline, from a document's ``headline_evidence`` (none: no line)."""
    evidence = doc.get("headline_evidence")
    if not isinstance(evidence, dict):
        return []
    return [f"headline {evidence['chosen']} (chosen at fit on simulated shifts): {evidence['reason']}"]


@dataclass(frozen=True)
class BundlePoints:
    """The bundle's figures as the estimates collectors export them."""

    oracle_tpr: float
    oracle_fpr: float
    calibration_wrong: int
    calibration_right: int
    reference_accuracy: float


@dataclass(frozen=True)
class BundleSection:
    """The bundle's ``headline`` estimator and its ``calibration``."""

    headline: str
    calibration: EstimatorCalibration

    def to_json(self) -> dict[str, Any]:
        """The bundle's entries of a document: ``headline``, ``headline_evidence`` (or ``headline_note``),
        ``oracle`` and ``reference``."""
        cal = self.calibration
        return {
            "headline": self.headline,
            **evidence_section(cal.headline, shift_aware=cal.shift is not None),
            "oracle": {"tpr": cal.tpr, "fpr": cal.fpr},
            "reference": {"accuracy": cal.accuracy},
        }

    def to_text(self) -> list[str]:
        """The line ``check`` prints of the headline's choice (none without evidence)."""
        return evidence_lines(self.to_json())

    def points(self) -> BundlePoints:
        cal = self.calibration
        return BundlePoints(cal.tpr, cal.fpr, cal.n_wrong, cal.n_right, cal.accuracy)

    def to_row(self) -> dict[str, Any]:
        """One flat row: the headline estimator, the oracle's TPR/FPR and the reference accuracy."""
        cal = self.calibration
        return {"headline": self.headline, "oracle_tpr": cal.tpr, "oracle_fpr": cal.fpr, "reference": cal.accuracy}
