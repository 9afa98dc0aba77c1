"""What a window's statistics read of a calibration: :class:`StatisticsCalibration`, a read-only protocol.

The sums of a batch need the ATC threshold, the input reference of ``shift_aware`` (bins of the inputs), the
per-prediction predictor of being correct and the segments' numbering; the bundle's aggregate
(:class:`agent.estimation.calibration.EstimatorCalibration`) holds them among parts that read estimates. Taking
this protocol keeps the statistics at the bottom of :mod:`agent.estimation`: they import no estimator, no
segment kind and no aggregate.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from agent.estimation.statistics.reference import InputReference


class Referenced(Protocol):
    """A ``shift_aware`` calibration, as far as the statistics read it: the reference its windows bin into."""

    @property
    def reference(self) -> InputReference: ...


class Numbering(Protocol):
    """Segments fixed at fit, as far as the statistics read them: how many, and each prediction's number in
    every dimension (``[D, N]``; :meth:`agent.estimation.segments.segmentation.Segmentation.ids`)."""

    @property
    def size(self) -> int: ...

    def ids(
        self, features: np.ndarray | None, predicted: np.ndarray | None, rules: np.ndarray | None, n: int
    ) -> np.ndarray: ...

    def change_values(self, features: np.ndarray | None) -> np.ndarray | None: ...

    def change_cross(self, z: np.ndarray) -> np.ndarray: ...


class StatisticsCalibration(Protocol):
    """The parts of a calibration that a window's sums are computed with."""

    @property
    def atc_threshold(self) -> float: ...
    @property
    def shift(self) -> Referenced | None: ...
    @property
    def segments(self) -> Numbering | None: ...

    def predicted_correct(self, confidences: np.ndarray, verdicts: np.ndarray) -> np.ndarray: ...
