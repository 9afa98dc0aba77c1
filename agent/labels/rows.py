"""The values the prediction store takes and gives back, and how a stored request row decodes.

:class:`PendingBatch` is a judged request queued for writing; :class:`LabeledRows` the labeled
predictions the realized windows and recalibration read; :class:`LabelOutcome` what applying labels
did; :class:`RequestRow` one ``requests`` row of :mod:`agent.labels.store`, its BLOB arrays decoded
on demand. The per-sample extras codec (:data:`agent.estimation.statistics.window.EXTRAS_FIELDS`) fixes the
``extras`` column layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from agent.errors import DamagedData
from agent.estimation.statistics.extras_columns import EXTRAS_DTYPE as _EXTRAS_DTYPE
from agent.estimation.statistics.extras_columns import EXTRAS_FIELDS, extras_from_columns
from agent.estimation.statistics.window import SampleExtras
from agent.protocol.v2 import MAX_REQUEST_ID_BYTES

#: dtype of the ``predicted`` BLOB of a ``requests`` row (one little-endian int32 per prediction)
PREDICTED_DTYPE = "<i4"
#: dtype of the ``sampled`` BLOB of a ``requests`` row (the indices in the labeling sample)
SAMPLED_DTYPE = "<i4"
#: dtype of the segment numbers kept for the labeling sample (``requests.sampled_seg``, ``labels.segments``)
SEGMENTS_DTYPE = "<i4"

#: ``(seq, rid, lo, hi, ts, sampled)`` of a request row with predictions in the labeling sample
SampleRow = tuple[int, str, int, int, float, Any]


class CorruptRow(DamagedData, ValueError):
    """A stored row whose BLOBs do not match its counts (a damaged page of the file)."""


def storable_text(text: str) -> bool:
    """Whether every backend can store ``text``: it must encode as UTF-8 (a lone surrogate such as
    ``"\\ud800"`` cannot, and would make the whole transaction fail) and hold no NUL character
    (PostgreSQL's text cannot)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def batch_problem(b: PendingBatch) -> str | None:
    """Why a queued batch cannot be written (``None`` when it can): text that UTF-8 cannot encode, or
    arrays whose lengths disagree. Checked per batch so that one bad request drops only itself."""
    if not (storable_text(b.request_id) and storable_text(b.identity)):
        return "text that is not UTF-8 encodable or holds a NUL character"
    if len(b.request_id) > MAX_REQUEST_ID_BYTES:  # characters ≤ bytes: the decoders bound the bytes
        return f"a request id longer than {MAX_REQUEST_ID_BYTES} characters"
    n = b.n
    probs = np.size(b.probabilities)
    if n == 0 or np.size(b.verdicts) != n or probs == 0 or probs % n:
        return "arrays of inconsistent lengths"
    if b.sampled is not None and np.size(b.sampled) and not bool(((b.sampled >= 0) & (b.sampled < n)).all()):
        return "labeling sample indices outside the request"
    if b.sampled_segments is not None and (
        b.sampled is None or np.ndim(b.sampled_segments) != 2 or len(b.sampled_segments) != np.size(b.sampled)
    ):
        return "segment numbers that do not match the labeling sample"
    return None


def sample_indices(blob: object, lo: int, hi: int) -> np.ndarray:
    """The labeling-sample indices a ``sampled`` BLOB holds, those in ``[lo, hi)`` (not evicted) only."""
    if not isinstance(blob, bytes) or len(blob) % 4:
        return np.zeros(0, dtype=np.int64)
    idx = np.frombuffer(blob, dtype=SAMPLED_DTYPE).astype(np.int64)
    return idx[(idx >= lo) & (idx < hi)]


#: the labels table's columns that :meth:`LabeledRows.from_selected` reads, in its order (both backends' tables)
LABELED_COLUMNS = (
    "ts, verdict, confidence, correct, abs_err, sq_err, k, extras, predicted, sampled, label, draw_p, segments, source"
)


def segments_blob(ids: np.ndarray | None) -> bytes | None:
    """One prediction's segment numbers (one per dimension of the bundle's segmentation) as stored."""
    return None if ids is None or not np.size(ids) else np.asarray(ids, dtype=SEGMENTS_DTYPE).reshape(-1).tobytes()


def segments_of_blob(blob: object) -> np.ndarray | None:
    """The segment numbers a ``labels.segments`` BLOB holds (None: not kept, or damaged)."""
    if isinstance(blob, memoryview):
        blob = bytes(blob)
    if not isinstance(blob, bytes) or not blob or len(blob) % 4:
        return None
    return np.frombuffer(blob, dtype=SEGMENTS_DTYPE).astype(np.int64)


def segment_matrix(rows: Sequence[np.ndarray | None]) -> np.ndarray:
    """Per labeled prediction its segment numbers, int64 ``[N, D]``; a row without them (or with another
    count of dimensions than the widest: another bundle's) is all -1."""
    width = max((len(r) for r in rows if r is not None), default=0)
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        if r is not None and len(r) == width:
            out[i] = r
    return out


def _extras_blob(row: np.ndarray | None) -> bytes | None:
    return None if row is None else np.asarray(row, dtype=_EXTRAS_DTYPE).tobytes()


def _extras_row(blob: object) -> np.ndarray:
    if isinstance(blob, bytes) and len(blob) == 8 * len(EXTRAS_FIELDS):
        return np.frombuffer(blob, dtype=_EXTRAS_DTYPE).astype(np.float64)
    return np.full(len(EXTRAS_FIELDS), np.nan)


@dataclass(frozen=True)
class PendingBatch:
    """One judged request waiting to be written."""

    request_id: str
    timestamp: float
    identity: str
    probabilities: np.ndarray
    #: the predicted classes
    predicted: np.ndarray
    verdicts: np.ndarray
    #: The inputs of the full ``shift_aware`` model, when the runtime computed them: as
    #: :class:`SampleExtras` or as their float64 ``[n, 5]`` columns (:func:`extras_columns`).
    extras: SampleExtras | np.ndarray | None = None
    #: the indices of the request's predictions drawn into the labeling sample (None: none drawn)
    sampled: np.ndarray | None = None
    #: the request's inputs by name, one row per prediction, when the inputs of sampled predictions are kept
    #: (``labels.keep_sampled_inputs``); encoded by the store's writer, off the request path
    inputs: Mapping[str, np.ndarray] | None = None
    #: the probability each of ``sampled`` was drawn with (same order; None: not kept)
    sampled_p: np.ndarray | None = None
    #: the segment numbers of each of ``sampled``, ``[len(sampled), D]`` (None: the bundle has no segments)
    sampled_segments: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.predicted)


@dataclass(frozen=True)
class LabeledRows:
    """Labeled predictions (arrays of equal length), e.g. for the realized windows or recalibration."""

    timestamp: np.ndarray  # prediction time (s since the epoch)
    verdict: np.ndarray  # int8, index into VERDICTS
    confidence: np.ndarray  # top-class probability
    correct: np.ndarray  # bool: predicted class == true class
    abs_err: np.ndarray  # sum over classes of |p_k - onehot_k|
    sq_err: np.ndarray  # sum over classes of (p_k - onehot_k)^2
    n_classes: np.ndarray  # K of each prediction
    #: float64 [N, 5]: the stored :class:`SampleExtras` (columns :data:`EXTRAS_FIELDS`), NaN rows where
    #: the prediction has none (``None`` given: all NaN)
    extras: np.ndarray | None = None
    #: int64 [N]: the predicted class, -1 where unknown (``None`` given: all unknown)
    predicted: np.ndarray | None = None
    #: bool [N]: whether the prediction was drawn into the labeling sample (``None`` given: none was)
    sampled: np.ndarray | None = None
    #: int64 [N]: the true class (``None`` given: all unknown, -1)
    label: np.ndarray | None = None
    #: float64 [N]: the probability the prediction was drawn into the labeling sample with, NaN where
    #: unknown (not drawn, or stored before draw probabilities were kept; ``None`` given: all NaN)
    draw_probability: np.ndarray | None = None
    #: int64 [N, D]: the prediction's segment number in each dimension of the bundle's segmentation, kept
    #: for the labeling sample; -1 where unknown (``None`` given: none known, ``D = 0``)
    segments: np.ndarray | None = None
    #: object [N]: who gave each label (its source, ``""`` where unknown: stored before sources were kept;
    #: ``None`` given: all unknown), what ``labels.max_source_share`` caps (:mod:`agent.labels.source_cap`)
    source: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.extras is None:
            object.__setattr__(self, "extras", np.full((len(self.timestamp), len(EXTRAS_FIELDS)), np.nan))
        if self.predicted is None:
            object.__setattr__(self, "predicted", np.full(len(self.timestamp), -1, dtype=np.int64))
        if self.sampled is None:
            object.__setattr__(self, "sampled", np.zeros(len(self.timestamp), dtype=bool))
        if self.label is None:
            object.__setattr__(self, "label", np.full(len(self.timestamp), -1, dtype=np.int64))
        if self.draw_probability is None:
            object.__setattr__(self, "draw_probability", np.full(len(self.timestamp), np.nan))
        if self.segments is None:
            object.__setattr__(self, "segments", np.full((len(self.timestamp), 0), -1, dtype=np.int64))
        if self.source is None:
            object.__setattr__(self, "source", np.full(len(self.timestamp), "", dtype=object))

    @property
    def n(self) -> int:
        return len(self.timestamp)

    def sample_extras(self) -> SampleExtras | None:
        """The extras of every row, or None when any row has none (the reduced model applies then).
        They carry the predicted classes when every row has one (else the *inputs* model applies)."""
        cols = self.extras
        if cols is None or self.n == 0 or np.isnan(cols).any():
            return None
        extras = extras_from_columns(cols)
        pred = self.predicted
        if pred is not None and len(pred) == self.n and bool((pred >= 0).all()):
            extras = replace(extras, label=np.asarray(pred, dtype=np.int64))
        return extras

    @classmethod
    def empty(cls) -> LabeledRows:
        z = np.zeros(0)
        return cls(z, np.zeros(0, np.int8), z, np.zeros(0, bool), z, z, np.zeros(0, np.int64))

    @classmethod
    def from_selected(cls, rows: Sequence[Sequence[Any]]) -> LabeledRows:
        """From rows of the labels table selected as :data:`LABELED_COLUMNS`, newest first as both backends
        read them (returned oldest first). The extras blob may come as a ``memoryview`` (PostgreSQL)."""
        rows = list(reversed(rows))
        return cls.from_tuples(
            [(r[0], r[1], r[2], bool(r[3]), r[4], r[5], r[6]) for r in rows],
            [_extras_row(bytes(r[7]) if isinstance(r[7], memoryview) else r[7]) for r in rows],
            [r[8] for r in rows],
            [bool(r[9]) for r in rows],
            [int(r[10]) for r in rows],
            [r[11] for r in rows],
            [segments_of_blob(r[12]) for r in rows],
            ["" if r[13] is None else str(r[13]) for r in rows],
        )

    @classmethod
    def from_tuples(
        cls,
        rows: Sequence[tuple[float, int, float, bool, float, float, int]],
        extras: Sequence[np.ndarray] | None = None,
        predicted: Sequence[int | None] | None = None,
        sampled: Sequence[bool] | None = None,
        label: Sequence[int] | None = None,
        draw_probability: Sequence[float | None] | None = None,
        segments: Sequence[np.ndarray | None] | None = None,
        source: Sequence[str] | None = None,
    ) -> LabeledRows:
        """From ``(ts, verdict, confidence, correct, abs_err, sq_err, n_classes)`` rows and, optionally,
        one extras row (5 floats, NaN when absent), one predicted class (None when unknown), whether it
        is in the labeling sample, its true class, its draw probability, its segment numbers and its label's
        source per row."""
        if not rows:
            return cls.empty()
        ts, v, c, ok, a, s, k = zip(*rows, strict=True)
        return cls(
            np.asarray(ts, np.float64),
            np.asarray(v, np.int8),
            np.asarray(c, np.float64),
            np.asarray(ok, bool),
            np.asarray(a, np.float64),
            np.asarray(s, np.float64),
            np.asarray(k, np.int64),
            np.asarray(extras, np.float64).reshape(len(rows), len(EXTRAS_FIELDS)) if extras is not None else None,
            np.asarray([-1 if v is None else v for v in predicted], np.int64) if predicted is not None else None,
            np.asarray(sampled, bool).reshape(len(rows)) if sampled is not None else None,
            np.asarray(label, np.int64).reshape(len(rows)) if label is not None else None,
            np.asarray([np.nan if p is None else p for p in draw_probability], np.float64)
            if draw_probability is not None
            else None,
            segment_matrix(segments) if segments is not None else None,
            np.asarray(list(source), dtype=object).reshape(len(rows)) if source is not None else None,
        )


def onehot_errors(probabilities: np.ndarray, label: int) -> tuple[float, float]:
    """``(sum_k |p_k − y_k|, sum_k (p_k − y_k)²)`` for one probability vector and its one-hot truth
    ``y`` (BenchMetrics Prob's absolute and squared error per instance, summed over the classes)."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    d = p.copy()
    if 0 <= label < len(d):
        d[label] -= 1.0
    return float(np.abs(d).sum()), float((d * d).sum())


@dataclass(frozen=True)
class LabelOutcome:
    """What :meth:`PredictionStore.apply_labels` did with each id."""

    accepted: list[tuple[str, LabeledRows]]  # per model identity, the newly labeled predictions
    n_accepted: int
    unknown: list[str]
    duplicate: list[str]
    #: ids whose earlier label this one replaced (``replace``: an authorized labeler's correction)
    corrected: list[str] = field(default_factory=list)


def prediction_id(request_id: str, index: int) -> str:
    """The id of prediction ``index`` of request ``request_id`` (``<request id>:<index>``)."""
    return f"{request_id}:{index}"


def split_prediction_id(pid: str) -> tuple[str, int]:
    """``<request id>:<index>`` → ``(request id, index)``; an id without an integer suffix maps to
    ``(id, -1)``, which no prediction of a new request has (it can only match a converted old row)."""
    rid, sep, tail = pid.rpartition(":")
    if sep and tail.isdigit() and len(tail) <= 9:
        return rid, int(tail)
    return pid, -1


@dataclass
class RequestRow:
    """One ``requests`` row, its arrays decoded on first use."""

    seq: int
    rid: str
    start: int
    lo: int
    hi: int
    ts: float
    identity: str
    k: int
    predicted_blob: bytes
    verdict_blob: bytes
    probs_blob: bytes
    extras_blob: bytes | None
    #: little-endian int32 indices of the request's predictions in the labeling sample (None: none)
    sampled_blob: bytes | None = None
    #: little-endian float64 draw probabilities of those indices, same order (None: not kept)
    sampled_p_blob: bytes | None = None
    #: little-endian int32 segment numbers of those indices, ``[len(sampled), D]`` row-major (None: not kept)
    sampled_seg_blob: bytes | None = None

    @classmethod
    def of(cls, r: Sequence[Any]) -> RequestRow:
        return cls(int(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), float(r[5]), str(r[6]), int(r[7]), *r[8:])

    def holds(self, idx: int) -> bool:
        return self.lo <= idx < self.hi

    def sampled(self) -> np.ndarray:
        """The indices of this row's live predictions that are in the labeling sample."""
        return sample_indices(self.sampled_blob, self.lo, self.hi)

    def draw_probability(self, idx: int) -> float | None:
        """The probability prediction ``idx`` was drawn into the labeling sample with (None: not drawn,
        or not kept)."""
        if not isinstance(self.sampled_blob, bytes) or not isinstance(self.sampled_p_blob, bytes):
            return None
        idx_all = np.frombuffer(self.sampled_blob, dtype=SAMPLED_DTYPE) if len(self.sampled_blob) % 4 == 0 else None
        if idx_all is None or len(self.sampled_p_blob) != 8 * len(idx_all):
            return None
        hit = np.flatnonzero(idx_all == idx)
        if not len(hit):
            return None
        p = float(np.frombuffer(self.sampled_p_blob, dtype="<f8")[hit[0]])
        return p if 0.0 < p <= 1.0 else None

    def segments(self, idx: int) -> np.ndarray | None:
        """The segment numbers of sampled prediction ``idx`` (None: not drawn, or not kept)."""
        blob = self.sampled_seg_blob
        if isinstance(blob, memoryview):
            blob = bytes(blob)
        if not isinstance(self.sampled_blob, bytes) or not isinstance(blob, bytes) or len(self.sampled_blob) % 4:
            return None
        idx_all = np.frombuffer(self.sampled_blob, dtype=SAMPLED_DTYPE)
        if not len(idx_all) or len(blob) % (4 * len(idx_all)):
            return None
        hit = np.flatnonzero(idx_all == idx)
        if not len(hit):
            return None
        d = len(blob) // (4 * len(idx_all))
        return np.frombuffer(blob, dtype=SEGMENTS_DTYPE, count=d, offset=4 * d * int(hit[0])).astype(np.int64)

    def prediction(self, idx: int) -> tuple[int, int, np.ndarray, np.ndarray]:
        """``(predicted class, verdict, probabilities [K], extras row [5] (NaN when none))`` of index ``idx``."""
        j = idx - self.start
        k = self.k
        m = self.hi - self.start
        blobs = (self.predicted_blob, self.verdict_blob, self.probs_blob)
        if not all(isinstance(b, bytes) for b in blobs) or (
            len(self.predicted_blob),
            len(self.verdict_blob),
            len(self.probs_blob),
        ) != (4 * m, m, 4 * k * m):
            raise CorruptRow(f"stored request {self.rid!r} has arrays that do not match its {m} predictions")
        predicted = int(np.frombuffer(self.predicted_blob, dtype=PREDICTED_DTYPE, count=1, offset=4 * j)[0])
        verdict = int(np.frombuffer(self.verdict_blob, dtype=np.int8, count=1, offset=j)[0])
        probs = np.frombuffer(self.probs_blob, dtype="<f4", count=k, offset=4 * k * j)
        n_ext = len(EXTRAS_FIELDS)
        if isinstance(self.extras_blob, bytes) and len(self.extras_blob) == 8 * n_ext * (self.hi - self.start):
            ext = np.frombuffer(self.extras_blob, dtype=_EXTRAS_DTYPE, count=n_ext, offset=8 * n_ext * j)
        else:
            ext = np.full(n_ext, np.nan)
        return predicted, verdict, probs, ext.astype(np.float64)
