"""Stratified draws of the labeling sample (``labels.sampling: stratified``): as active draws
(:mod:`agent.labels.active_draws`), with each prediction's uncertainty replaced by the residual spread of its
strata as the labels received so far show it: the allocation of :mod:`agent.estimation.estimators.strata`,
learnt from the labels as they arrive, so the budget goes where the labels say the predictor is wrong, and
raised in the segments whose inputs changed in the latest window (:mod:`agent.labels.change_focus`: where no
label-free estimate can say what the change costs).

:class:`StratifiedDraws` gives every prediction its *spread* (its expected residual standard deviation, from its
bin of predicted correctness and its segments), the active budget turns it into draw probabilities (fixed before
each draw and kept, so ``with_labels`` is the same inverse-probability-weighted estimate), and it remembers each
drawn prediction's strata, predictor value and predicted class by its id (at most :data:`MAX_REMEMBERED`, the
oldest forgotten first): a label posted for it later (:meth:`learn`, from the label intake) teaches the allocation
whether the prediction was right. Labels of predictions it does not remember (never drawn here, forgotten, or
another replica's) teach it nothing; they count as any other label everywhere else. A new bundle (other segments,
another predictor) starts from its prior again.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import ClassVar

import numpy as np

from agent.config.sampling import Sampling
from agent.config.settings import LabelsConfig
from agent.estimation.estimators.strata import N_BINS, StrataLearner, strata_of
from agent.estimation.segments.table import SegmentRow
from agent.judging.recorder import JudgedBatch
from agent.labels.active_draws import ActiveBudget, ActiveDraws, joined, predicted_correct
from agent.labels.change_focus import ChangeFocus, focus_factors
from agent.labels.draw_policy import Draw, WorthFn
from agent.labels.rows import prediction_id

#: Drawn predictions remembered for the labels to come.
MAX_REMEMBERED = 100_000


class StratifiedDraws(ActiveDraws):
    """Active draws by the learnt allocation of one agent (thread-safe). ``tau``: how long what the labels taught
    lasts (the time constant of its decay, seconds: the budget window)."""

    name: ClassVar[Sampling] = "stratified"

    def __init__(self, budget: ActiveBudget, tau: float, max_remembered: int = MAX_REMEMBERED) -> None:
        super().__init__(budget)
        self.tau = float(tau)
        self.max_remembered = int(max_remembered)
        self._strata_lock = threading.Lock()
        self._bundle: object = None
        self._learner: StrataLearner | None = None
        self._drawn: OrderedDict[str, tuple[np.ndarray, float, int]] = OrderedDict()
        #: the changed segments of the latest window: their predictions' spreads are raised
        self.focus = ChangeFocus()

    @classmethod
    def of(cls, config: LabelsConfig, start: float | None = None) -> StratifiedDraws:
        budget = ActiveBudget(config.per_window, config.budget_seconds, config.active_floor, start)
        return cls(budget, config.budget_seconds)

    def probabilities(self, batches: Sequence[JudgedBatch], now: float, boost: float = 1.0) -> Draw:
        fs = [predicted_correct(b) for b in batches]
        strata = [self.strata(b, fb) for b, fb in zip(batches, fs, strict=True)]
        spread = joined([self.spread(b, fb, sb) for b, fb, sb in zip(batches, fs, strata, strict=True)])
        focus = joined([self.focus_of(b, len(fb)) for b, fb in zip(batches, fs, strict=True)])
        with self._lock:
            pi = self.budget.probabilities(joined(fs), now, boost, spread, focus)

        def on_drawn(i: int, drawn: np.ndarray) -> None:
            self.remember(batches[i], drawn, fs[i], strata[i])

        return Draw(pi, on_drawn)

    def worth_of(self) -> WorthFn:
        return self.worth

    def on_segments(self, calibration: object, rows: Sequence[SegmentRow]) -> None:
        self.focus.update(calibration, rows)

    def _for(self, batch: JudgedBatch) -> StrataLearner:
        """The learner of the batch's bundle (a new one, from the prior, when the bundle changed)."""
        cal = batch.rt.calibration
        if self._learner is None or self._bundle is not cal:
            seg = cal.segments
            dims = tuple(len(d.segments) for d in seg.dimensions) if seg is not None else ()
            self._learner = StrataLearner(sum(dims), self.tau, dimensions=dims)
            self._bundle = cal
            self._drawn.clear()
        return self._learner

    def strata(self, batch: JudgedBatch, predicted_correct: np.ndarray) -> np.ndarray:
        """The batch's strata ``[1 + D, n]`` (its bins of ``f`` alone where it carries no segments)."""
        segments = batch.segments
        if segments is not None and segments.shape[-1] != len(predicted_correct):
            segments = None
        return strata_of(predicted_correct, segments)

    def focus_of(self, batch: JudgedBatch, n: int) -> np.ndarray:
        """Every prediction's focus factor (:mod:`agent.labels.change_focus`; 1 outside changed segments)."""
        segments = batch.segments if batch.segments is not None and batch.segments.shape[-1] == n else None
        factors = focus_factors(segments, self.focus.weights(batch.rt.calibration), n)
        return np.ones(n) if factors is None else factors

    def spread(self, batch: JudgedBatch, predicted_correct: np.ndarray, strata: np.ndarray) -> np.ndarray:
        """Every prediction's spread under the allocation learnt so far."""
        with self._strata_lock:
            return self._for(batch).spread(strata, predicted_correct)

    def wanted(self, batch: JudgedBatch, predicted_correct: np.ndarray, strata: np.ndarray) -> np.ndarray:
        """How much a label of each prediction is worth now (:meth:`StrataLearner.wanted`)."""
        with self._strata_lock:
            return self._for(batch).wanted(strata, predicted_correct)

    def remember(
        self, batch: JudgedBatch, drawn: np.ndarray, predicted_correct: np.ndarray, strata: np.ndarray
    ) -> None:
        """Keep the drawn predictions' strata, ``f`` and predicted class for their labels."""
        if not len(drawn):
            return
        with self._strata_lock:
            self._for(batch)
            for i in drawn.tolist():
                pid = prediction_id(batch.request_id, i)
                self._drawn[pid] = (strata[:, i].copy(), float(predicted_correct[i]), int(batch.predicted[i]))
            while len(self._drawn) > self.max_remembered:
                self._drawn.popitem(last=False)

    def learn(self, labels: Iterable[tuple[str, int]], now: float | None = None) -> int:
        """Learn from accepted labels ``(prediction id, true class)``; the number it remembered."""
        with self._strata_lock:
            got = [(self._drawn.pop(pid), label) for pid, label in labels if pid in self._drawn]
            if not got or self._learner is None:
                return 0
            strata = np.stack([entry[0] for entry, _ in got], axis=1)
            f = np.array([entry[1] for entry, _ in got])
            correct = np.array([entry[2] == label for entry, label in got])  # predicted class == true class
            self._learner.learn(strata, f, correct, time.monotonic() if now is None else now)
            return len(got)

    def worth(self, pids: list[str]) -> list[float | None]:
        """How much the label of each drawn prediction ``pids`` is worth now (:meth:`StrataLearner.wanted`:
        its stratum's spread over the root of one more than the labels the stratum already has); None for
        one not remembered."""
        with self._strata_lock:
            learner = self._learner
            known = [(k, self._drawn[pid]) for k, pid in enumerate(pids) if pid in self._drawn]
            out: list[float | None] = [None] * len(pids)
            if learner is None or not known:
                return out
            strata = np.stack([g[0] for _, g in known], axis=1)
            f = np.array([g[1] for _, g in known])
            values = learner.wanted(strata, f)
        for (k, _), v in zip(known, values.tolist(), strict=True):
            out[k] = float(v)
        return out

    def learnt(self) -> float:
        """The labels the allocation has learnt from (decayed)."""
        with self._strata_lock:
            return 0.0 if self._learner is None else float(self._learner.labels()[:N_BINS].sum())

    def shrunk_excess(self) -> np.ndarray | None:
        """Per stratum (bins, then segments) the excess squared residual learnt so far (None before any batch)."""
        with self._strata_lock:
            return None if self._learner is None else self._learner.shrunk_excess()
