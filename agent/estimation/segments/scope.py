"""Whether a window's change lives in a few segments or across the traffic (docs/diagnosis.md, "A change across
the traffic").

Each dimension cuts the whole traffic, so the share of a dimension's predictions that fall in segments whose inputs
changed (:func:`changed_shares`) says how much of the traffic moved, as that dimension sees it. A fault in one
segment leaves most of the traffic unchanged in at least one dimension, the one that isolates it (a city's column
broken: the other cities; a class darkened: the other regions), even when it moves rows across the bins of the
broken column or the predicted classes. A change of the whole traffic (every image blurred, a unit changed for
every row) leaves no such dimension. A window is :func:`widespread` when, in every dimension, the segments whose
inputs changed hold at least :data:`WIDESPREAD_SHARE` of its predictions: then no segment is where the drop is,
and the top segments only say where the change is largest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: The share of every dimension's predictions in changed segments from which a change is across the traffic: a
#: majority in every cut of it.
WIDESPREAD_SHARE = 0.5


def changed_shares(rows: Iterable[tuple[str, float, bool]]) -> dict[str, float]:
    """Per dimension of ``rows`` (each a segment's dimension, its share of that dimension's predictions and whether
    its inputs changed), the share of its predictions in segments whose inputs changed."""
    out: dict[str, float] = {}
    for dimension, share, changed in rows:
        out[dimension] = out.get(dimension, 0.0) + (share if changed else 0.0)
    return out


def widespread(shares: Mapping[str, float]) -> bool:
    """Whether, in every dimension, segments whose inputs changed hold at least :data:`WIDESPREAD_SHARE` of the
    predictions (never without a dimension)."""
    return bool(shares) and min(shares.values()) >= WIDESPREAD_SHARE


def least_changed(shares: Mapping[str, float]) -> tuple[str, float] | None:
    """The dimension whose predictions are least in changed segments, and that share (None: no dimension)."""
    if not shares:
        return None
    dim = min(shares, key=lambda d: (shares[d], d))
    return dim, shares[dim]
