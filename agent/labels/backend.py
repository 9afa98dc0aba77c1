"""What a prediction-store backend does, and the join of labels to stored predictions they share.

:class:`agent.labels.store.PredictionStore` owns the queue, the writer thread and the durability
modes; a :class:`StoreBackend` owns the tables. Two exist: SQLite in the state directory
(:mod:`agent.labels.sqlite_backend`, the embedded default) and PostgreSQL shared by a fleet of
replicas (:mod:`agent.labels.postgres_backend`). Both hold the same tables (``requests``, ``labels``,
``calibration``; see :mod:`agent.labels.store`), so the join of a label to its prediction
(:func:`join_labels`) is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from agent.errors import Unavailable
from agent.labels.eviction import Retention
from agent.labels.kept_inputs import KeptInput, KeptMap
from agent.labels.rows import (
    CorruptRow,
    LabeledRows,
    LabelOutcome,
    PendingBatch,
    RequestRow,
    SampleRow,
    _extras_blob,
    onehot_errors,
    sample_indices,
    segments_blob,
    split_prediction_id,
    storable_text,
)
from agent.protocol.v2 import MAX_REQUEST_ID_BYTES

CHUNK = 500  # ids per SQL statement (well below SQLite's variable limit)
SAMPLE_PAGE = 500  # sampled request rows read per statement by unlabeled_sample
SAMPLE_PAGES = 20  # at most this many pages: a listing reads at most 10,000 request rows


class StoreUnavailable(Unavailable):
    """The store could not be read or written (the message says why)."""


class StoreUnreachable(StoreUnavailable):
    """The store's database cannot be reached now (a network database down or slow): a write is kept
    queued and tried again rather than dropped."""


class BackendCounts:
    """What both backends keep alike: the store's bounds, where failures are counted, and the running counts of
    stored predictions and labels (what :meth:`counts` answers without a query)."""

    def __init__(self, max_predictions: int, max_age_seconds: float, on_error: Callable[[str], None]) -> None:
        self.retention = Retention(max_predictions, max_age_seconds)
        self.on_error = on_error
        self.rows = 0
        self.labeled = 0

    def counts(self) -> tuple[int, int]:
        return self.rows, self.labeled


class StoreBackend(Protocol):
    """The tables of the prediction store (one implementation per database)."""

    #: whether predictions survive a restart of the agent
    persistent: bool
    #: whether other replicas write the same tables (their predictions and labels are visible here)
    shared: bool

    @property
    def location(self) -> str | None:
        """Where the store lives, safe to show (a path, or a URL with its password redacted)."""

    def open(self) -> None:
        """Open (and create or migrate) the tables."""

    def close(self) -> None: ...

    def write(self, batches: Sequence[PendingBatch]) -> int:
        """Insert these requests (replacing earlier ones of the same id) in one transaction; returns
        the predictions written. Raises :class:`StoreUnreachable` when it may succeed later."""

    def evict(self, now: float) -> int:
        """Delete predictions older than the age bound and the oldest beyond the count bound."""

    def counts(self) -> tuple[int, int]:
        """``(stored predictions, labeled predictions)`` as last known."""

    def apply_labels(
        self, labels: Sequence[tuple[str, int]], now: float, source: str, replace: bool
    ) -> tuple[LabelOutcome, list[str]]:
        """Join true classes to stored predictions, recording ``source`` and ``now`` with each (``replace``:
        a label replaces an earlier one of the same prediction); the outcome and the problems of
        damaged rows."""

    def drop_labels(self, source: str | None, since: float | None, until: float | None) -> int:
        """Delete the labels of ``source`` (any when None) given in ``[since, until)`` (label time);
        returns how many."""

    def labeled_rows(self, identity: str, since: float | None, limit: int | None) -> LabeledRows: ...

    def label_requests(self, identity: str, limit: int) -> list[tuple[str, float]]:
        """``(prediction id, prediction time)`` of the newest predictions of the labeling sample that
        have no label yet, newest first (see :func:`unlabeled_sample`)."""

    def keep_inputs(self, rows: Sequence[KeptInput], max_total_bytes: int) -> int:
        """Keep the inputs of sampled predictions already written; drop the oldest past
        ``max_total_bytes``; returns how many were dropped."""

    def kept_inputs(self, ids: Sequence[str]) -> KeptMap:
        """The kept inputs of these prediction ids (those that have some)."""

    def put_calibration(self, identity: str, value_json: str) -> None: ...

    def get_calibration(self, identity: str) -> str | None: ...

    def delete_calibration(self, identity: str) -> None: ...


LabelInsert = tuple[Any, ...]  # the values of INSERT_LABEL, in its column order


@dataclass
class JoinedLabels:
    """What :func:`join_labels` found: rows to insert into ``labels`` and how each id fared."""

    inserts: list[LabelInsert] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    duplicate: list[str] = field(default_factory=list)
    corrected: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    by_identity: dict[str, list[tuple[float, int, float, bool, float, float, int]]] = field(default_factory=dict)
    extras_by_identity: dict[str, list[np.ndarray]] = field(default_factory=dict)
    predicted_by_identity: dict[str, list[int | None]] = field(default_factory=dict)
    sampled_by_identity: dict[str, list[bool]] = field(default_factory=dict)
    label_by_identity: dict[str, list[int]] = field(default_factory=dict)
    draw_p_by_identity: dict[str, list[float | None]] = field(default_factory=dict)
    segments_by_identity: dict[str, list[np.ndarray | None]] = field(default_factory=dict)
    #: who gave these labels (one source per call)
    source: str = ""

    def add(
        self,
        identity: str,
        row: tuple[float, int, float, bool, float, float, int],
        extras: np.ndarray,
        predicted: int,
        sampled: bool,
        label: int,
        draw_p: float | None,
        segments: np.ndarray | None,
    ) -> None:
        """One newly labeled prediction of model ``identity``, for :meth:`outcome`'s rows."""
        self.by_identity.setdefault(identity, []).append(row)
        self.extras_by_identity.setdefault(identity, []).append(extras)
        self.predicted_by_identity.setdefault(identity, []).append(predicted)
        self.sampled_by_identity.setdefault(identity, []).append(sampled)
        self.label_by_identity.setdefault(identity, []).append(label)
        self.draw_p_by_identity.setdefault(identity, []).append(draw_p)
        self.segments_by_identity.setdefault(identity, []).append(segments)

    def outcome(self) -> LabelOutcome:
        accepted = [
            (
                k,
                LabeledRows.from_tuples(
                    v,
                    self.extras_by_identity[k],
                    self.predicted_by_identity[k],
                    self.sampled_by_identity[k],
                    self.label_by_identity[k],
                    self.draw_p_by_identity[k],
                    self.segments_by_identity[k],
                    [self.source] * len(v),
                ),
            )
            for k, v in self.by_identity.items()
        ]
        return LabelOutcome(accepted, len(self.inserts), self.unknown, self.duplicate, self.corrected)

    @property
    def new(self) -> int:
        """Labels of predictions that had none (corrections replace a label: the count stays)."""
        return len(self.inserts) - len(self.corrected)


def join_labels(
    labels: Sequence[tuple[str, int]],
    now: float,
    requests_by_id: Callable[[set[str]], dict[str, list[RequestRow]]],
    labeled_indices: Callable[[set[int]], set[tuple[int, int]]],
    insert: Callable[[list[LabelInsert], bool], None],
    *,
    source: str,
    replace: bool = False,
) -> JoinedLabels:
    """Join ``(prediction id, true class)`` pairs to the stored requests, :data:`CHUNK` ids at a time,
    inside the caller's transaction: ``requests_by_id`` and ``labeled_indices`` read, ``insert(rows,
    replacing)`` writes ``labels`` rows (``replacing``: over existing ones). An id of a request not
    stored (or evicted) is unknown; one already labeled is a duplicate (the first label stays), or with
    ``replace`` corrected (the newer label replaces it). A label keeps whether its prediction was drawn
    into the labeling sample when it was judged, its ``source`` and its time ``now``."""
    out = JoinedLabels(source=source)
    for first in range(0, len(labels), CHUNK):
        chunk = []
        for pid, label in labels[first : first + CHUNK]:
            if storable_text(pid):
                chunk.append((pid, label, *split_prediction_id(pid)))
            else:  # no stored prediction has an id that cannot be encoded
                out.unknown.append(pid)
        requests = requests_by_id({rid for _, _, rid, _ in chunk})
        done = labeled_indices({r.seq for rows in requests.values() for r in rows})
        in_sample = {(r.seq, int(i)) for rows in requests.values() for r in rows for i in r.sampled()}
        inserts: list[LabelInsert] = []
        replacing: list[LabelInsert] = []
        for pid, label, rid, idx in chunk:
            row = next((r for r in requests.get(rid, ()) if r.holds(idx)), None)
            if row is None:
                out.unknown.append(pid)
                continue
            corrects = (row.seq, idx) in done
            if corrects and not replace:
                out.duplicate.append(pid)
                continue
            try:
                predicted, verdict, probs, ext = row.prediction(idx)
            except CorruptRow as exc:
                out.corrupt.append(str(exc))
                out.unknown.append(pid)
                continue
            done.add((row.seq, idx))
            a, s = onehot_errors(probs, label)
            confidence = float(probs.max()) if len(probs) else 0.0
            correct = predicted == label
            sampled = (row.seq, idx) in in_sample
            draw_p = row.draw_probability(idx) if sampled else None
            segments = row.segments(idx) if sampled else None
            values = (row.seq, idx, row.identity, row.ts, verdict, confidence, int(correct), len(probs)) + (
                label,
                now,
                a,
                s,
                _extras_blob(None if np.isnan(ext).any() else ext),
                predicted,
                int(sampled),
                source,
                draw_p,
                segments_blob(segments),
            )
            (replacing if corrects else inserts).append(values)
            if corrects:
                out.corrected.append(pid)
            row_values = (row.ts, verdict, confidence, correct, a, s, len(probs))
            out.add(row.identity, row_values, ext, predicted, sampled, label, draw_p, segments)
        if inserts:
            insert(inserts, False)
        if replacing:
            insert(replacing, True)
        out.inserts += inserts + replacing
    return out


def label_filter(source: str | None, since: float | None, until: float | None) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause (``?`` placeholders) of the labels of ``source`` (any when None) given in
    ``[since, until)``, and its arguments."""
    clauses = ["labeled_at >= ?", "labeled_at < ?"]
    args: list[Any] = [
        float("-inf") if since is None else float(since),
        float("inf") if until is None else float(until),
    ]
    if source is not None:
        clauses.append("source = ?")
        args.append(source)
    return " AND ".join(clauses), args


def chunks(values: Iterable[Any], size: int = CHUNK) -> Iterable[list[Any]]:
    """``values`` in lists of at most ``size``."""
    batch: list[Any] = []
    for v in values:
        batch.append(v)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


#: At most this many bytes of ids in one listing of the labeling sample, whatever its ``limit``.
MAX_LISTING_BYTES = 1 << 20


def unlabeled_sample(
    page: Callable[[float, int], Sequence[SampleRow]],
    labeled_indices: Callable[[set[int]], set[tuple[int, int]]],
    limit: int,
) -> list[tuple[str, float]]:
    """The ids and times of at most ``limit`` sampled predictions without a label, newest first.

    ``page(ts, seq)`` returns up to :data:`SAMPLE_PAGE` request rows with sampled predictions that come
    before ``(ts, seq)`` in ``(ts, seq)`` order, newest first; at most :data:`SAMPLE_PAGES` pages are
    read, so a listing costs a bounded number of statements however many predictions wait."""
    out: list[tuple[str, float]] = []
    size = 0  # bytes of the ids listed: a listing is bounded in bytes as well as in rows
    before: tuple[float, int] = (float("inf"), 2**62)
    for _ in range(SAMPLE_PAGES):
        rows = page(*before)
        if not rows:
            break
        done = labeled_indices({int(r[0]) for r in rows})
        for seq, rid, lo, hi, ts, blob in rows:
            if len(rid) > MAX_REQUEST_ID_BYTES:  # stored before ids were bounded: never listed
                continue
            for i in sample_indices(blob, int(lo), int(hi)).tolist():
                if (int(seq), i) not in done:
                    out.append((f"{rid}:{i}", float(ts)))
                    size += len(rid) + 32
                    if len(out) >= limit or size > MAX_LISTING_BYTES:
                        return out
        before = (float(rows[-1][4]), int(rows[-1][0]))
        if len(rows) < SAMPLE_PAGE:
            break
    return out
