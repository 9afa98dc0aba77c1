"""What the estimators read of a calibration: :class:`EstimatesCalibration`, a read-only protocol.

The bundle's aggregate (:class:`agent.estimation.calibration.EstimatorCalibration`) meets it, and so does a
segment's own calibration (:class:`agent.estimation.segments.table.SegmentCalibration`). The estimators take
the protocol, not the aggregate: the aggregate also holds the flag's and the segments' models, which read
estimates, so importing it here would make the estimators depend on the rooms above them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agent.estimation.estimators.shift_calibration import ShiftCalibration


class EstimatesCalibration(Protocol):
    """The oracle's TPR/FPR and the split's counts (``icos_corrected``, the split floor), accuracy and mean
    confidence (``doc``), confidence offsets (``cbpe``), the ``shift_aware`` regressions and the name of the
    per-prediction predictor (``with_labels``) and the segment dimensions it may be post-stratified on (``(name,
    first segment number, end)``; empty without segments)."""

    @property
    def tpr(self) -> float: ...
    @property
    def fpr(self) -> float: ...
    @property
    def n_wrong(self) -> int: ...
    @property
    def n_right(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def accuracy(self) -> float: ...
    @property
    def avg_conf(self) -> float: ...
    @property
    def atc_threshold(self) -> float: ...
    @property
    def conf_offsets(self) -> tuple[float, ...]: ...
    @property
    def shift(self) -> ShiftCalibration | None: ...
    @property
    def predictor(self) -> str: ...
    @property
    def segment_strata(self) -> Sequence[tuple[str, int, int]]: ...
