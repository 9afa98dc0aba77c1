"""Streaming windows of judged predictions, over time and over a count of predictions.

* :class:`TimeWindow` keeps :class:`~agent.estimation.statistics.window.WindowStats` in fixed time buckets
  (:class:`TimeBuckets`, shared with the paired windows of a challenger): a window of ``W`` seconds has
  about 60 buckets of ``W/60`` s, at least 1 s; buckets older than the window are dropped when new ones
  arrive or when the window is read. Its statistics cover the last ``W`` seconds to within one bucket.
* :class:`CountWindow` keeps the verdicts and confidences of the last ``N`` predictions in a ring
  buffer, so it is exact; its statistics are recomputed when read (``N`` is small). When the caller
  passes them (models within the per-class cap), it also keeps their probability vectors and predicted
  classes, from which the label-free per-class sums (``WindowStats.cbpe_*``) are recomputed, and every
  prediction's segment in each dimension of the bundle's segments (``WindowStats.seg_*``) with its change
  columns (``WindowStats.change_*``: what changed where).
* :class:`WindowSet` holds all windows of one model, is thread-safe, and (de)serialises itself for
  the state store.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Generic, Protocol, Self, TypeVar

import numpy as np

from agent.core.array_json import decode_array, encode_array, is_encoded
from agent.core.durations import parse_duration
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.statistics.window import SampleExtras, WindowStats

BUCKETS_PER_WINDOW = 60


def bucket_seconds_for(window_seconds: float) -> float:
    return max(1.0, window_seconds / BUCKETS_PER_WINDOW)


class Additive(Protocol):
    """Statistics summed bucket by bucket: copied to start a bucket, summed into it in place."""

    def copy(self) -> Self: ...

    def add_in_place(self, other: Self) -> None: ...


S = TypeVar("S", bound=Additive)


class TimeBuckets(Generic[S]):
    """Additive statistics of the last ``seconds`` seconds in fixed time buckets (``bucket_seconds``, by
    default :func:`bucket_seconds_for` the window); buckets older than the window are dropped when new ones
    arrive or when the window is read."""

    def __init__(self, seconds: float, bucket_seconds: float | None = None) -> None:
        self.seconds = float(seconds)
        self.bucket_seconds = float(bucket_seconds or bucket_seconds_for(seconds))
        self.n_buckets = max(1, math.ceil(self.seconds / self.bucket_seconds))
        self.buckets: dict[int, S] = {}

    def _index(self, t: float) -> int:
        return int(t // self.bucket_seconds)

    def _expire(self, now: float) -> None:
        oldest = self._index(now) - self.n_buckets + 1
        for k in [k for k in self.buckets if k < oldest]:
            del self.buckets[k]

    def add(self, stats: S, now: float) -> None:
        k = self._index(now)
        cur = self.buckets.get(k)
        if cur is None:
            self.buckets[k] = stats.copy()  # the bucket is summed into in place; ``stats`` is shared
        else:
            cur.add_in_place(stats)
        if len(self.buckets) > self.n_buckets:
            self._expire(now)

    def current(self, now: float) -> list[S]:
        """The buckets within the window at ``now``, oldest dropped first."""
        self._expire(now)
        return list(self.buckets.values())


class TimeWindow(TimeBuckets[WindowStats]):
    """Additive statistics of the predictions of the last ``seconds`` seconds (bucketed)."""

    def stats(self, now: float) -> WindowStats:
        total = WindowStats()
        for s in self.current(now):
            total = total + s
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "bucket_seconds": self.bucket_seconds,
            "buckets": [[k, s.to_dict()] for k, s in sorted(self.buckets.items())],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TimeWindow:
        w = cls(float(d["seconds"]), float(d["bucket_seconds"]))
        w.buckets = {int(k): WindowStats.from_dict(s) for k, s in d.get("buckets", [])}
        return w


def _extra_column(extras: SampleExtras, name: str, n: int) -> np.ndarray:
    value = getattr(extras, name)
    return np.full(n, -1, dtype=np.int64) if value is None else np.asarray(value)


def _extras_of_columns(cols: Sequence[np.ndarray]) -> SampleExtras:
    """The count window's extras columns as :class:`SampleExtras` (labels only when all are known)."""
    margin, rules, agree, covered, pca_error, label = cols
    return SampleExtras(margin, rules, agree, covered, pca_error, label if bool(np.all(label >= 0)) else None)


class CountWindow:
    """The last ``size`` predictions (ring buffer, exact): verdicts, confidences and, when the serve
    path computed them, the per-sample inputs of the full ``shift_aware`` model and the probability
    vectors with the predicted classes (the per-class sums; ``size × K`` float32, so only passed for
    models within the per-class cap)."""

    #: ``label`` is the predicted class, -1 where the caller did not pass it
    _EXTRA_FIELDS = ("margin", "rules", "agree", "covered", "pca_error", "label")
    _EXTRA_DTYPES: tuple[type, ...] = (np.float64, np.int64, np.bool_, np.bool_, np.float64, np.int64)

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.verdicts = np.zeros(self.size, dtype=np.int8)
        self.confidences = np.zeros(self.size, dtype=np.float64)
        self.extras: dict[str, np.ndarray] = {
            f: np.zeros(self.size, dtype=d) for f, d in zip(self._EXTRA_FIELDS, self._EXTRA_DTYPES, strict=True)
        }
        self.has_extras = np.zeros(self.size, dtype=bool)
        #: probability vectors ``[size, K]`` (K = 0 until a batch passes them) and predicted classes
        self.class_probs = np.zeros((self.size, 0), dtype=np.float32)
        self.class_labels = np.zeros(self.size, dtype=np.int64)
        self.has_classes = np.zeros(self.size, dtype=bool)
        #: segment numbers ``[size, D]`` (D = 0 until a batch passes them;
        #: :mod:`agent.estimation.segments.segmentation`)
        self.segment_ids = np.zeros((self.size, 0), dtype=np.int32)
        self.has_segments = np.zeros(self.size, dtype=bool)
        #: change columns ``[size, C]`` (C = 0 until a batch passes them;
        #: :meth:`~agent.estimation.segments.segmentation.Segmentation.change_values`), float32
        self.change = np.zeros((self.size, 0), dtype=np.float32)
        self.has_change = np.zeros(self.size, dtype=bool)
        self.pos = 0  # next write position
        self.count = 0  # filled slots

    def _columns(self, verdicts: np.ndarray, confidences: np.ndarray, extras: SampleExtras | None) -> list[np.ndarray]:
        n = len(verdicts)
        cols: list[np.ndarray] = [verdicts, confidences]
        if extras is not None and len(extras.margin) == n:
            cols += [_extra_column(extras, f, n) for f in self._EXTRA_FIELDS] + [np.ones(n, dtype=bool)]
        else:
            cols += [np.zeros(n, dtype=d) for d in self._EXTRA_DTYPES] + [np.zeros(n, dtype=bool)]
        return cols

    def _class_columns(self, n: int, probabilities: np.ndarray | None, labels: np.ndarray | None) -> list[np.ndarray]:
        """The per-class columns of a batch; a batch of another class count restarts them (a window
        never mixes vectors of two widths)."""
        p = None if probabilities is None or labels is None else np.asarray(probabilities, dtype=np.float32)
        lab = None if labels is None else np.asarray(labels, dtype=np.int64).reshape(-1)
        if p is None or lab is None or n == 0 or len(p) != n or len(lab) != n:
            k = self.class_probs.shape[1]
            return [np.zeros((n, k), dtype=np.float32), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)]
        p = p.reshape(n, -1)
        if p.shape[1] != self.class_probs.shape[1]:
            self.class_probs = np.zeros((self.size, p.shape[1]), dtype=np.float32)
            self.has_classes[:] = False
        return [p, lab, np.ones(n, dtype=bool)]

    def _segment_columns(self, n: int, segments: np.ndarray | None) -> list[np.ndarray]:
        """The segment columns of a batch (``segments`` ``[D, N]``); a batch of another dimension count
        restarts them."""
        if segments is None or n == 0 or segments.ndim != 2 or segments.shape[1] != n:
            d = self.segment_ids.shape[1]
            return [np.zeros((n, d), dtype=np.int32), np.zeros(n, dtype=bool)]
        if segments.shape[0] != self.segment_ids.shape[1]:
            self.segment_ids = np.zeros((self.size, segments.shape[0]), dtype=np.int32)
            self.has_segments[:] = False
        return [segments.T, np.ones(n, dtype=bool)]

    def _change_columns(self, n: int, change: np.ndarray | None) -> list[np.ndarray]:
        """The change columns of a batch (``change`` ``[N, C]``); a batch of another width restarts them."""
        if change is None or n == 0 or change.ndim != 2 or len(change) != n:
            return [np.zeros((n, self.change.shape[1]), dtype=np.float32), np.zeros(n, dtype=bool)]
        if change.shape[1] != self.change.shape[1]:
            self.change = np.zeros((self.size, change.shape[1]), dtype=np.float32)
            self.has_change[:] = False
        return [change, np.ones(n, dtype=bool)]

    def _sample_buffers(self) -> list[np.ndarray]:
        return [self.verdicts, self.confidences, *(self.extras[f] for f in self._EXTRA_FIELDS), self.has_extras]

    def _buffers(self) -> list[np.ndarray]:
        return [
            *self._sample_buffers(),
            self.class_probs,
            self.class_labels,
            self.has_classes,
            self.segment_ids,
            self.has_segments,
            self.change,
            self.has_change,
        ]

    def add(
        self,
        verdicts: np.ndarray,
        confidences: np.ndarray,
        extras: SampleExtras | None = None,
        probabilities: np.ndarray | None = None,
        labels: np.ndarray | None = None,
        segments: np.ndarray | None = None,
        change: np.ndarray | None = None,
    ) -> None:
        """Keep a batch; ``probabilities`` ``[N, K]`` and ``labels`` (predicted classes) together give
        the window its per-class sums, ``segments`` (``[D, N]`` segment numbers) its per-segment sums and,
        with them, ``change`` (``[N, C]`` change columns) its per-segment change sums."""
        v = np.asarray(verdicts, dtype=np.int8).reshape(-1)
        c = np.asarray(confidences, dtype=np.float64).reshape(-1)
        cols = (
            self._columns(v, c, extras)
            + self._class_columns(len(v), probabilities, labels)
            + self._segment_columns(len(v), segments)
            + self._change_columns(len(v), change)
        )
        bufs = self._buffers()
        if len(v) >= self.size:
            for buf, col in zip(bufs, cols, strict=True):
                buf[:] = col[-self.size :]
            self.pos, self.count = 0, self.size
            return
        end = self.pos + len(v)
        for buf, col in zip(bufs, cols, strict=True):
            if end <= self.size:
                buf[self.pos : end] = col
            else:
                first = self.size - self.pos
                buf[self.pos :] = col[:first]
                buf[: end - self.size] = col[first:]
        self.pos = end % self.size
        self.count = min(self.size, self.count + len(v))

    def _filled(self) -> tuple[np.ndarray, np.ndarray]:
        """Verdicts and confidences of the filled slots (ring order)."""
        return self.verdicts[: self.count], self.confidences[: self.count]

    def _ordered(self, buffers: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Every buffer (or ``buffers``), oldest first, filled slots only."""
        bufs = self._buffers() if buffers is None else buffers
        if self.count < self.size:
            return [b[: self.count] for b in bufs]
        return [np.concatenate([b[self.pos :], b[: self.pos]]) for b in bufs]

    def stats(self, calibration: EstimatorCalibration) -> WindowStats:
        if self.count == 0:
            return WindowStats()
        v, c, *ext, has = self._ordered(self._sample_buffers())  # the per-class sums need no ordering
        shift = calibration.shift
        if shift is not None and has.all():
            extras = _extras_of_columns(ext)
            out = WindowStats.of_samples(v, c, calibration.atc_threshold, extras, shift.reference)
            out.add_predictor_sums(calibration, c, v)
        else:
            out = WindowStats.from_batch(v, c, calibration)
        n = self.count  # the sums do not depend on the order: the filled slots as they lie
        if self.class_probs.shape[1] and self.has_classes[:n].all():
            out.add_class_sums(self.class_probs[:n], self.class_labels[:n])
        seg = calibration.segments
        if seg is not None and self.segment_ids.shape[1] == len(seg.dimensions) and self.has_segments[:n].all():
            novel = None
            if shift is not None and self.has_extras[:n].all() and shift.reference.pca_edges:
                novel = self.extras["pca_error"][:n] > shift.reference.pca_edges[-1]  # as novel_inputs reads it
            ids = self.segment_ids[:n].T
            out.add_segment_sums(ids, seg.size, self.confidences[:n], self.verdicts[:n], novel)
            if self.change.shape[1] and self.has_change[:n].all():
                out.add_change_values(seg, ids, self.change[:n].astype(np.float64))
        return out

    def to_dict(self) -> dict[str, Any]:
        """Its filled slots, oldest first, each column as its bytes (:mod:`agent.core.array_json`): a list of
        numbers would cost a Python object per number while saved, many times the window's own memory."""
        v, c, *ext, has, probs, labels, has_classes, seg_ids, has_segments, change, has_change = self._ordered()
        d: dict[str, Any] = {"size": self.size, "verdicts": encode_array(v), "confidences": encode_array(c)}
        if has.any():
            d["extras"] = {f: encode_array(col) for f, col in zip(self._EXTRA_FIELDS, ext, strict=True)}
            d["has_extras"] = encode_array(has)
        if probs.shape[1] and has_classes.all():
            d["classes"] = {"probabilities": encode_array(probs), "labels": encode_array(labels)}
        if seg_ids.shape[1] and has_segments.all():
            d["segments"] = encode_array(seg_ids)
            if change.shape[1] and has_change.all():
                d["change"] = encode_array(change)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], size: int | None = None) -> CountWindow:
        """Inverse of :meth:`to_dict`; states of older versions (columns as lists of numbers, some absent) load
        too. Raises ``ValueError`` for columns that do not fit each other."""
        w = cls(int(size or d["size"]))
        if not d.get("verdicts"):
            return w
        v = _column(d["verdicts"], np.int8, "verdicts")
        if not len(v):
            return w
        c = _column(d["confidences"], np.float64, "confidences")
        raw = d.get("extras")
        has = _column(d.get("has_extras") or [], bool, "has_extras")
        extras = None
        if isinstance(raw, Mapping) and len(has) == len(v) and has.all():
            cols: list[np.ndarray] = [
                _column(raw[f], t, f) if f in raw else np.full(len(v), -1, dtype=t)  # state of an older layout
                for f, t in zip(cls._EXTRA_FIELDS, cls._EXTRA_DTYPES, strict=True)
            ]
            extras = _extras_of_columns(cols)
        probs = labels = None
        saved = d.get("classes")  # absent from states of an older layout
        if isinstance(saved, Mapping) and saved.get("labels") is not None:
            labels = _column(saved["labels"], np.int64, "labels")
            if len(labels) == len(v):
                probs = _column(saved["probabilities"], np.float32, "probabilities").reshape(len(v), -1)
            else:
                labels = None
        segments = None
        rows = d.get("segments")  # absent from states of an older layout, or without segments
        if rows is not None:
            ids = _column(rows, np.int32, "segments")
            if len(ids) == len(v):
                segments = ids.reshape(len(v), -1).T
        change = None
        values = d.get("change")  # absent from states of an older layout, or without a change sketch
        if segments is not None and values is not None:
            z = _column(values, np.float32, "change")
            if len(z) == len(v):
                change = z.reshape(len(v), -1)
        w.add(v, c, extras, probs, labels, segments, change)
        return w


def _column(raw: Any, dtype: Any, what: str) -> np.ndarray:
    """A saved column: its encoded bytes (:func:`~agent.core.array_json.decode_array`) or, in states of older
    versions, a list of numbers."""
    if is_encoded(raw):
        return decode_array(raw, f"count window's {what}").astype(dtype, copy=False)
    if not isinstance(raw, list):
        raise ValueError(f"count window's {what}: neither an encoded array nor a list")
    return np.asarray(raw, dtype=dtype)


def count_window_name(size: int) -> str:
    return f"last{size}"


class WindowSet:
    """Every window of one model; ``record`` a judged batch, ``estimates`` on every window."""

    def __init__(self, time_windows: Mapping[str, float], count: int | None) -> None:
        self._lock = threading.Lock()
        self.time = {name: TimeWindow(sec) for name, sec in time_windows.items()}
        self.count_name = count_window_name(count) if count else None
        self.count = CountWindow(count) if count else None
        self.total = 0

    @property
    def names(self) -> list[str]:
        return [*self.time, *([self.count_name] if self.count_name else [])]

    def record(
        self,
        verdicts: np.ndarray,
        confidences: np.ndarray,
        calibration: EstimatorCalibration,
        now: float,
        stats: WindowStats | None = None,
        extras: SampleExtras | None = None,
        probabilities: np.ndarray | None = None,
        labels: np.ndarray | None = None,
        segments: np.ndarray | None = None,
        change: np.ndarray | None = None,
    ) -> WindowStats:
        """Add a judged batch (verdict indices and top-class probabilities; ``stats`` and ``extras``
        when the caller computed them, see :func:`agent.estimation.statistics.window.sample_extras`;
        ``probabilities`` and predicted ``labels`` when the count window is to report per-class
        figures: ``windows.count × K`` float32 more; ``segments``, the batch's ``[D, N]`` segment
        numbers, for the count window's per-segment sums, and ``change``, its ``[N, C]`` change columns, for its
        per-segment change sums: ``windows.count × C`` float32 more)."""
        s = stats if stats is not None else WindowStats.from_batch(verdicts, confidences, calibration)
        with self._lock:
            for w in self.time.values():
                w.add(s, now)
            if self.count is not None:
                self.count.add(verdicts, confidences, extras, probabilities, labels, segments, change)
            self.total += s.n
        return s

    def stats(self, calibration: EstimatorCalibration, now: float) -> dict[str, WindowStats]:
        with self._lock:
            out = {name: w.stats(now) for name, w in self.time.items()}
            if self.count is not None and self.count_name is not None:
                out[self.count_name] = self.count.stats(calibration)
        return out

    def reset(self) -> None:
        with self._lock:
            for w in self.time.values():
                w.buckets.clear()
            if self.count is not None:
                self.count = CountWindow(self.count.size)
            self.total = 0

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "time": {name: w.to_dict() for name, w in self.time.items()},
                "count": self.count.to_dict() if self.count is not None else None,
                "total": self.total,
            }

    def restore(self, d: Mapping[str, Any]) -> None:
        """Restore saved windows; windows no longer configured are ignored, new ones start empty."""
        with self._lock:
            for name, wd in (d.get("time") or {}).items():
                if name in self.time and float(wd.get("seconds", -1)) == self.time[name].seconds:
                    self.time[name] = TimeWindow.from_dict(wd)
            cd = d.get("count")
            if self.count is not None and cd:
                self.count = CountWindow.from_dict(cd, size=self.count.size)
            self.total = int(d.get("total", 0))


def parse_windows(names: Sequence[str]) -> dict[str, float]:
    return {n: parse_duration(n) for n in names}
