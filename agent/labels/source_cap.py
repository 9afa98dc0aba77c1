"""One labeler's share of a window's labels, capped (``labels.max_source_share``).

Every label keeps its source (the labels token's name, or ``client:<address>`` when no token is set). Without a
cap, a sender first to label many stored predictions (``__none__``, or a wrong class) outweighs every honest
labeler however few of its labels are true. So, in a window (and in each segment of it), the labels of one
source weigh together at most the share ``c`` of all the labels' weight there:

* ``W_s`` is the weight of source ``s``'s labels (their count, or ``Σ 1/π`` where draws are weighted);
* with ``m`` sources present, the cap is ``c' = max(c, 1/m)``: with fewer than ``1/c`` sources no share
  below ``1/m`` is possible, so each then weighs the same ``1/m``, and a single source (nothing to weigh it
  against) keeps its weight;
* the capped total ``T`` solves ``T = Σ_s min(W_s, c'·T)`` (water-filling), and every label of source ``s``
  is multiplied by ``f_s = min(1, c'·T / W_s)``. With one source over the cap this is
  ``f_s = c'·W_others / ((1 − c')·W_s)``: its labels then weigh exactly ``c'`` of the total.

A figure is then the Hájek ratio ``Σ f w Y / Σ f w`` (``w``: the label's own weight, 1 or ``1/π``), so a
flood moves it by at most ``c'·|Y_flood − Y_others|`` from the other sources' figure. ``c = 1`` caps
nothing. Pure numpy, no state.
"""

from __future__ import annotations

import numpy as np

#: ``labels.max_source_share`` at which no source is capped
NO_CAP = 1.0


def cap_factors(totals: np.ndarray, share: float) -> np.ndarray:
    """Per row (a window or a segment) and column (a source) of ``totals`` ``[G, S]`` (each source's weight
    ``W_s`` there, 0 where absent), the factor ``f_s`` its labels' weights are multiplied by (see the module
    docstring); 1 where nothing is capped."""
    w = np.asarray(totals, dtype=np.float64)
    w = w.reshape(1, -1) if w.ndim == 1 else w
    out = np.ones_like(w)
    if share >= NO_CAP or w.size == 0:
        return out.reshape(np.shape(totals))
    present = w > 0
    m = present.sum(axis=1)
    cap = np.maximum(share, 1.0 / np.maximum(m, 1))  # c' per row
    desc = -np.sort(-w, axis=1)  # W sorted, largest first (zeros last)
    # U_k: the weight of the sources from the k-th largest on; T_k = U_k / (1 − k c') if the k largest are capped
    suffix = np.cumsum(desc[:, ::-1], axis=1)[:, ::-1]
    k = np.arange(w.shape[1], dtype=np.float64)
    room = 1.0 - k[None, :] * cap[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        total = np.where(room > 0, suffix / room, np.inf)
    # the fewest sources capped such that the largest uncapped one fits under c'·T_k (with c' = 1/m at the
    # latest when all but the smallest are capped: then every source weighs the same)
    fits = (desc <= cap[:, None] * total * (1 + 1e-12)) & (k[None, :] < m[:, None])
    first = np.where(fits.any(axis=1), fits.argmax(axis=1), np.maximum(m - 1, 0))
    level = cap * total[np.arange(w.shape[0]), first]  # c'·T: what a capped source weighs
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(present & (w > level[:, None]), level[:, None] / w, 1.0)
    out = np.where((m > 1)[:, None], f, 1.0)
    return out.reshape(np.shape(totals))


def source_codes(sources: np.ndarray) -> tuple[np.ndarray, int]:
    """Each label's source as a small integer, and how many distinct sources there are."""
    index: dict[object, int] = {}
    codes = np.fromiter((index.setdefault(s, len(index)) for s in sources), dtype=np.int64, count=len(sources))
    return codes, len(index)


def capped_weights(sources: np.ndarray, weights: np.ndarray | None, share: float) -> tuple[np.ndarray, int]:
    """The weights of one group of labels (a window) after the cap, and how many labels it lowered."""
    n = len(sources)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    if share >= NO_CAP or n == 0:
        return w, 0
    codes, k = source_codes(sources)
    f = cap_factors(np.bincount(codes, weights=w, minlength=k), share)[codes]
    return w * f, int(np.count_nonzero(f < 1.0))


def capped_group_weights(
    groups: np.ndarray, n_groups: int, codes: np.ndarray, n_sources: int, weights: np.ndarray, share: float
) -> np.ndarray:
    """The weights of labels that each belong to one of ``n_groups`` groups (a segment; ``groups`` ``[n]``, a
    number below ``n_groups``), the cap applied within each group on the sources ``codes`` ``[n]``."""
    if share >= NO_CAP or len(groups) == 0 or n_sources <= 1:
        return np.asarray(weights, dtype=np.float64)
    key = np.asarray(groups, dtype=np.int64) * n_sources + codes
    totals = np.bincount(key, weights=weights, minlength=n_groups * n_sources).reshape(n_groups, n_sources)
    return np.asarray(weights, dtype=np.float64) * cap_factors(totals, share).reshape(-1)[key]
