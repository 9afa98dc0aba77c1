"""What every segment kind is: :class:`SegmentKind`, the serving part of a kind of dimension.

A dimension (:class:`agent.estimation.segments.segmentation.Dimension`) is data in the bundle: its kind's name,
its ``source`` and its tables (:class:`Tables`). Its kind says which sources it may have, checks the tables'
shapes and puts every prediction of a batch in one of its segments, with numpy operations on what judging
already has per prediction (the feature view row, the predicted class, the TDI leaf).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np


@dataclass(frozen=True)
class Tables:
    """A dimension's tables as numpy arrays, and how it reads them: ``source`` (one of its kind's
    :attr:`~SegmentKind.sources`), ``k`` segments; ``lookup`` ends with the last segment (the "other"
    segment, for anything beyond the table)."""

    source: str
    k: int
    lookup: np.ndarray
    edges: np.ndarray
    columns: np.ndarray
    weights: np.ndarray
    bias: np.ndarray


def lookup(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``table[index]`` for non-negative indices, the table's last entry (the "other" segment, appended to
    every lookup table) for one beyond it (a class or leaf it does not know): one ``np.take``."""
    return np.take(table, np.asarray(index).reshape(-1), mode="clip")


def view_rows(features: np.ndarray | None, width: int) -> np.ndarray | None:
    """The feature view as rows ``[N, D]``, or None when absent or narrower than ``width`` columns."""
    if features is None:
        return None
    f = np.asarray(features).reshape(len(features), -1)
    return None if f.shape[1] < width else f


class SegmentKind(ABC):
    """A kind of segment dimension at serving time. ``name``: the dimension's ``kind`` in the bundle (the same
    name as its fit-time part); ``sources``: how its dimensions may read a prediction."""

    name: ClassVar[str]
    sources: ClassVar[tuple[str, ...]]
    #: whether its segments are cut by the model's own output (the predicted class), not by the inputs: a fault in
    #: the inputs sends its rows into such a segment wherever the fault lives, so a change there says that inputs
    #: moved, not where (:mod:`agent.estimation.segments.change`: such a change does not rank the segment)
    by_output: ClassVar[bool] = False

    def check(self, dimension: str, tables: Tables) -> None:  # noqa: B027 (most kinds have nothing to check)
        """Raise ValueError where the tables of ``dimension`` (its name) cannot be read (nothing to check by
        default: a lookup's range and the weights' width are checked for every kind)."""

    def width(self, tables: Tables) -> int:
        """Columns of the view it reads (0: it reads no view column)."""
        return int(tables.columns.max()) + 1 if len(tables.columns) else 0

    @abstractmethod
    def local_ids(
        self, tables: Tables, features: np.ndarray | None, predicted: np.ndarray | None, rules: np.ndarray | None
    ) -> np.ndarray | None:
        """The segment (``0 … k − 1``) of every prediction, or None when what it reads is missing (no TDI
        leaves, or a view narrower than it was fitted on)."""
