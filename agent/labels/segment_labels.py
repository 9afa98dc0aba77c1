"""The labels of the labeling sample by segment: what gives every segment of a window its realized accuracy
in ``GET /v1/estimates`` (:mod:`agent.estimation.segments.realized`).

The prediction store keeps no segment numbers (a prediction's segments need the feature view, which is not
stored), so :class:`SampleSegmentLabels` remembers, in memory, each prediction drawn into the labeling sample
with its segments, time and predicted class by its id (at most :data:`MAX_DRAWN`, the oldest forgotten
first), and each labeled one (at most :data:`MAX_LABELED`) once its label comes through the label intake,
with the weight ``1/π`` of its draw (1 under uniform draws). A window's realized figures per segment are
those of the labeled predictions made within it. They are this replica's: labels of predictions another
replica drew, and those from before a restart or a new bundle, are not among them (the window's overall
realized figures, from the store, hold them all). Each label keeps its source: within every segment of a
window no source weighs more than ``max_source_share`` of its labels (:mod:`agent.labels.source_cap`; its
weights ``1/π`` are lowered by the factor of the cap).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping

import numpy as np

from agent.estimation.segments.realized import SegmentLabels
from agent.judging.recorder import JudgedBatch
from agent.labels.rows import prediction_id
from agent.labels.source_cap import NO_CAP, capped_group_weights, source_codes

#: Drawn predictions remembered for their labels, and labeled ones kept for the windows.
MAX_DRAWN = 100_000
MAX_LABELED = 100_000


class SampleSegmentLabels:
    """Drawn and labeled predictions of the labeling sample with their segments (thread-safe)."""

    def __init__(
        self, max_drawn: int = MAX_DRAWN, max_labeled: int = MAX_LABELED, max_source_share: float = NO_CAP
    ) -> None:
        self.max_drawn = int(max_drawn)
        #: one source's labels weigh at most this share of a segment's (``labels.max_source_share``)
        self.max_source_share = float(max_source_share)
        self._lock = threading.Lock()
        self._bundle: object = None
        self._size = 0
        self._drawn: OrderedDict[str, tuple[float, np.ndarray, int, float]] = OrderedDict()
        self._labeled: deque[tuple[float, np.ndarray, bool, float, str]] = deque(maxlen=int(max_labeled))

    def remember(self, batch: JudgedBatch, drawn: np.ndarray, probability: np.ndarray | None) -> None:
        """Keep the drawn predictions of ``batch`` (``probability``: their draw probabilities, None under
        uniform draws)."""
        seg = batch.rt.calibration.segments
        if seg is None or batch.segments is None or not len(drawn) or batch.segments.shape[-1] != len(batch.predicted):
            return
        with self._lock:
            if self._bundle is not batch.rt.calibration:  # another bundle: other segments
                self._bundle, self._size = batch.rt.calibration, seg.size
                self._drawn.clear()
                self._labeled.clear()
            for j, i in enumerate(drawn.tolist()):
                p = float(probability[j]) if probability is not None else 1.0
                col = batch.segments[:, i].copy()
                self._drawn[prediction_id(batch.request_id, i)] = (batch.timestamp, col, int(batch.predicted[i]), p)
            while len(self._drawn) > self.max_drawn:
                self._drawn.popitem(last=False)

    def learn(self, labels: Iterable[tuple[str, int]], source: str = "") -> int:
        """Accepted labels ``(prediction id, true class)`` from ``source``: those of remembered predictions are
        kept. The number kept."""
        kept = 0
        with self._lock:
            for pid, label in labels:
                got = self._drawn.pop(pid, None)
                if got is not None:
                    ts, col, predicted, p = got
                    self._labeled.append((ts, col, predicted == label, 1.0 / p, source))
                    kept += 1
        return kept

    def by_window(self, calibration: object, spans: Mapping[str, float], now: float) -> dict[str, SegmentLabels]:
        """Per time window (``spans``: its length in seconds), the labels of predictions made within it;
        none for another bundle's calibration than the one remembered."""
        with self._lock:
            if calibration is not self._bundle or not self._labeled:
                return {}
            rows = list(self._labeled)
            size = self._size
        ts = np.array([r[0] for r in rows])
        ids = np.stack([r[1] for r in rows], axis=1)
        correct = np.array([r[2] for r in rows])
        w = np.array([r[3] for r in rows])
        codes, n_sources = source_codes(np.array([r[4] for r in rows], dtype=object))
        out = {}
        for name, seconds in spans.items():
            inside = ts >= now - seconds
            if inside.any():
                seg = ids[:, inside]
                out[name] = SegmentLabels.of(
                    seg, size, correct[inside], self._capped(seg, size, codes[inside], n_sources, w[inside])
                )
        return out

    def _capped(self, ids: np.ndarray, size: int, codes: np.ndarray, n_sources: int, w: np.ndarray) -> np.ndarray:
        """The weights ``[D, m]`` of the labels in each of their segments, no source over the cap there."""
        d = ids.shape[0]
        groups = np.minimum(ids, size).reshape(-1)  # a number ≥ size: counted nowhere (one group for all of them)
        tiled = np.tile(w, d)
        capped = capped_group_weights(groups, size + 1, np.tile(codes, d), n_sources, tiled, self.max_source_share)
        return capped.reshape(d, -1)
