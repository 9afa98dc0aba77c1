"""``column``: one column of a table view: a categorical column's values (its one-hot group, or a numeric
column of few distinct values; the rarest together in ``other``), or a numeric column's quantile bins."""

from __future__ import annotations

import numpy as np

from agent.estimation.segments.kinds.base import SegmentKind, Tables, lookup, view_rows


class Column(SegmentKind):
    """``onehot``: the ``columns`` of a one-hot group, ``lookup[argmax]``; ``bins``: the view column
    ``columns[0]`` cut at the inner ``edges``; ``values``: the column's exact values ``edges`` (sorted),
    ``lookup[position]``, any other value the last segment."""

    name = "column"
    sources = ("onehot", "bins", "values")

    def check(self, dimension: str, tables: Tables) -> None:
        if not len(tables.columns):
            raise ValueError(f"segment dimension {dimension!r} reads no column")
        if tables.source == "bins" and len(tables.edges) != tables.k - 1:
            raise ValueError(f"segment dimension {dimension!r}: {len(tables.edges)} edges for {tables.k} bins")

    def local_ids(
        self, tables: Tables, features: np.ndarray | None, predicted: np.ndarray | None, rules: np.ndarray | None
    ) -> np.ndarray | None:
        f = view_rows(features, self.width(tables))
        if f is None:
            return None
        if tables.source == "onehot":
            return lookup(tables.lookup, np.argmax(f[:, tables.columns], axis=1))
        x = f[:, tables.columns[0]].astype(np.float64)
        if tables.source == "bins":
            return np.searchsorted(tables.edges, x, side="right")
        pos = np.minimum(np.searchsorted(tables.edges, x), len(tables.edges) - 1)
        return np.where(tables.edges[pos] == x, tables.lookup[pos], tables.k - 1)
