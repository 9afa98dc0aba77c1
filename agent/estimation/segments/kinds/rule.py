"""``rule``: the selected TDI rule whose leaf the prediction falls in (those of most training support one by
one, the other selected rules together, and ``no selected rule``)."""

from __future__ import annotations

import numpy as np

from agent.estimation.segments.kinds.base import SegmentKind, Tables, lookup

#: between a rule segment's conditions in its name (``TDI rule 12: x[3] > 0.5 & city!=paris => 7``)
CONDITIONS_JOIN = " & "
#: between a rule segment's conditions and the class its leaf predicts
LEAF_CLASS = " => "


def abbreviated(name: str, keep: int = 3) -> str:
    """A rule segment's name with its first ``keep`` conditions and how many more (``TDI rule 2: a & b & c & 5
    more => 7``): a deep tree's path of eight conditions makes a one-line summary unreadable, while the name in
    full stays the segment's identity in JSON, metrics and ``check``'s table. Other names come back as they are."""
    head, sep, cls = name.rpartition(LEAF_CLASS)
    prefix, colon, body = head.partition(": ")
    if not sep or not colon:
        return name
    conditions = body.split(CONDITIONS_JOIN)
    if len(conditions) <= keep + 1:
        return name
    shown = CONDITIONS_JOIN.join([*conditions[:keep], f"{len(conditions) - keep} more"])
    return f"{prefix}: {shown}{LEAF_CLASS}{cls}"


class Rule(SegmentKind):
    """``lookup[TDI rule index]``; a rule it does not know: the last segment."""

    name = "rule"
    sources = ("rule",)

    def local_ids(
        self, tables: Tables, features: np.ndarray | None, predicted: np.ndarray | None, rules: np.ndarray | None
    ) -> np.ndarray | None:
        return None if rules is None else lookup(tables.lookup, rules)
