"""The prediction store's retention, written once for both backends: what is evicted, in which order,
and the statements that do it.

Requests older than ``max_age_seconds`` go first, then, past ``max_predictions`` predictions, the
oldest predictions, walking the requests by ``seq`` and cutting into one request if need be (its ``lo``
rises: the predictions below it are gone). A request's labels go with it. The statements are the same
in SQLite and PostgreSQL but for their tables' names and their parameter mark
(:class:`EvictionStatements`); they run in the caller's transaction, on anything that executes a
statement and answers a DB-API cursor (``sqlite3.Connection``, ``psycopg.Connection``). The old
requests' predictions are counted from the rows the delete returns (``RETURNING``: SQLite 3.35 or
later), never by a count before it that a concurrent writer could make wrong. Who may evict when, and
how each backend keeps its counts, stays with the backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

#: Request rows read per statement while walking the oldest ones.
PAGE = 1000


class Executes(Protocol):
    """A connection in a transaction (``sqlite3.Connection``, ``psycopg.Connection``)."""

    def execute(self, sql: Any, params: Any = ..., /) -> Any: ...


@dataclass(frozen=True)
class Retention:
    """The store's bounds (``labels.max_predictions``, ``labels.max_age``)."""

    max_predictions: int
    max_age_seconds: float

    def cutoff(self, now: float) -> float:
        """Requests made before this time are too old."""
        return now - self.max_age_seconds


@dataclass(frozen=True)
class Evicted:
    """What one eviction deleted: predictions and their labels."""

    predictions: int = 0
    labels: int = 0

    def __add__(self, other: Evicted) -> Evicted:
        return Evicted(self.predictions + other.predictions, self.labels + other.labels)


@dataclass(frozen=True)
class EvictionStatements:
    """The eviction's statements over tables ``requests`` and ``labels`` with parameter mark ``mark``."""

    requests: str
    labels: str
    mark: str

    def older_labels(self) -> str:
        return f"DELETE FROM {self.labels} WHERE seq IN (SELECT seq FROM {self.requests} WHERE ts < {self.mark})"

    def older_requests(self) -> str:
        return f"DELETE FROM {self.requests} WHERE ts < {self.mark} RETURNING hi - lo"

    def page(self) -> str:
        return f"SELECT seq, lo, hi FROM {self.requests} WHERE seq > {self.mark} ORDER BY seq LIMIT {PAGE}"

    def whole_labels(self) -> str:
        return f"DELETE FROM {self.labels} WHERE seq <= {self.mark}"

    def whole_requests(self) -> str:
        return f"DELETE FROM {self.requests} WHERE seq <= {self.mark}"

    def cut_labels(self) -> str:
        return f"DELETE FROM {self.labels} WHERE seq = {self.mark} AND idx < {self.mark}"

    def cut_request(self) -> str:
        return f"UPDATE {self.requests} SET lo = {self.mark} WHERE seq = {self.mark}"


def _deleted(conn: Executes, statement: str, params: tuple[Any, ...]) -> int:
    """The rows ``statement`` deleted (a driver that cannot tell says -1: counted as none)."""
    return max(int(conn.execute(statement, params).rowcount), 0)


def evict_older(conn: Executes, sql: EvictionStatements, cutoff: float) -> Evicted:
    """Delete the requests made before ``cutoff`` and their labels."""
    labels = _deleted(conn, sql.older_labels(), (cutoff,))
    gone = conn.execute(sql.older_requests(), (cutoff,)).fetchall()
    return Evicted(sum(int(n) for (n,) in gone), labels)


def evict_oldest(conn: Executes, sql: EvictionStatements, excess: int) -> Evicted:
    """Delete the oldest ``excess`` predictions (whole requests, and the front of the last one) and their
    labels, walking the requests by ``seq`` a page at a time."""
    whole_upto: int | None = None  # delete request rows with seq <= this
    cut: tuple[int, int] | None = None  # (seq, new lo) of a request evicted in part
    left, after = excess, -1
    while left > 0:
        page = conn.execute(sql.page(), (after,)).fetchall()
        if not page:
            break
        for seq, lo, hi in page:
            live = int(hi) - int(lo)
            if live <= left:
                whole_upto, left = int(seq), left - live
            else:
                cut, left = (int(seq), int(lo) + left), 0
            if left == 0:
                break
        after = int(page[-1][0])
    labels = 0
    if whole_upto is not None:
        labels += _deleted(conn, sql.whole_labels(), (whole_upto,))
        conn.execute(sql.whole_requests(), (whole_upto,))
    if cut is not None:
        seq, lo = cut
        labels += _deleted(conn, sql.cut_labels(), (seq, lo))
        conn.execute(sql.cut_request(), (lo, seq))
    return Evicted(excess - left, labels)


def evict(
    conn: Executes,
    sql: EvictionStatements,
    retention: Retention,
    now: float,
    total_after: Callable[[Evicted], int],
) -> Evicted:
    """Evict by age, then the oldest predictions past ``retention.max_predictions`` of the
    ``total_after(aged)`` predictions stored once the old ones are gone."""
    aged = evict_older(conn, sql, retention.cutoff(now))
    excess = total_after(aged) - retention.max_predictions
    return aged + (evict_oldest(conn, sql, excess) if excess > 0 else Evicted())
