"""When an estimate says too little to be read as a number: reports mark it ``unreliable`` with the reason
instead of showing it as if it were as good as the others.

* an interval wider than :data:`WIDE_INTERVAL` (the estimate could be almost anything: ``icos_corrected``
  under a weak oracle gives ``0.069 [0.000, 0.575]``);
* the estimators that rest on the oracle's verdicts (their spec's ``needs_oracle``: ``icos`` and
  ``icos_corrected``) when the oracle separates right from wrong predictions poorly on the calibration
  split (TPR − FPR below :data:`WEAK_ORACLE`): the share of failures then says little about the accuracy,
  whatever its interval.
"""

from __future__ import annotations

from agent.estimation.estimators.calibrated import EstimatesCalibration
from agent.estimation.estimators.registry import REGISTRY
from agent.estimation.intervals import Estimate

#: Intervals wider than this say too little to be read as an estimate.
WIDE_INTERVAL = 0.5
#: An oracle whose TPR − FPR on the calibration split is below this separates right from wrong poorly.
WEAK_ORACLE = 0.2


def weak_oracle(calibration: EstimatesCalibration) -> bool:
    return calibration.tpr - calibration.fpr < WEAK_ORACLE


def unreliable(name: str, estimate: Estimate, calibration: EstimatesCalibration) -> str | None:
    """Why ``name``'s ``estimate`` should not be read as a number (None: it can be)."""
    spec = REGISTRY.get(name)
    if spec is not None and spec.needs_oracle and weak_oracle(calibration):
        return (
            f"the oracle separates right from wrong predictions poorly (TPR {calibration.tpr:.2f}, "
            f"FPR {calibration.fpr:.2f} on the calibration split)"
        )
    width = estimate.upper - estimate.lower
    if width > WIDE_INTERVAL:
        return f"its 95% interval is {width:.2f} wide"
    return None
