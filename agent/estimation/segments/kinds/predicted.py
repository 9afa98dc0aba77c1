"""``predicted``: the predicted class (the most frequent at ``fit``; the rest together in ``other classes``)."""

from __future__ import annotations

import numpy as np

from agent.estimation.segments.kinds.base import SegmentKind, Tables, lookup


class Predicted(SegmentKind):
    """``lookup[class]``; a class it does not know: the last segment."""

    name = "predicted"
    sources = ("predicted",)
    by_output = True

    def local_ids(
        self, tables: Tables, features: np.ndarray | None, predicted: np.ndarray | None, rules: np.ndarray | None
    ) -> np.ndarray | None:
        return None if predicted is None else lookup(tables.lookup, predicted)
