"""Recording judged predictions: the estimator windows, the metrics and the sinks (the prediction store
for delayed labels, the audits' reservoir of live inputs), for many requests at once.

:class:`Recorder` is given its sinks at construction, by the composition root
(:func:`agent.server.app.create_app`): which collaborators see a judged batch is read in one place.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.estimation.segments.segmentation import segment_ids
from agent.estimation.statistics.extras_columns import extras_columns
from agent.estimation.statistics.items import stat_items
from agent.estimation.statistics.window import SampleExtras, WindowStats, novel_inputs, sample_extras
from agent.judging.runtime import Runtime
from agent.judging.verdicts import Arrays, JudgeWork, RowBuffer, concatenated, judge, oracle_call
from agent.judging.windows import WindowSet
from agent.model.classifier import label_confidences
from agent.model.inputs import Inputs
from exporters.prometheus import AgentMetrics
from invariants.oracle import VERDICTS


@dataclass(frozen=True)
class JudgedBatch:
    """One request's judged predictions, as the judged-batch sinks receive them."""

    rt: Runtime
    request_id: str
    timestamp: float
    probabilities: np.ndarray
    #: The predicted classes (indices into ``rt.classes``).
    predicted: np.ndarray
    verdicts: np.ndarray
    #: The inputs of the full ``shift_aware`` model for these predictions as float64 ``[n, 5]``
    #: columns (:func:`agent.estimation.statistics.window.extras_columns`; None without a shift calibration).
    extras: np.ndarray | None = None
    #: The request's prepared inputs (None when the work was recorded without them).
    inputs: Inputs | None = None
    #: The request's metadata (the fields IDI rules read; None without)
    metadata: Mapping[str, Any] | None = None
    #: Every prediction's segment in each dimension fixed at fit, int64 ``[D, n]`` (None without segments).
    segments: np.ndarray | None = None
    #: Per prediction, the calibration's probability that it is correct, as the windows computed it
    #: (:meth:`~agent.estimation.calibration.EstimatorCalibration.predicted_correct`; None: not computed).
    predicted_correct: np.ndarray | None = None


#: Receives every judged request that has an id (the prediction store, a challenger); called while recording,
#: so it must only enqueue (what it returns is not read).
JudgedSink = Callable[[JudgedBatch], object]
#: Receives the judged requests with an id of one recording call together, in their order (the
#: labeling sample draws them in one pass); called while recording, so it must only enqueue.
JudgedGroupSink = Callable[[Sequence[JudgedBatch]], None]
#: Receives the prepared inputs of the requests of one recording call, in their order, with their runtime
#: (the audits' reservoir of live inputs); works recorded without their inputs are left out.
InputSink = Callable[[Runtime, Sequence[Inputs]], None]


def judged_stats(
    rt: Runtime,
    probabilities: np.ndarray,
    predicted: np.ndarray,
    verdicts: np.ndarray,
    extras: SampleExtras | None,
    *,
    per_class: bool = True,
) -> tuple[WindowStats, np.ndarray, np.ndarray]:
    """A judged batch's window statistics, as every recording adds them (the champion's here, a challenger's
    beside it): the verdicts' and confidences' sums, the per-class CBPE sums (``per_class``) and the
    predictor's sums. Returns the statistics, each prediction's confidence and the predictor's probability
    that it is correct (the labeling sample's draw reads it too). ``extras``: the inputs of the full
    ``shift_aware`` model, or None."""
    conf = label_confidences(probabilities, predicted)
    shift = rt.calibration.shift
    stats = WindowStats.of_samples(
        verdicts, conf, rt.calibration.atc_threshold, extras, shift.reference if shift is not None else None
    )
    if per_class:
        stats.add_class_sums(probabilities, predicted)  # per-class CBPE figures of the time windows
    correct = stats.add_predictor_sums(rt.calibration, conf, verdicts)
    return stats, conf, correct


class Recorder:
    """Records judged works in the windows, the metrics and the sinks; not thread-safe on its own (the
    :class:`~agent.judging.queue.JudgeQueue` calls it under its judging lock)."""

    def __init__(
        self,
        windows: WindowSet,
        metrics: AgentMetrics,
        judged_sinks: Sequence[JudgedSink] = (),
        input_sinks: Sequence[InputSink] = (),
        judged_group_sinks: Sequence[JudgedGroupSink] = (),
    ) -> None:
        self.windows = windows
        self.metrics = metrics
        self.judged_sinks = tuple(judged_sinks)
        self.judged_group_sinks = tuple(judged_group_sinks)
        self._rows = RowBuffer()  # the groups' feature rows, for the oracle and the window statistics
        self.input_sinks = tuple(input_sinks)

    def record(self, works: Sequence[JudgeWork]) -> None:
        """Judge the works still without verdicts, then record them, one group per runtime and
        metadata (see :func:`agent.judging.verdicts.judge`). Every work ends ``done``, with its
        ``verdicts`` or its ``error``; nothing is raised.

        A runtime's works that all wait for the oracle without per-request metadata (the common case)
        are concatenated once, for the oracle and the recording alike."""
        groups: dict[int, list[JudgeWork]] = {}
        for w in works:
            if w.error is None:
                groups.setdefault(id(w.rt), []).append(w)
        for group in groups.values():
            arrays: Arrays | None = None
            if all(w.verdicts is None and w.metadata is None for w in group):
                arrays = concatenated(group, self._rows)
                try:
                    oracle_call(group, arrays)
                except Exception as exc:  # delivered to the waiting requests; such works are not recorded
                    for w in group:
                        w.error = exc
                    continue
            else:
                judge(group)
            ok = [w for w in group if w.error is None]
            if not ok:
                continue
            try:
                self._record_group(ok, arrays if len(ok) == len(group) else None)
            except BaseException as exc:  # delivered to the waiting requests
                for w in ok:
                    w.error = exc
        for w in works:
            w.done = True

    def _record_group(self, works: list[JudgeWork], arrays: Arrays | None) -> None:
        rt = works[0].rt
        features, probabilities, predicted = concatenated(works, self._rows) if arrays is None else arrays
        if len(works) == 1:
            w = works[0]
            verdicts = np.asarray(w.verdicts, dtype=np.int8)
            tdi_rules = w.tdi_rules
        else:
            verdicts = np.concatenate([np.asarray(w.verdicts, dtype=np.int8) for w in works])
            rules = [w.tdi_rules for w in works]
            tdi_rules = None if any(r is None for r in rules) else np.concatenate(rules)  # type: ignore[arg-type]
        if self.input_sinks:
            inputs = [w.inputs for w in works if w.inputs is not None]  # request by request: no copy of them
            if inputs:
                for input_sink in self.input_sinks:
                    input_sink(rt, inputs)
        # the inputs of the full shift_aware model (margins, TDI leaves, input PCA error), O(N)
        extras = sample_extras(rt.calibration, probabilities, predicted, features, tdi_rules)
        stats, conf, correct = judged_stats(rt, probabilities, predicted, verdicts, extras)
        shift = rt.calibration.shift
        # every prediction's segment in each dimension fixed at fit (a few numpy operations per dimension)
        segments = rt.calibration.segments
        ids = segment_ids(segments, features, predicted, tdi_rules, len(verdicts))
        change = None
        if segments is not None and ids is not None:
            stats.add_segment_sums(ids, segments.size, conf, verdicts, novel_inputs(rt.calibration, extras))
            # what changed where: the change columns' sums per segment (the sketch's linear read of the rows)
            change = segments.change_values(features)
            stats.add_change_values(segments, ids, change)
        # the count window keeps the vectors themselves (size × K floats): only within the class cap
        per_class = len(rt.classes) <= self.metrics.per_class_label_cap
        self.windows.record(
            verdicts,
            conf,
            rt.calibration,
            time.time(),
            stats=stats,
            extras=extras,
            probabilities=probabilities if per_class else None,
            labels=predicted,
            segments=ids,
            change=change,
        )
        counts = np.bincount(verdicts.astype(np.int64), minlength=len(VERDICTS)).tolist()
        class_counts = (
            np.bincount(predicted.astype(np.int64), minlength=len(rt.classes)).tolist() if per_class else None
        )
        # flattened into its series at scrape time, not per batch
        self.metrics.add_window_stats(
            rt.name,
            rt.version,
            rt.bundle_label,
            stats,
            _flattener(per_class, shift is None or shift.reference.leaf_bins > 0),
        )
        self.metrics.record_batch(
            rt.name,
            rt.version,
            counts,
            class_counts,
            rt.classes,
            [w.inference_seconds for w in works if w.inference_seconds is not None],
            [w.oracle_seconds for w in works if w.oracle_seconds is not None],
        )
        if self.judged_sinks or self.judged_group_sinks:
            self._deliver(rt, works, extras_columns(extras) if extras is not None else None, correct, ids)

    def _deliver(
        self, rt: Runtime, works: list[JudgeWork], cols: np.ndarray | None, correct: np.ndarray, ids: np.ndarray | None
    ) -> None:
        """Hand each judged request with an id to the judged-batch sinks, then all of them to the group
        sinks; ``cols``: the group's extras columns ``[N, 5]``, ``correct``: its predictor and ``ids``: its
        segment ids ``[D, N]``, sliced per request."""
        now = time.time()
        start = 0
        batches = []
        for w in works:
            n = w.n
            part = cols[start : start + n] if cols is not None else None
            f = correct[start : start + n]
            seg = ids[:, start : start + n] if ids is not None else None
            start += n
            if w.request_id is not None and w.verdicts is not None:
                batches.append(
                    JudgedBatch(
                        rt,
                        w.request_id,
                        now,
                        w.probabilities,
                        w.predicted,
                        w.verdicts,
                        part,
                        w.inputs,
                        w.metadata,
                        seg,
                        f,
                    )
                )
        for batch in batches:
            for judged_sink in self.judged_sinks:
                judged_sink(batch)
        if batches:
            for group_sink in self.judged_group_sinks:
                group_sink(batches)


@functools.lru_cache(maxsize=8)
def _flattener(classes: bool, inputs: bool) -> Callable[[WindowStats], Iterator[tuple[str, float]]]:
    """The exported series of a window statistic (:func:`stat_items`, per-segment sums only of the segments
    with a prediction); one object per way, as :meth:`AgentMetrics.add_window_stats` keeps a sum per way."""
    return functools.partial(stat_items, classes=classes, inputs=inputs, sparse_segments=True)
