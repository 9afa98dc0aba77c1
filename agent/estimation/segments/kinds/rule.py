"""``rule``: the selected TDI rule whose leaf the prediction falls in (those of most training support one by
one, the other selected rules together, and ``no selected rule``)."""

from __future__ import annotations

import numpy as np

from agent.estimation.segments.kinds.base import SegmentKind, Tables, lookup


class Rule(SegmentKind):
    """``lookup[TDI rule index]``; a rule it does not know: the last segment."""

    name = "rule"
    sources = ("rule",)

    def local_ids(
        self, tables: Tables, features: np.ndarray | None, predicted: np.ndarray | None, rules: np.ndarray | None
    ) -> np.ndarray | None:
        return None if rules is None else lookup(tables.lookup, rules)
