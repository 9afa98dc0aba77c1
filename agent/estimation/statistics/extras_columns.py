"""The per-sample extras of a prediction (:class:`~agent.estimation.statistics.window.SampleExtras`) as the columns
the prediction store keeps, so that a window rebuilt from stored predictions reads them as a live one did."""

from __future__ import annotations

import numpy as np

from agent.estimation.statistics.window import SampleExtras

#: The :class:`SampleExtras` fields kept per prediction, in the order of the ``extras`` column.
EXTRAS_FIELDS: tuple[str, ...] = ("margin", "rules", "agree", "covered", "pca_error")
#: The stored dtype of an extras column (little-endian float64: integers and bools are exact).
EXTRAS_DTYPE = "<f8"


def extras_columns(extras: SampleExtras) -> np.ndarray:
    """The extras as float64 ``[N, 5]`` (columns :data:`EXTRAS_FIELDS`; integer and bool fields exactly)."""
    return np.column_stack([np.asarray(getattr(extras, f), dtype=np.float64).reshape(-1) for f in EXTRAS_FIELDS])


def extras_from_columns(cols: np.ndarray) -> SampleExtras:
    """The inverse of :func:`extras_columns`."""
    c = np.asarray(cols, dtype=np.float64).reshape(-1, len(EXTRAS_FIELDS))
    return SampleExtras(
        margin=c[:, 0].copy(),
        rules=c[:, 1].astype(np.int64),
        agree=c[:, 2] != 0,
        covered=c[:, 3] != 0,
        pca_error=c[:, 4].copy(),
    )
