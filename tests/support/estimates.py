"""Two :class:`icos_agent.Estimates` compared as the equality guarantee states it (docs/python.md): the same windows
and segments, every number within :data:`TOLERANCE`, everything else exactly."""

from __future__ import annotations

import numpy as np
import pandas as pd

import icos_agent

TOLERANCE = 1e-9


def assert_frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Equal columns and rows; numbers within :data:`TOLERANCE`, everything else exactly."""
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b) and len(a) > 0
    for col in a.columns:
        x, y = a[col], b[col]
        if pd.api.types.is_float_dtype(x) or pd.api.types.is_float_dtype(y):
            xv, yv = x.astype(float).to_numpy(), y.astype(float).to_numpy()
            assert np.array_equal(np.isnan(xv), np.isnan(yv)), col
            assert np.nanmax(np.abs(np.nan_to_num(xv) - np.nan_to_num(yv)), initial=0.0) <= TOLERANCE, col
        else:
            assert x.tolist() == y.tolist(), col


def assert_same_estimates(whole: icos_agent.Estimates, parts: icos_agent.Estimates) -> None:
    """Every window's estimates, intervals, flag and alert, and every segment of every window."""
    assert_frames_equal(whole.to_df(), parts.to_df())
    assert_frames_equal(whole.segments_df(), parts.segments_df())
