"""The labels of the labeling sample by segment: what gives every segment of a window its realized accuracy
in ``GET /v1/estimates`` (:mod:`agent.estimation.segments.realized`).

The prediction store keeps no segment numbers (a prediction's segments need the feature view, which is not
stored), so :class:`SampleSegmentLabels` remembers, in memory, each prediction drawn into the labeling sample
with its segments, time and predicted class by its id (at most :data:`MAX_DRAWN`, the oldest forgotten
first), and each labeled one (at most :data:`MAX_LABELED`) once its label comes through the label intake,
with the weight ``1/π`` of its draw (1 under uniform draws). A window's realized figures per segment are
those of the labeled predictions made within it. They are this replica's: labels of predictions another
replica drew, and those from before a restart or a new bundle, are not among them (the window's overall
realized figures, from the store, hold them all).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping

import numpy as np

from agent.estimation.segments.realized import SegmentLabels
from agent.judging.recorder import JudgedBatch
from agent.labels.rows import prediction_id

#: Drawn predictions remembered for their labels, and labeled ones kept for the windows.
MAX_DRAWN = 100_000
MAX_LABELED = 100_000


class SampleSegmentLabels:
    """Drawn and labeled predictions of the labeling sample with their segments (thread-safe)."""

    def __init__(self, max_drawn: int = MAX_DRAWN, max_labeled: int = MAX_LABELED) -> None:
        self.max_drawn = int(max_drawn)
        self._lock = threading.Lock()
        self._bundle: object = None
        self._size = 0
        self._drawn: OrderedDict[str, tuple[float, np.ndarray, int, float]] = OrderedDict()
        self._labeled: deque[tuple[float, np.ndarray, bool, float]] = deque(maxlen=int(max_labeled))

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

    def learn(self, labels: Iterable[tuple[str, int]]) -> int:
        """Accepted labels ``(prediction id, true class)``: those of remembered predictions are kept. The
        number kept."""
        kept = 0
        with self._lock:
            for pid, label in labels:
                got = self._drawn.pop(pid, None)
                if got is not None:
                    ts, col, predicted, p = got
                    self._labeled.append((ts, col, predicted == label, 1.0 / p))
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
        out = {}
        for name, seconds in spans.items():
            inside = ts >= now - seconds
            if inside.any():
                out[name] = SegmentLabels.of(ids[:, inside], size, correct[inside], w[inside])
        return out
