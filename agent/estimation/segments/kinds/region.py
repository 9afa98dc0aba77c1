"""``region``: the nearest of a few k-means centres of the view (images, embeddings, pooled and hashed views),
named by its training class mix."""

from __future__ import annotations

import numpy as np

from agent.estimation.segments.kinds.base import SegmentKind, Tables, view_rows


class Region(SegmentKind):
    """``argmax(x · weights + bias)`` over the view: the nearest centre (``weights`` ``[D, k]``)."""

    name = "region"
    sources = ("nearest",)

    def check(self, dimension: str, tables: Tables) -> None:
        if len(tables.bias) != tables.k or tables.weights.shape[1] != tables.k:
            raise ValueError(f"segment dimension {dimension!r}: centres of the wrong shape")

    def width(self, tables: Tables) -> int:
        return len(tables.weights)

    def local_ids(
        self, tables: Tables, features: np.ndarray | None, predicted: np.ndarray | None, rules: np.ndarray | None
    ) -> np.ndarray | None:
        f = view_rows(features, self.width(tables))
        return None if f is None else np.argmax(f @ tables.weights + tables.bias, axis=1)
