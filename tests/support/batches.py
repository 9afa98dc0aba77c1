"""Batches of predictions for the prediction store's tests (what the judge queue hands the store),
with random probabilities that the batch's size seeds: the same call gives the same batch."""

from __future__ import annotations

import numpy as np

from agent.labels.rows import PendingBatch


def batch(
    rid: str, n: int, ts: float, sampled: list[int] | None, identity: str = "m:b", draw_p: list[float] | None = None
) -> PendingBatch:
    """Request ``rid``'s ``n`` predictions over 3 classes at ``ts``, of model ``identity``; ``sampled``:
    the indices drawn into the labeling sample (with their draw probabilities ``draw_p``)."""
    rng = np.random.default_rng(n)
    p = rng.dirichlet(np.ones(3), n).astype(np.float32)
    s = np.asarray(sampled) if sampled is not None else None
    sp = np.asarray(draw_p) if draw_p is not None else None
    return PendingBatch(rid, ts, identity, p, p.argmax(axis=1), np.zeros(n, np.int8), sampled=s, sampled_p=sp)
