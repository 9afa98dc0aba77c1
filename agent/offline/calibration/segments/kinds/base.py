"""What every segment kind's fit-time part is: :class:`SegmentKindFit`, how ``fit`` defines the dimensions of
one kind (its serving part, :class:`agent.estimation.segments.kinds.base.SegmentKind`, is in the module of
the same name under :mod:`agent.estimation.segments.kinds`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from agent.estimation.segments.kinds.base import SegmentKind
from agent.estimation.segments.segmentation import Dimension
from agent.offline.calibration.segments.data import SegmentData, ViewShape
from invariants.fit_params import CalibrationPlan


class SegmentKindFit(ABC):
    """A kind of segment dimension at ``fit``. ``kind``: its serving part (whose ``name`` is the dimensions'
    ``kind``); ``whole``: its dimensions are each taken whole while the budget of segments allows (a kind
    that is not whole fits its one dimension to the budget it is given)."""

    kind: ClassVar[type[SegmentKind]]
    whole: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.kind.name

    @abstractmethod
    def define(
        self, data: SegmentData, shape: ViewShape, plan: CalibrationPlan, budget: int, seed: int
    ) -> list[Dimension]:
        """Its dimensions on ``data`` (none: nothing of the kind to cut by), at most ``budget`` segments in
        all unless :attr:`whole`; ``seed`` seeds any draw."""
