"""Judging: the oracle's verdicts for the predictions of one or many requests, in as few oracle calls
as possible.

A :class:`JudgeWork` is one request's predictions on their way through judging; :func:`judge` gives
works their verdicts and TDI leaves (one oracle call per runtime for works without per-request
metadata, whose IDI rules differ per request). The oracle is stateless, so this takes no lock and
records nothing: recording (windows, metrics, the prediction store) is
:class:`~agent.judging.recorder.Recorder`'s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.judging.runtime import Runtime
from agent.model.inputs import Inputs


@dataclass(eq=False)
class JudgeWork:
    """One request's predictions waiting for the oracle, then for recording."""

    rt: Runtime
    features: np.ndarray
    probabilities: np.ndarray
    #: The predicted classes (indices into ``rt.classes``).
    predicted: np.ndarray
    metadata: Mapping[str, Any] | None
    inference_seconds: float | None
    #: The request id: its predictions are ``<request_id>:<index>`` (``None``: not recorded for labels).
    request_id: str | None = None
    verdicts: np.ndarray | None = None
    #: The TDI leaf (rule) index of each prediction, set with ``verdicts`` by the oracle.
    tdi_rules: np.ndarray | None = None
    #: Wall seconds of the oracle call that judged this work, on the first work of that call only.
    oracle_seconds: float | None = None
    error: BaseException | None = None
    #: Recorded (or failed): set by the recorder, read by whoever waits for the work.
    done: bool = False
    #: The prepared inputs of these predictions, for the input sinks (the audits' reservoir).
    inputs: Inputs | None = None

    @property
    def n(self) -> int:
        return len(self.predicted)

    @property
    def nbytes(self) -> int:
        """The bytes its features and prepared inputs hold (what waiting to be recorded keeps in memory)."""
        held = self.features.nbytes + self.probabilities.nbytes
        if self.inputs is not None:
            held += sum(a.nbytes for a in self.inputs.values())
        return int(held)

    def verdicts_or_raise(self) -> np.ndarray:
        """The work's verdicts; its judging error raised when it failed."""
        if self.error is not None:
            raise self.error
        assert self.verdicts is not None
        return self.verdicts


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]


#: The most bytes of feature rows a :class:`RowBuffer` keeps per row shape (larger calls get arrays of their own).
ROW_BUFFER_BYTES = 16 << 20
#: The most row shapes (runtimes of different views) a :class:`RowBuffer` keeps a buffer for.
ROW_BUFFER_SHAPES = 4


class RowBuffer:
    """Reused arrays for the feature rows of many works concatenated, one per row shape and dtype.

    A fresh array per recording call costs a page fault per 4 KiB touched in a worker thread, whose allocator
    hands freed memory back to the system: several times the copy itself (a group of MNIST requests of 32 images
    faulted 25 times per request, and its concatenation cost a fifth of the judge's CPU). What :meth:`rows`
    returns is overwritten by its next call: it is read only while its works are recorded (the recorder is
    called under one lock). A buffer holds at most :data:`ROW_BUFFER_BYTES`; larger calls get an array of their
    own, so that a burst of large inputs holds no memory once it is recorded."""

    def __init__(self, limit_bytes: int = ROW_BUFFER_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self._buffers: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}

    def rows(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        """``parts`` (arrays of rows of one shape) one after the other."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        shape, dtype = first.shape[1:], first.dtype
        row_bytes = max(1, math.prod(shape) * dtype.itemsize)
        n = sum(len(p) for p in parts)
        if n * row_bytes > self.limit_bytes or any(p.shape[1:] != shape or p.dtype != dtype for p in parts[1:]):
            return np.concatenate(parts)
        key = (dtype.str, shape)
        buf = self._buffers.get(key)
        if buf is None:  # allocated once at its full size: the pages never touched stay out of memory
            if len(self._buffers) >= ROW_BUFFER_SHAPES:
                self._buffers.pop(next(iter(self._buffers)))
            buf = self._buffers[key] = np.empty((self.limit_bytes // row_bytes, *shape), dtype)
        return np.concatenate(parts, out=buf[:n])


def concatenated(works: Sequence[JudgeWork], rows: RowBuffer | None = None) -> Arrays:
    """The features, probabilities and predicted classes of ``works``, one after the other (a single
    work's own arrays, uncopied); the features in ``rows``' buffer when given."""
    if len(works) == 1:
        w = works[0]
        return w.features, w.probabilities, w.predicted
    features = [w.features for w in works]
    return (
        rows.rows(features) if rows is not None else np.concatenate(features),
        np.concatenate([w.probabilities for w in works]),
        np.concatenate([w.predicted for w in works]),
    )


def oracle_call(works: Sequence[JudgeWork], arrays: Arrays | None = None) -> None:
    """One oracle call for works of one runtime (several only without per-request metadata);
    ``arrays``: their :func:`concatenated` arrays, when the caller has them already."""
    rt = works[0].rt
    features, probabilities, predicted = concatenated(works) if arrays is None else arrays
    metadata = works[0].metadata if len(works) == 1 else None
    t0 = time.perf_counter()
    oracle = rt.oracle if metadata is not None or rt.oracle_no_metadata is None else rt.oracle_no_metadata
    result, tdi_rules = oracle.judge_with_rules(
        features, probabilities, predicted, metadata=metadata, feature_names=rt.bundle.feature_names
    )
    works[0].oracle_seconds = time.perf_counter() - t0
    verdicts = np.asarray(result.verdict, dtype=np.int8)
    start = 0
    for w in works:
        n = w.n
        w.verdicts = verdicts[start : start + n]
        w.tdi_rules = tdi_rules[start : start + n] if tdi_rules is not None else None
        start += n


def judge(works: Sequence[JudgeWork]) -> None:
    """Give every work without verdicts its ``verdicts`` (or its ``error``), in one oracle call per
    runtime for works without per-request metadata. Nothing is raised and nothing recorded."""
    groups: dict[int, list[JudgeWork]] = {}
    for w in works:
        if w.verdicts is None and w.error is None:
            groups.setdefault(id(w.rt) if w.metadata is None else id(w), []).append(w)
    for group in groups.values():
        try:
            oracle_call(group)
        except Exception as exc:  # delivered to the waiting requests; such works are not recorded
            for w in group:
                w.error = exc
