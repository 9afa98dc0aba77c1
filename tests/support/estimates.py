"""Two :class:`icos_agent.Estimates` compared as the equality guarantee states it (docs/python.md): the same windows
and segments, every number within :data:`TOLERANCE`, everything else exactly."""

from __future__ import annotations

import numpy as np
import pandas as pd

import icos_agent

TOLERANCE = 1e-9
#: The guarantee's bound for a model whose inputs the bundle's input PCA reads in float32 on the request path
#: (images): on some CPUs the last bits of a row's float32 product depend on its place in its batch, and the
#: estimates that read those errors (``shift_aware``, the headline it leads) follow by about 1e-9 (docs/python.md).
FLOAT32_INPUTS_TOLERANCE = 1e-7


def assert_frames_equal(a: pd.DataFrame, b: pd.DataFrame, tolerance: float = TOLERANCE) -> None:
    """Equal columns and rows; numbers within ``tolerance``, everything else exactly."""
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b) and len(a) > 0
    for col in a.columns:
        x, y = a[col], b[col]
        if pd.api.types.is_float_dtype(x) or pd.api.types.is_float_dtype(y):
            xv, yv = x.astype(float).to_numpy(), y.astype(float).to_numpy()
            assert np.array_equal(np.isnan(xv), np.isnan(yv)), col
            assert np.nanmax(np.abs(np.nan_to_num(xv) - np.nan_to_num(yv)), initial=0.0) <= tolerance, col
        else:
            assert x.tolist() == y.tolist(), col


def assert_same_estimates(
    whole: icos_agent.Estimates, parts: icos_agent.Estimates, tolerance: float = TOLERANCE
) -> None:
    """Every window's estimates, intervals, flag and alert, and every segment of every window."""
    assert_frames_equal(whole.to_df(), parts.to_df(), tolerance)
    assert_frames_equal(whole.segments_df(), parts.segments_df(), tolerance)
