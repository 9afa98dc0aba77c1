"""The one base class of the labeling sample's designs: how each judged prediction's draw probability is set.

A design is one :class:`DrawPolicy` in its own module (:mod:`agent.labels.uniform_draws`,
:mod:`agent.labels.active_draws`, :mod:`agent.labels.strata_draws`), registered by its ``labels.sampling``
value in :mod:`agent.labels.draw_policies`; :class:`~agent.labels.sample.LabelingSample` holds the one its
settings chose and never asks which it is. A policy gives every prediction of a draw its probability
(:meth:`DrawPolicy.probabilities`), may remember what was drawn (:attr:`Draw.on_drawn`), learn from the
labels that come back (:meth:`DrawPolicy.learn`) and rank the sample by how much each label is worth
(:meth:`DrawPolicy.worth_of`). The sample does the drawing itself, from its own random source.

A challenger's preference for its disagreements (:mod:`agent.labels.paired_labels`) is not a design: it
raises whichever design's probabilities to at least its own (the sample takes the larger of the two), so it
combines with every policy, and every draw then keeps its probability.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from agent.config.sampling import Sampling
from agent.config.settings import LabelsConfig
from agent.estimation.segments.table import SegmentRow
from agent.judging.recorder import JudgedBatch

#: How much the label of each listed prediction (by id) is worth; None for one the policy does not know.
WorthFn = Callable[[list[str]], list[float | None]]


@dataclass(frozen=True)
class Draw:
    """One draw's probabilities over its batches' predictions, one batch after the other, and what the policy
    does with each batch's drawn predictions (its index, the indices drawn in it), if anything."""

    pi: np.ndarray
    on_drawn: Callable[[int, np.ndarray], None] | None = None


class DrawPolicy(ABC):
    """A labeling design: every prediction's probability of being drawn into the labeling sample."""

    #: the ``labels.sampling`` value that chooses it
    name: ClassVar[Sampling]
    #: whether every draw keeps its probability (``with_labels`` then weights each label by its inverse);
    #: equal draws need not, unless a challenger's preference makes them unequal
    weighted: ClassVar[bool] = True
    #: whether the trust signal's boost changes its draws (a budget spent sooner, :mod:`agent.labels.boost`)
    boostable: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def of(cls, config: LabelsConfig, start: float | None = None) -> DrawPolicy:
        """The policy of ``labels`` settings; ``start``: when its budget starts counting the traffic
        (:func:`time.monotonic`, default now)."""

    @abstractmethod
    def probabilities(self, batches: Sequence[JudgedBatch], now: float, boost: float = 1.0) -> Draw:
        """The draw probabilities, each in ``[0, 1]``, of every prediction of ``batches`` (one after the other).
        ``now``: :func:`time.monotonic`; ``boost``: the factor the budget is spent faster by (1: no boost)."""

    def learn(self, labels: Iterable[tuple[str, int]]) -> int:
        """Accepted labels ``(prediction id, true class)``; the number the policy learnt from (a policy that
        learns nothing from labels: 0)."""
        del labels
        return 0

    def worth_of(self) -> WorthFn | None:
        """How the labeling sample's listing ranks its predictions (None: newest first)."""
        return None

    def on_segments(self, calibration: object, rows: Sequence[SegmentRow]) -> None:  # noqa: B027 (most ignore it)
        """The segment rows of the latest window estimated with ``calibration`` (a policy that draws where the
        inputs changed keeps them, :mod:`agent.labels.change_focus`; the others ignore them)."""
