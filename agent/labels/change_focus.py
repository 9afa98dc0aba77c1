"""Labels where the change is: the stratified draws' strata gain the segments' change (docs/labels.md).

A segment whose inputs changed while no label-free estimate moved (:mod:`agent.estimation.segments.change`) has
an accuracy nobody knows: only labels measure it. :class:`ChangeFocus` holds the changed segments of the latest
window the agent estimated, each with its weight (its rank evidence over the largest, or its score where
only confidences or novel inputs moved: :func:`focus_weights`); a prediction in one of them
has its draw probability multiplied by ``1 +`` :data:`FOCUS` ``× weight`` over the traffic's mean factor
(:func:`focus_factors`, :func:`~agent.estimation.estimators.active.spread_probabilities`: the budget stays the
same, and so does the share every other prediction keeps, at least the floor over that mean), so that the
labels follow the change: with a tenth of the traffic in the most changed segment, about four labels in five are
drawn there. The draw probabilities stay known and kept,
so ``with_labels`` stays the same inverse-probability-weighted estimate and a segment's realized accuracy the
Hájek ratio of its labels (:mod:`agent.estimation.segments.realized`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

import numpy as np

from agent.estimation.segments.table import SegmentRow, change_size, rank_evidence

#: How many times more a prediction in the most changed segment is worth a label than its spread alone says.
FOCUS = 40.0
#: How sharply the focus falls from the most changed segment to the others (:func:`focus_weights`).
SHARPNESS = 4.0


def focus_weights(rows: Iterable[SegmentRow]) -> dict[int, float]:
    """Every changed segment's weight: its rank evidence over the largest, to the power :data:`SHARPNESS` (1 for
    the most changed; a segment that only shares some of its rows, with half its evidence, gets a sixteenth).
    When no changed segment has rank evidence (only confidences or novel inputs moved), the labels follow the
    table's order all the same: each changed segment's ``score`` over the largest, to that power."""
    changed = [r for r in rows if r.change.changed]
    evidence = {r.index: rank_evidence(r) for r in changed}
    if not any(e > 0 for e in evidence.values()):
        evidence = {r.index: change_size(r) for r in changed}
    top = max(evidence.values(), default=0.0)
    return {s: (e / top) ** SHARPNESS for s, e in evidence.items() if top > 0 and e > 0}


def focus_factors(segments: np.ndarray | None, weights: Mapping[int, float], n: int) -> np.ndarray | None:
    """Every prediction's factor ``1 + FOCUS × w``, ``w`` the largest weight of its segments (their numbers
    ``[D, N]``); None without segments or a changed one (every factor 1)."""
    if segments is None or not weights or n == 0:
        return None
    ids = np.asarray(segments, dtype=np.int64).reshape(-1, n)
    table = np.zeros(int(max(ids.max(initial=0), max(weights))) + 2)
    for s, w in weights.items():
        table[s] = w
    boost = table[np.clip(ids, 0, len(table) - 1)].max(axis=0)
    return 1.0 + FOCUS * boost


class ChangeFocus:
    """The changed segments of the latest window estimated (thread-safe; empty until one is)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._weights: dict[int, float] = {}
        self._bundle: object = None

    def update(self, bundle: object, rows: Iterable[SegmentRow]) -> None:
        """The latest window's segment rows, estimated with ``bundle``'s calibration."""
        weights = focus_weights(rows)
        with self._lock:
            self._weights, self._bundle = weights, bundle

    def weights(self, bundle: object) -> dict[int, float]:
        """The weights, if they were estimated with ``bundle`` (another bundle numbers its segments otherwise)."""
        with self._lock:
            return dict(self._weights) if bundle is self._bundle else {}
