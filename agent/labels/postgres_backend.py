"""The prediction store in PostgreSQL, shared by every replica (``labels.store_url``): the one module
that imports psycopg.

Tables ``icos_requests``, ``icos_labels`` and ``icos_calibration`` hold what the SQLite backend's
tables hold (see :mod:`agent.labels.store`); ``icos_store_schema`` records the schema version. The
agent creates and migrates the schema at start under an advisory lock (:data:`MIGRATIONS`, applied in
order, each once), so replicas starting together do it once. A prediction is found by its request id
whichever replica wrote it, so a label posted to any replica joins it.

Connections come from a psycopg_pool pool (``labels.pool_size`` per replica), checked before use.
Any failure to reach the server — refused, dropped, or a statement slower than
:data:`STATEMENT_TIMEOUT_MS` — raises :class:`StoreUnreachable`: the store keeps the write queued and
tries again. Retention: every replica may evict, one at a time (``pg_try_advisory_xact_lock``), at most
every ``evict_interval`` seconds: requests older than the age bound, then, past ``max_predictions``
predictions in the whole table, the oldest ones (their labels with them; the policy and its
statements are the SQLite backend's: :mod:`agent.labels.eviction`). The counts behind
``icos_prediction_store_predictions`` are the whole table's, as of the last eviction pass: every
writer adds what it wrote to its own row of ``icos_store_counts`` in the same transaction, so no
full-table count is ever needed. The URL's password is never logged: :attr:`location` is redacted.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from agent.labels.backend import (
    SAMPLE_PAGE,
    BackendCounts,
    StoreUnavailable,
    StoreUnreachable,
    join_labels,
    label_filter,
    unlabeled_sample,
)
from agent.labels.eviction import Evicted, EvictionStatements, evict
from agent.labels.kept_inputs import EVICT_OLDEST, KeptInput, KeptMap
from agent.labels.rows import (
    LABELED_COLUMNS,
    LabeledRows,
    LabelOutcome,
    PendingBatch,
    RequestRow,
    SampleRow,
    split_prediction_id,
)
from agent.labels.sqlite_schema import request_rows
from exporters.redaction import redact_text, redact_uri

log = logging.getLogger("icos_agent.labels")

STATEMENT_TIMEOUT_MS = 10_000
#: Seconds between two eviction passes of one replica (each pass scans the oldest requests of the fleet).
EVICT_INTERVAL_SECONDS = 10.0
CONNECT_TIMEOUT_S = 5
_LOCK_SCHEMA = 0x1C05_0001  # advisory lock keys of the agent
_LOCK_EVICT = 0x1C05_0002

#: (version, statements): applied in order to a database below that version, each in the same transaction
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (
        1,
        (
            "CREATE TABLE icos_requests ("
            " seq BIGSERIAL PRIMARY KEY, rid TEXT NOT NULL, start INTEGER NOT NULL, lo INTEGER NOT NULL,"
            " hi INTEGER NOT NULL, ts DOUBLE PRECISION NOT NULL, identity TEXT NOT NULL, k INTEGER NOT NULL,"
            " predicted BYTEA NOT NULL, verdict BYTEA NOT NULL, probs BYTEA NOT NULL, extras BYTEA)",
            "CREATE INDEX icos_requests_rid ON icos_requests(rid)",
            "CREATE INDEX icos_requests_ts ON icos_requests(ts)",
            "CREATE TABLE icos_labels ("
            " seq BIGINT NOT NULL REFERENCES icos_requests(seq) ON DELETE CASCADE, idx INTEGER NOT NULL,"
            " identity TEXT NOT NULL, ts DOUBLE PRECISION NOT NULL, verdict SMALLINT NOT NULL,"
            " confidence DOUBLE PRECISION NOT NULL, correct SMALLINT NOT NULL, k INTEGER NOT NULL,"
            " label INTEGER NOT NULL, labeled_at DOUBLE PRECISION NOT NULL, abs_err DOUBLE PRECISION NOT NULL,"
            " sq_err DOUBLE PRECISION NOT NULL, extras BYTEA, predicted INTEGER, PRIMARY KEY(seq, idx))",
            "CREATE INDEX icos_labels_identity_ts ON icos_labels(identity, ts)",
            "CREATE TABLE icos_calibration ("
            " identity TEXT PRIMARY KEY, value TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)",
            # running counts of predictions and labels, one row per writing process (no hot row); the
            # evicting replica folds the rows of others into its own
            "CREATE TABLE icos_store_counts ("
            " writer TEXT PRIMARY KEY, predictions BIGINT NOT NULL, labeled BIGINT NOT NULL)",
        ),
    ),
    (
        2,
        (  # the labeling sample: the sampled indices of a request, and whether a label's prediction was one
            "ALTER TABLE icos_requests ADD COLUMN sampled BYTEA",
            "ALTER TABLE icos_labels ADD COLUMN sampled SMALLINT NOT NULL DEFAULT 0",
            "CREATE INDEX icos_requests_sampled ON icos_requests(identity, ts) WHERE sampled IS NOT NULL",
        ),
    ),
    (
        3,
        (  # who gave each label (NULL: before sources were kept), so an admin can drop one source's labels
            "ALTER TABLE icos_labels ADD COLUMN source TEXT",
            "CREATE INDEX icos_labels_labeled_at ON icos_labels(labeled_at)",
        ),
    ),
    (
        4,
        (  # the kept inputs of sampled predictions (agent.labels.kept_inputs), gone with their request
            "CREATE TABLE icos_inputs ("
            " seq BIGINT NOT NULL REFERENCES icos_requests(seq) ON DELETE CASCADE, idx INTEGER NOT NULL,"
            " nbytes INTEGER NOT NULL, predicted INTEGER NOT NULL, confidence DOUBLE PRECISION NOT NULL,"
            " data TEXT NOT NULL, PRIMARY KEY(seq, idx))",
            # active labeling: the draw probability of each sampled index, and of each labeled prediction
            "ALTER TABLE icos_requests ADD COLUMN sampled_p BYTEA",
            "ALTER TABLE icos_labels ADD COLUMN draw_p DOUBLE PRECISION",
        ),
    ),
    (
        5,
        (  # the segment numbers of each sampled index, and of each labeled prediction (per-segment realized)
            "ALTER TABLE icos_requests ADD COLUMN sampled_seg BYTEA",
            "ALTER TABLE icos_labels ADD COLUMN segments BYTEA",
        ),
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]
POSTGRES_EVICTION = EvictionStatements("icos_requests", "icos_labels", "%s")

#: What :meth:`PostgresBackend._labeled` decodes, in its order (one list for every read of labels).
_REQUEST_COLUMNS = (
    "seq, rid, start, lo, hi, ts, identity, k, predicted, verdict, probs, extras, sampled, sampled_p, sampled_seg"
)
_INSERT_LABEL = (
    "INSERT INTO icos_labels(seq, idx, identity, ts, verdict, confidence, correct, k, label, labeled_at, abs_err,"
    " sq_err, extras, predicted, sampled, source, draw_p, segments)"
    " VALUES(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT (seq, idx) DO NOTHING"
)
#: A correction: the newer label replaces the row of the same prediction.
_REPLACE_LABEL = _INSERT_LABEL.replace(
    "DO NOTHING",
    "DO UPDATE SET correct = EXCLUDED.correct, label = EXCLUDED.label, labeled_at = EXCLUDED.labeled_at,"
    " abs_err = EXCLUDED.abs_err, sq_err = EXCLUDED.sq_err, source = EXCLUDED.source",
)


def migrate(conn: psycopg.Connection[Any]) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION` inside the caller's transaction; returns the
    version found before (0: an empty database). A newer schema than this agent knows is refused."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_SCHEMA,))
    conn.execute("CREATE TABLE IF NOT EXISTS icos_store_schema (version INTEGER NOT NULL, applied DOUBLE PRECISION)")
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM icos_store_schema").fetchone()
    found = int(row[0]) if row else 0
    if found > SCHEMA_VERSION:
        raise StoreUnavailable(
            f"the prediction store's schema is version {found}, newer than this agent's {SCHEMA_VERSION}"
        )
    for version, statements in MIGRATIONS:
        if version > found:
            for stmt in statements:
                conn.execute(stmt)  # type: ignore[call-overload]  # fixed text
            conn.execute("INSERT INTO icos_store_schema(version, applied) VALUES (%s, %s)", (version, time.time()))
    return found


class PostgresBackend(BackendCounts):
    """The tables in the PostgreSQL database at ``url`` (see the module docstring)."""

    shared = True
    persistent = True

    def __init__(
        self,
        url: str,
        *,
        max_predictions: int,
        max_age_seconds: float,
        pool_size: int,
        evict_interval: float = EVICT_INTERVAL_SECONDS,
        on_error: Callable[[str], None] = lambda _op: None,
    ) -> None:
        super().__init__(max_predictions, max_age_seconds, on_error)
        self._url = url
        self.pool_size = pool_size
        self.evict_interval = evict_interval
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        self._last_evict = float("-inf")
        self._writer = f"{uuid.uuid4().hex[:16]}"  # this process's row of icos_store_counts

    @property
    def location(self) -> str | None:
        return redact_uri(self._url)

    # -- connections -----------------------------------------------------------------------------
    def open(self) -> None:
        """Start the pool (it connects in the background) and create or migrate the schema. With the
        server down the agent starts anyway: writes are buffered and the schema is made on the first
        write that reaches it."""
        self._pool = ConnectionPool(
            self._url,
            min_size=1,
            max_size=self.pool_size,
            open=False,
            timeout=CONNECT_TIMEOUT_S,
            check=ConnectionPool.check_connection,
            name="icos-prediction-store",
            kwargs={
                "connect_timeout": CONNECT_TIMEOUT_S,
                "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                "application_name": "icos-agent",
                # plan every statement with its values and the tables as they are now: a generic plan made
                # while a table was small (a sequential scan) would stay cached as it grows
                "prepare_threshold": None,
            },
        )
        self._pool.open(wait=False)
        try:
            found = self._ensure_schema()
            self._count()
            log.info(
                "prediction store in PostgreSQL",
                extra={"url": self.location, "schema_found": found, "schema": SCHEMA_VERSION},
            )
        except StoreUnreachable as exc:
            self.on_error("open")
            log.warning(
                "the prediction store's PostgreSQL is unreachable; serving goes on, predictions are buffered",
                extra={"url": self.location, "error": str(exc)},
            )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close(timeout=5)
            self._pool = None

    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection in a transaction, committed at the end of the block; failures to reach the
        server become :class:`StoreUnreachable`, other database errors :class:`StoreUnavailable`."""
        if self._pool is None:
            raise StoreUnavailable("the prediction store is not open")
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield conn
        except (PoolTimeout, psycopg.OperationalError) as exc:
            raise StoreUnreachable(redact_text(f"{type(exc).__name__}: {exc}".strip())) from exc
        except psycopg.Error as exc:
            raise StoreUnavailable(redact_text(f"{type(exc).__name__}: {exc}".strip())) from exc

    def _ensure_schema(self) -> int:
        with self._schema_lock:
            if self._schema_ready:
                return SCHEMA_VERSION
            with self._tx() as conn:
                found = migrate(conn)
            self._schema_ready = True
            return found

    # -- writing ---------------------------------------------------------------------------------
    def write(self, batches: Sequence[PendingBatch]) -> int:
        self._ensure_schema()
        rows = request_rows(batches)
        with self._tx() as conn:
            # request ids used again replace their earlier predictions: one index lookup, deletes only
            # for ids that exist (rare)
            found = conn.execute(
                "SELECT seq, hi - lo FROM icos_requests WHERE rid = ANY(%s)", ([b.request_id for b in batches],)
            ).fetchall()
            labels_gone = replaced = 0
            if found:
                seqs = [int(seq) for seq, _ in found]
                replaced = sum(int(n) for _, n in found)
                labels_gone = _count_of(
                    conn,
                    "WITH g AS (DELETE FROM icos_labels WHERE seq = ANY(%s) RETURNING 1) SELECT COUNT(*) FROM g",
                    (seqs,),
                )
                conn.execute("DELETE FROM icos_requests WHERE seq = ANY(%s)", (seqs,))
            with (
                conn.cursor() as cur,
                cur.copy(
                    "COPY icos_requests(rid, start, lo, hi, ts, identity, k, predicted, verdict, probs, extras,"
                    " sampled, sampled_p, sampled_seg) FROM STDIN"
                ) as copy,
            ):
                for rid, n, ts, identity, k, predicted, verdict, probs, extras, sampled, sampled_p, seg in rows:
                    copy.write_row(
                        (rid, 0, 0, n, ts, identity, k, predicted, verdict, probs, extras, sampled, sampled_p, seg)
                    )
            written = sum(b.n for b in batches)
            self._add_counts(conn, written - replaced, -labels_gone)
        self.rows += written - replaced
        self.labeled -= labels_gone
        return written

    def _add_counts(self, conn: psycopg.Connection[Any], predictions: int, labeled: int) -> None:
        """Add to this writer's row of ``icos_store_counts`` (inside the caller's transaction)."""
        if predictions or labeled:
            conn.execute(
                "INSERT INTO icos_store_counts(writer, predictions, labeled) VALUES (%s, %s, %s)"
                " ON CONFLICT (writer) DO UPDATE SET predictions = icos_store_counts.predictions"
                " + EXCLUDED.predictions, labeled = icos_store_counts.labeled + EXCLUDED.labeled",
                (self._writer, predictions, labeled),
            )

    def evict(self, now: float) -> int:
        """At most every ``evict_interval``, and by one replica at a time: see the module docstring."""
        if time.monotonic() - self._last_evict < self.evict_interval:
            return 0
        self._last_evict = time.monotonic()
        gone = 0
        try:
            self._ensure_schema()
            with self._tx() as conn:
                got = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (_LOCK_EVICT,)).fetchone()
                if got and got[0]:
                    gone = self._evict_locked(conn, now)
            self._count()
        except StoreUnavailable as exc:
            log.debug("eviction postponed", extra={"error": str(exc)})
        return gone

    def _evict_locked(self, conn: psycopg.Connection[Any], now: float) -> int:
        """Evict (:mod:`agent.labels.eviction`), the count bound read from the count rows once the old
        requests are gone and the other writers' rows folded into ours."""

        def total_after(aged: Evicted) -> int:
            conn.execute(
                "INSERT INTO icos_store_counts(writer, predictions, labeled) VALUES (%s, 0, 0) ON CONFLICT DO NOTHING",
                (self._writer,),
            )
            conn.execute(
                "WITH g AS (DELETE FROM icos_store_counts WHERE writer <> %s RETURNING predictions, labeled)"
                " UPDATE icos_store_counts SET predictions = predictions + (SELECT COALESCE(SUM(predictions), 0)"
                " FROM g), labeled = labeled + (SELECT COALESCE(SUM(labeled), 0) FROM g) WHERE writer = %s",
                (self._writer, self._writer),
            )
            sql = "SELECT predictions - %s FROM icos_store_counts WHERE writer = %s"
            return _count_of(conn, sql, (aged.predictions, self._writer))

        gone = evict(conn, POSTGRES_EVICTION, self.retention, now, total_after)
        self._add_counts(conn, -gone.predictions, -gone.labels)
        return gone.predictions

    def _count(self) -> None:
        with self._tx() as conn:
            row = conn.execute(
                "SELECT COALESCE(SUM(predictions), 0), COALESCE(SUM(labeled), 0) FROM icos_store_counts"
            ).fetchone()
        if row is not None:
            self.rows, self.labeled = int(row[0]), int(row[1])

    # -- labels ----------------------------------------------------------------------------------
    def apply_labels(
        self, labels: Sequence[tuple[str, int]], now: float, source: str, replace: bool
    ) -> tuple[LabelOutcome, list[str]]:
        try:
            self._ensure_schema()
            with self._tx() as conn:
                inserted: list[int] = []

                def insert(rows: list[tuple[Any, ...]], replacing: bool) -> None:
                    n = _insert_labels(conn, rows, replacing)
                    if not replacing:  # a correction replaces a label: the count stays
                        inserted.append(n)

                joined = join_labels(
                    labels,
                    now,
                    lambda rids: _requests_by_id(conn, rids),
                    lambda seqs: _labeled_indices(conn, seqs),
                    insert,
                    source=source,
                    replace=replace,
                )
                self._add_counts(conn, 0, sum(inserted))
        except StoreUnavailable:
            self.on_error("write")
            raise
        self.labeled += joined.new
        return joined.outcome(), joined.corrupt

    def drop_labels(self, source: str | None, since: float | None, until: float | None) -> int:
        where, args = label_filter(source, since, until)
        try:
            self._ensure_schema()
            with self._tx() as conn:
                cur = conn.execute(f"DELETE FROM icos_labels WHERE {where.replace('?', '%s')}", args)  # type: ignore[call-overload]  # fixed text
                n = max(cur.rowcount, 0)
                self._add_counts(conn, 0, -n)
        except StoreUnavailable:
            self.on_error("write")
            raise
        self.labeled -= n
        return n

    def labeled_rows(self, identity: str, since: float | None = None, limit: int | None = None) -> LabeledRows:
        sql = f"SELECT {LABELED_COLUMNS} FROM icos_labels WHERE identity = %s AND ts >= %s"  # noqa: S608
        sql += " ORDER BY ts DESC, seq DESC, idx DESC"
        args: list[Any] = [identity, float("-inf") if since is None else since]
        if limit is not None:
            sql += " LIMIT %s"
            args.append(int(limit))
        return self._labeled(sql, args)

    def labeled_between(self, identity: str, since: float, until: float, limit: int) -> LabeledRows:
        """The newest ``limit`` labeled predictions of ``identity`` made in ``[since, until]`` (the fleet's
        read): a backward scan of the ``(identity, ts)`` index stopping at the cap (by ``ts`` alone: no sort)."""
        sql = f"SELECT {LABELED_COLUMNS} FROM icos_labels WHERE identity = %s AND ts >= %s AND ts <= %s"  # noqa: S608
        return self._labeled(sql + " ORDER BY ts DESC LIMIT %s", [identity, float(since), float(until), int(limit)])

    def _labeled(self, sql: str, args: list[Any]) -> LabeledRows:
        try:
            self._ensure_schema()
            with self._tx() as conn:
                rows = conn.execute(sql, args).fetchall()  # type: ignore[call-overload]
        except StoreUnavailable:
            self.on_error("read")
            raise
        return LabeledRows.from_selected(rows)

    def label_requests(self, identity: str, limit: int) -> list[tuple[str, float]]:
        try:
            self._ensure_schema()
            with self._tx() as conn:
                return unlabeled_sample(
                    lambda ts, seq: _sample_page(conn, identity, ts, seq),
                    lambda seqs: _labeled_indices(conn, seqs),
                    limit,
                )
        except StoreUnavailable:
            self.on_error("read")
            raise

    # -- kept inputs of sampled predictions -----------------------------------------------------
    def keep_inputs(self, rows: Sequence[KeptInput], max_total_bytes: int) -> int:
        self._ensure_schema()
        with self._tx() as conn:
            found = conn.execute(
                "SELECT rid, MAX(seq) FROM icos_requests WHERE rid = ANY(%s) GROUP BY rid",
                (sorted({r.request_id for r in rows}),),
            ).fetchall()
            seqs = {str(rid): int(seq) for rid, seq in found}
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO icos_inputs(seq, idx, nbytes, predicted, confidence, data)"
                    " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (seq, idx) DO NOTHING",
                    [
                        (seqs[r.request_id], r.index, len(r.data), r.predicted, r.confidence, r.data)
                        for r in rows
                        if r.request_id in seqs
                    ],
                )
            excess = _count_of(conn, "SELECT COALESCE(SUM(nbytes), 0) - %s FROM icos_inputs", (max_total_bytes,))
            if excess <= 0:
                return 0
            with conn.cursor() as cur:
                cur.execute(EVICT_OLDEST.format(table="icos_inputs", mark="%s"), (excess,))  # type: ignore[arg-type]
                return int(cur.rowcount)

    def kept_inputs(self, ids: Sequence[str]) -> KeptMap:
        pairs = [split_prediction_id(pid) for pid in ids]
        try:
            self._ensure_schema()
            with self._tx() as conn:
                found = conn.execute(
                    "SELECT r.rid, i.idx, i.predicted, i.confidence, i.data FROM icos_inputs i"
                    " JOIN icos_requests r ON r.seq = i.seq"
                    " WHERE (r.rid, i.idx) IN (SELECT * FROM unnest(%s::text[], %s::int[]))",
                    ([p[0] for p in pairs], [p[1] for p in pairs]),
                ).fetchall()
        except StoreUnavailable:
            self.on_error("read")
            raise
        return {f"{rid}:{idx}": (int(k), float(c), str(data)) for rid, idx, k, c, data in found}

    # -- refitted calibrations -------------------------------------------------------------------
    def put_calibration(self, identity: str, value_json: str) -> None:
        self._ensure_schema()
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO icos_calibration(identity, value, created) VALUES (%s, %s, %s)"
                " ON CONFLICT (identity) DO UPDATE SET value = EXCLUDED.value, created = EXCLUDED.created",
                (identity, value_json, time.time()),
            )

    def get_calibration(self, identity: str) -> str | None:
        self._ensure_schema()
        with self._tx() as conn:
            row = conn.execute("SELECT value FROM icos_calibration WHERE identity = %s", (identity,)).fetchone()
        return str(row[0]) if row else None

    def delete_calibration(self, identity: str) -> None:
        self._ensure_schema()
        with self._tx() as conn:
            conn.execute("DELETE FROM icos_calibration WHERE identity = %s", (identity,))


def _bytes(v: object) -> object:
    return bytes(v) if isinstance(v, memoryview) else v


def _requests_by_id(conn: psycopg.Connection[Any], rids: set[str]) -> dict[str, list[RequestRow]]:
    out: dict[str, list[RequestRow]] = {}
    if not rids:
        return out
    cur = conn.execute(
        f"SELECT {_REQUEST_COLUMNS} FROM icos_requests WHERE rid = ANY(%s)",  # type: ignore[call-overload]  # noqa: S608
        (list(rids),),
    )
    for r in cur.fetchall():
        row = RequestRow.of([*r[:8], *(_bytes(v) for v in r[8:])])
        out.setdefault(row.rid, []).append(row)
    return out


def _sample_page(conn: psycopg.Connection[Any], identity: str, ts: float, seq: int) -> list[SampleRow]:
    """Request rows of ``identity`` with sampled predictions before ``(ts, seq)``, newest first."""
    cur = conn.execute(
        "SELECT seq, rid, lo, hi, ts, sampled FROM icos_requests WHERE identity = %s AND sampled IS NOT NULL"
        " AND (ts < %s OR (ts = %s AND seq < %s)) ORDER BY ts DESC, seq DESC LIMIT %s",
        (identity, ts, ts, seq, SAMPLE_PAGE),
    )
    return [(*r[:5], _bytes(r[5])) for r in cur.fetchall()]


def _labeled_indices(conn: psycopg.Connection[Any], seqs: set[int]) -> set[tuple[int, int]]:
    if not seqs:
        return set()
    cur = conn.execute("SELECT seq, idx FROM icos_labels WHERE seq = ANY(%s)", (list(seqs),))
    return {(int(s), int(i)) for s, i in cur.fetchall()}


def _insert_labels(conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]], replacing: bool) -> int:
    """Insert label rows (``replacing``: over existing ones); returns how many were new or replaced (a
    concurrent replica may have labeled one first)."""
    with conn.cursor() as cur:
        cur.executemany(_REPLACE_LABEL if replacing else _INSERT_LABEL, rows)
        return max(cur.rowcount, 0)


def _count_of(conn: psycopg.Connection[Any], sql: str, args: tuple[Any, ...]) -> int:
    row = conn.execute(sql, args).fetchone()  # type: ignore[call-overload]  # fixed text
    return int(row[0]) if row is not None and row[0] is not None else 0
