"""The SQLite side of the prediction store: schema, migrations of older files and the statements
that :class:`agent.labels.store.PredictionStore` runs inside its transactions.

Tables: ``requests`` (one row per judged request, arrays as little-endian BLOBs), ``labels`` (one
row per labeled prediction) and ``calibration`` (a refitted estimator calibration per model
identity); see :mod:`agent.labels.store` for what the columns hold. A file of the earlier
one-row-per-prediction layout (table ``predictions``) is converted by :func:`init_schema`.
"""

from __future__ import annotations

import itertools
import logging
import math
import sqlite3
from collections.abc import Sequence

import numpy as np

from agent.estimation.statistics.extras_columns import EXTRAS_DTYPE, EXTRAS_FIELDS, extras_columns
from agent.labels.kept_inputs import SQLITE_SCHEMA as KEPT_INPUTS_SCHEMA
from agent.labels.rows import (
    PREDICTED_DTYPE,
    SAMPLED_DTYPE,
    SEGMENTS_DTYPE,
    PendingBatch,
    RequestRow,
    SampleRow,
    split_prediction_id,
)

log = logging.getLogger("icos_agent.labels")

CHUNK = 500  # ids per SQL statement (well below SQLite's variable limit)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS requests ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, rid TEXT NOT NULL, start INTEGER NOT NULL, lo INTEGER NOT NULL,"
    " hi INTEGER NOT NULL, ts REAL NOT NULL, identity TEXT NOT NULL, k INTEGER NOT NULL,"
    " predicted BLOB NOT NULL, verdict BLOB NOT NULL, probs BLOB NOT NULL, extras BLOB, sampled BLOB,"
    " UNIQUE(rid, start))",
    "CREATE INDEX IF NOT EXISTS requests_ts ON requests(ts)",
    "CREATE TABLE IF NOT EXISTS labels ("
    " seq INTEGER NOT NULL, idx INTEGER NOT NULL, identity TEXT NOT NULL, ts REAL NOT NULL,"
    " verdict INTEGER NOT NULL, confidence REAL NOT NULL, correct INTEGER NOT NULL, k INTEGER NOT NULL,"
    " label INTEGER NOT NULL, labeled_at REAL NOT NULL, abs_err REAL NOT NULL, sq_err REAL NOT NULL, extras BLOB,"
    " predicted INTEGER, sampled INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(seq, idx))",
    "CREATE INDEX IF NOT EXISTS labels_identity_ts ON labels(identity, ts)",
    "CREATE TABLE IF NOT EXISTS calibration (identity TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)",
)
#: columns later versions added to tables of an existing file: (table, column, definition)
_ADDED_COLUMNS = (
    ("labels", "predicted", "INTEGER"),  # labels of unknown class
    ("requests", "sampled", "BLOB"),  # the labeling sample
    ("labels", "sampled", "INTEGER NOT NULL DEFAULT 0"),
    ("labels", "source", "TEXT"),  # who gave the label (NULL: before sources were kept)
    ("requests", "sampled_p", "BLOB"),  # the draw probability of each sampled index (float64)
    ("labels", "draw_p", "REAL"),  # the probability the prediction was drawn with (NULL: unknown)
    ("requests", "sampled_seg", "BLOB"),  # the segment numbers of each sampled index (int32 [m, D])
    ("labels", "segments", "BLOB"),  # the labeled prediction's segment numbers (NULL: not kept)
)
#: indexes on added columns, created after the columns exist
_INDEXES = ("CREATE INDEX IF NOT EXISTS requests_sampled ON requests(identity, ts) WHERE sampled IS NOT NULL",)
INSERT_LABEL = (
    "INSERT INTO labels(seq, idx, identity, ts, verdict, confidence, correct, k, label, labeled_at, abs_err,"
    " sq_err, extras, predicted, sampled, source, draw_p, segments)"
    " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
#: A correction: the newer label replaces the row of the same prediction.
REPLACE_LABEL = INSERT_LABEL.replace("INSERT INTO", "INSERT OR REPLACE INTO", 1)
_REQUEST_COLUMNS = (
    "seq, rid, start, lo, hi, ts, identity, k, predicted, verdict, probs, extras, sampled, sampled_p, sampled_seg"
)


def init_schema(db: sqlite3.Connection) -> None:
    """Create the tables if missing, add columns later versions added and convert a file of the
    one-row-per-prediction layout, in one transaction."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for stmt in _SCHEMA:
            db.execute(stmt)
        tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, column, definition in _ADDED_COLUMNS:
            if column not in {str(r[1]) for r in db.execute(f"PRAGMA table_info({table})")}:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        for stmt in _INDEXES:
            db.execute(stmt)
        for stmt in KEPT_INPUTS_SCHEMA:  # the kept inputs of sampled predictions (a table of their own)
            db.execute(stmt)
        if "predictions" in tables:
            n = _convert_per_prediction_rows(db)
            log.info("converted the prediction store to one row per request", extra={"predictions": n})
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def last_per_request(batches: list[PendingBatch]) -> list[PendingBatch]:
    """The batches in queue order, keeping only the last one of a request id queued twice."""
    last = {b.request_id: i for i, b in enumerate(batches)}
    if len(last) == len(batches):
        return batches
    return [b for i, b in enumerate(batches) if last[b.request_id] == i]


#: one ``requests`` row's values after ``rid, start=0, lo=0``: hi, ts, identity, k, then the BLOBs
_Blob = bytes | None
RequestValues = tuple[str, int, float, str, int, bytes, bytes, bytes, _Blob, _Blob, _Blob, _Blob]


def request_rows(
    batches: Sequence[PendingBatch],
) -> list[RequestValues]:
    """The ``requests`` values (after ``rid, start=0, lo=0``) of queued batches. The arrays of all
    batches are converted and serialised together and cut into one BLOB per request, so a request
    costs a few bytes slices, not a dozen small numpy calls."""
    ns = [b.n for b in batches]
    cuts = [0, *itertools.accumulate(ns)]
    predicted = _cut(
        np.concatenate([np.asarray(b.predicted).reshape(-1) for b in batches]).astype(PREDICTED_DTYPE), cuts
    )
    verdicts = _cut(np.concatenate([np.asarray(b.verdicts).reshape(-1) for b in batches]).astype(np.int8), cuts)
    probs2d = [np.asarray(b.probabilities).reshape(b.n, -1) for b in batches]
    ks = [p.shape[1] for p in probs2d]
    if len(set(ks)) == 1:
        probs = _cut(np.concatenate(probs2d).astype("<f4"), cuts)
    else:  # models with different class counts in one write (a reload): one array per request
        probs = [np.ascontiguousarray(p, dtype="<f4").tobytes() for p in probs2d]
    extras: list[bytes | None] = [None] * len(batches)
    with_extras = [i for i, b in enumerate(batches) if _extras_of(b) is not None]
    if with_extras:
        parts = [_extras_of(batches[i]) for i in with_extras]
        cols = np.concatenate([p for p in parts if p is not None]).astype(EXTRAS_DTYPE)
        sub = _cut(cols, [0, *itertools.accumulate(ns[i] for i in with_extras)])
        for i, blob in zip(with_extras, sub, strict=True):
            extras[i] = blob
    return [
        (b.request_id, b.n, float(b.timestamp), b.identity, k, predicted[i], verdicts[i], probs[i], extras[i])
        + (_sampled_blob(b), _sampled_p_blob(b), _sampled_seg_blob(b))
        for i, (b, k) in enumerate(zip(batches, ks, strict=True))
    ]


def _sampled_blob(b: PendingBatch) -> bytes | None:
    """The indices of the batch's predictions in the labeling sample, NULL when there are none."""
    if b.sampled is None or not np.size(b.sampled):
        return None
    return np.asarray(b.sampled, dtype=SAMPLED_DTYPE).reshape(-1).tobytes()


def _sampled_p_blob(b: PendingBatch) -> bytes | None:
    """The draw probabilities of the batch's sampled predictions (float64), NULL when not given."""
    if b.sampled is None or b.sampled_p is None or np.size(b.sampled_p) != np.size(b.sampled) or not np.size(b.sampled):
        return None
    return np.asarray(b.sampled_p, dtype="<f8").reshape(-1).tobytes()


def _sampled_seg_blob(b: PendingBatch) -> bytes | None:
    """The segment numbers of the batch's sampled predictions (int32 ``[m, D]``), NULL when not given."""
    seg = b.sampled_segments
    if b.sampled is None or seg is None or np.ndim(seg) != 2 or len(seg) != np.size(b.sampled) or not np.size(seg):
        return None
    return np.ascontiguousarray(seg, dtype=SEGMENTS_DTYPE).tobytes()


def _extras_of(b: PendingBatch) -> np.ndarray | None:
    """The batch's extras as float64 ``[n, 5]`` columns, or None when it has none (or a wrong count)."""
    e = b.extras
    if e is None:
        return None
    cols = e if isinstance(e, np.ndarray) else extras_columns(e)
    return cols if cols.shape == (b.n, len(EXTRAS_FIELDS)) else None


def _cut(a: np.ndarray, cuts: Sequence[int]) -> list[bytes]:
    """The bytes of rows ``cuts[i]:cuts[i+1]`` of a C-contiguous array, for every ``i``."""
    data = np.ascontiguousarray(a).tobytes()
    row = a.itemsize * (math.prod(a.shape[1:]) if a.ndim > 1 else 1)
    return [data[row * lo : row * hi] for lo, hi in itertools.pairwise(cuts)]


def delete_requests(db: sqlite3.Connection, rids: Sequence[str]) -> tuple[int, int]:
    """Delete the stored requests with these ids and their labels: ``(predictions, labels)`` deleted.
    One lookup per :data:`CHUNK` ids; deletes only for ids that exist (reused ids are rare)."""
    found: list[tuple[int, int]] = []  # (seq, live predictions)
    for first in range(0, len(rids), CHUNK):
        chunk = list(rids[first : first + CHUNK])
        marks = ",".join("?" * len(chunk))
        found += db.execute(
            f"SELECT seq, hi - lo FROM requests WHERE rid IN ({marks})",  # noqa: S608 - placeholders only
            chunk,
        ).fetchall()
    if not found:
        return 0, 0
    labels = 0
    for seq, _ in found:
        labels += db.execute("DELETE FROM labels WHERE seq = ?", (seq,)).rowcount
        db.execute("DELETE FROM requests WHERE seq = ?", (seq,))
    return sum(int(n) for _, n in found), labels


def requests_by_id(db: sqlite3.Connection, rids: set[str]) -> dict[str, list[RequestRow]]:
    out: dict[str, list[RequestRow]] = {}
    if not rids:
        return out
    ids = list(rids)
    marks = ",".join("?" * len(ids))
    for r in db.execute(
        f"SELECT {_REQUEST_COLUMNS} FROM requests WHERE rid IN ({marks})",  # noqa: S608 - placeholders only
        ids,
    ):
        row = RequestRow.of(r)
        out.setdefault(row.rid, []).append(row)
    return out


def sample_page(db: sqlite3.Connection, identity: str, ts: float, seq: int, size: int) -> list[SampleRow]:
    """Up to ``size`` request rows of ``identity`` with sampled predictions before ``(ts, seq)``, newest first."""
    return db.execute(
        "SELECT seq, rid, lo, hi, ts, sampled FROM requests WHERE identity = ? AND sampled IS NOT NULL"
        " AND (ts < ? OR (ts = ? AND seq < ?)) ORDER BY ts DESC, seq DESC LIMIT ?",
        (identity, ts, ts, seq, size),
    ).fetchall()


def labeled_indices(db: sqlite3.Connection, seqs: set[int]) -> set[tuple[int, int]]:
    done: set[tuple[int, int]] = set()
    ids = list(seqs)
    for first in range(0, len(ids), CHUNK):
        chunk = ids[first : first + CHUNK]
        marks = ",".join("?" * len(chunk))
        done.update(
            (int(s), int(i))
            for s, i in db.execute(
                f"SELECT seq, idx FROM labels WHERE seq IN ({marks})",  # noqa: S608 - placeholders only
                chunk,
            )
        )
    return done


def _convert_per_prediction_rows(db: sqlite3.Connection) -> int:
    """Move the rows of the earlier one-row-per-prediction table into ``requests`` (one row per
    prediction, ``start`` = its index) and ``labels``, then drop it. Returns the predictions moved."""
    columns = {str(r[1]) for r in db.execute("PRAGMA table_info(predictions)")}
    extras_col = "extras" if "extras" in columns else "NULL"
    moved = 0
    cursor = db.execute(
        "SELECT pid, ts, identity, predicted, confidence, verdict, probs, label, labeled_at, abs_err, sq_err,"
        f" {extras_col} FROM predictions ORDER BY seq"  # noqa: S608 - a fixed column name or NULL
    )
    while True:
        page = cursor.fetchmany(2000)
        if not page:
            break
        for pid, ts, identity, predicted, confidence, verdict, probs, label, labeled_at, a, s, extras in page:
            rid, idx = split_prediction_id(str(pid))
            k = len(probs) // 4
            ext = extras if isinstance(extras, bytes) and len(extras) == 8 * len(EXTRAS_FIELDS) else None
            seq = db.execute(
                "INSERT OR REPLACE INTO requests(rid, start, lo, hi, ts, identity, k, predicted, verdict, probs,"
                " extras) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    rid,
                    idx,
                    idx,
                    idx + 1,
                    ts,
                    identity,
                    k,
                    np.asarray([predicted], dtype=PREDICTED_DTYPE).tobytes(),
                    np.asarray([verdict], dtype=np.int8).tobytes(),
                    probs,
                    ext,
                ),
            ).lastrowid
            if label is not None:
                db.execute(
                    REPLACE_LABEL,
                    (seq, idx, identity, ts, verdict, confidence, int(predicted == label), k)
                    + (label, labeled_at, a, s, ext, predicted, 0, None, None, None),
                )
            moved += 1
    db.execute("DROP TABLE predictions")
    return moved
