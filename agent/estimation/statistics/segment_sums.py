"""Per-segment sums of per-prediction values: what a window's segment and change sums and a bundle's segment
references are added with (:mod:`agent.estimation.statistics.window`, :mod:`agent.estimation.segments.sketch`)."""

from __future__ import annotations

import numpy as np


def per_segment(ids: np.ndarray, size: int, values: np.ndarray) -> np.ndarray:
    """Per segment, the sums of every column of ``values`` ``[N, K]`` over the rows with segment numbers ``ids``
    ``[D, N]`` (each dimension numbers its own segments; a number ≥ ``size``: counted nowhere), segment-major
    ``[S × K]``: where segments are few against the ``D × K`` sums a row adds, one product with the rows'
    membership ``[S + 1, N]`` (a table of 10 dimensions and 63 change sums: a fourteenth of the CPU, without the
    ``D × N × K`` temporaries), else one ``np.bincount``."""
    n_rows, k = values.shape
    ids2 = np.minimum(np.asarray(ids, dtype=np.int64).reshape(-1, n_rows), size)
    if size + 1 <= 2 * ids2.shape[0] * k and np.isfinite(values).all():  # a NaN would spread over every segment
        member = np.zeros((size + 1, n_rows))
        member[ids2, np.arange(n_rows)] = 1.0
        return (member @ values)[:size].ravel()  # type: ignore[no-any-return]
    flat = (ids2[:, :, None] * k + np.arange(k)).ravel()
    w = np.broadcast_to(values, (ids2.shape[0], n_rows, k)).ravel()
    return np.bincount(flat, weights=w, minlength=(size + 1) * k)[: size * k]
