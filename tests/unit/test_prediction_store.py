"""The prediction store of delayed labels (one row per request): writing off the request path,
eviction by count (also inside a request) and by age, label outcomes, reused request ids,
persistence, the in-memory fallback, the bounded queue, the inputs of the full ``shift_aware`` model
kept per prediction and the conversion of files written one row per prediction."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np

from agent.estimation.statistics.extras_columns import EXTRAS_FIELDS, extras_columns, extras_from_columns
from agent.estimation.statistics.window import SampleExtras
from agent.labels.rows import (
    LabeledRows,
    PendingBatch,
    onehot_errors,
)
from agent.labels.store import STORE_FILE, PredictionStore
from tests.support.waiting import wait_until


def batch(rid: str, n: int, ts: float, k: int = 3, seed: int = 0, identity: str = "m:b") -> PendingBatch:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k), n).astype(np.float32)
    return PendingBatch(rid, ts, identity, p, p.argmax(axis=1), rng.integers(0, 4, n).astype(np.int8))


def store(path: Path | None, **kw: float) -> PredictionStore:
    s = PredictionStore(
        path,
        max_predictions=int(kw.get("max_predictions", 1000)),
        max_age_seconds=kw.get("max_age", 3600.0),
        queue_limit=int(kw.get("queue_limit", 10_000)),
    )
    s.open()
    return s


def test_flush_writes_rows_with_ids_and_counts(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert s.persistent and (tmp_path / STORE_FILE).is_file()
    s.enqueue(batch("a", 5, 100.0))
    s.enqueue(batch("b", 3, 101.0))
    assert s.queued == 8 and s.rows == 0
    assert s.flush(now=200.0) == 8
    assert (s.rows, s.labeled, s.queued) == (8, 0, 0)
    out = s.apply_labels([("a:0", 1), ("b:2", 0)], now=300.0)
    assert out.n_accepted == 2 and not out.unknown and not out.duplicate
    s.stop()


def test_eviction_by_count_keeps_the_newest(tmp_path: Path) -> None:
    s = store(tmp_path, max_predictions=100)
    for i in range(5):
        s.enqueue(batch(f"r{i}", 40, 1000.0 + i))
        s.flush(now=1010.0)
    assert s.rows == 100
    out = s.apply_labels([(f"r0:{i}", 0) for i in range(40)] + [("r2:19", 0), ("r2:20", 0), ("r4:39", 0)], 1020.0)
    # 200 predictions were written; the 100 newest are r2:20.. r4:39
    assert len(out.unknown) == 41 and out.n_accepted == 2
    s.stop()


def test_eviction_by_age(tmp_path: Path) -> None:
    s = store(tmp_path, max_age=60.0)
    s.enqueue(batch("old", 10, 1000.0))
    s.enqueue(batch("new", 10, 1050.0))
    s.flush(now=1070.0)  # "old" is 70 s old
    assert s.rows == 10
    out = s.apply_labels([("old:0", 1), ("new:0", 1)], 1070.0)
    assert out.unknown == ["old:0"] and out.n_accepted == 1
    assert s.evict(now=2000.0) == 10 and s.rows == 0
    s.stop()


def test_unknown_duplicate_and_errors_of_labels(tmp_path: Path) -> None:
    s = store(tmp_path)
    b = batch("x", 4, 10.0, k=3, seed=1)
    s.enqueue(b)
    s.flush(now=10.0)
    out = s.apply_labels([("x:0", 2), ("x:1", 0), ("nope", 1)], 20.0)
    assert out.n_accepted == 2 and out.unknown == ["nope"]
    again = s.apply_labels([("x:0", 1), ("x:3", 1)], 30.0)
    assert again.duplicate == ["x:0"] and again.n_accepted == 1
    rows = s.labeled_rows("m:b")
    assert rows.n == 3
    p = b.probabilities.astype(np.float64)
    expect = {0: (p[0], 2), 1: (p[1], 0), 3: (p[3], 1)}
    got = np.array(sorted(zip(rows.abs_err, rows.sq_err, strict=True)))
    want = np.array(sorted(onehot_errors(pr, lab) for pr, lab in expect.values()))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert rows.correct.tolist() == [bool(b.predicted[i] == lab) for i, (_, lab) in expect.items()]
    assert s.labeled_rows("another:identity").n == 0
    s.stop()


def test_a_reused_request_id_replaces_the_earlier_predictions(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.enqueue(batch("same", 3, 10.0, seed=1))
    s.flush(now=10.0)
    s.apply_labels([("same:0", 1)], 11.0)
    s.enqueue(batch("same", 3, 12.0, seed=2))
    s.flush(now=12.0)
    assert (s.rows, s.labeled) == (3, 0)
    s.stop()


def test_persistence_across_reopen(tmp_path: Path) -> None:
    import time

    s = store(tmp_path)
    s.enqueue(batch("p", 6, time.time()))
    s.stop()  # stop writes what is queued
    s2 = store(tmp_path)
    assert s2.rows == 6
    s2.put_calibration("m:b", '{"calibration": {}}')
    s2.stop()
    s3 = store(tmp_path)
    assert s3.get_calibration("m:b") == '{"calibration": {}}'
    s3.delete_calibration("m:b")
    assert s3.get_calibration("m:b") is None
    s3.stop()


def test_unopenable_file_falls_back_to_memory(tmp_path: Path) -> None:
    (tmp_path / STORE_FILE).mkdir()
    errors: list[str] = []
    s = PredictionStore(tmp_path, max_predictions=100, max_age_seconds=60, on_error=errors.append)
    s.open()
    assert errors == ["open"] and not s.persistent
    s.enqueue(batch("m", 5, 10.0))
    s.flush(now=10.0)
    assert s.apply_labels([("m:1", 0)], 11.0).n_accepted == 1
    s.stop()


def test_full_queue_drops_and_counts() -> None:
    dropped: list[tuple[int, str]] = []
    s = _store_of_1000(dropped)
    assert s.enqueue(batch("a", 600, 1.0))
    assert not s.enqueue(batch("b", 600, 1.0))
    assert s.enqueue(batch("c", 400, 1.0))
    assert dropped == [(600, "queue_full")] and s.queued == 1000
    s.stop()


def test_a_recording_calls_requests_queue_as_one_by_one() -> None:
    """``enqueue_many`` (one lock for a recording call's requests) keeps and drops what ``enqueue`` would,
    in order; the kept are held in flight until written."""
    dropped: list[tuple[int, str]] = []
    s = _store_of_1000(dropped)
    kept = s.enqueue_many([batch("a", 600, 1.0), batch("b", 600, 1.0), batch("c", 400, 1.0), batch("d", 1, 1.0)])
    assert kept == [True, False, True, False]
    assert dropped == [(600, "queue_full"), (1, "queue_full")] and s.queued == 1000
    assert s.in_flight.holds("a") and s.in_flight.holds("c") and not s.in_flight.holds("b")
    s.flush()
    assert not s.in_flight.holds("a") and s.queued == 0
    s.stop()


def test_background_writer_flushes(tmp_path: Path) -> None:
    import time

    s = PredictionStore(tmp_path, max_predictions=1000, max_age_seconds=1e9, flush_interval=0.05)
    s.open()
    s.start()
    s.enqueue(batch("bg", 7, time.time()))
    assert wait_until(lambda: s.rows == 7)
    s.stop()


def extras_for(n: int, seed: int = 0) -> SampleExtras:
    rng = np.random.default_rng(seed)
    return SampleExtras(
        margin=rng.uniform(size=n),
        rules=rng.integers(0, 50, n),
        agree=rng.uniform(size=n) < 0.7,
        covered=rng.uniform(size=n) < 0.4,
        pca_error=rng.gamma(2.0, 0.3, n),
    )


def assert_same_extras(got: SampleExtras | None, want: SampleExtras) -> None:
    assert got is not None
    np.testing.assert_array_equal(got.margin, want.margin)
    np.testing.assert_array_equal(got.rules, want.rules)
    np.testing.assert_array_equal(got.agree, want.agree)
    np.testing.assert_array_equal(got.covered, want.covered)
    np.testing.assert_array_equal(got.pca_error, want.pca_error)
    assert got.rules.dtype == np.int64 and got.agree.dtype == bool and got.covered.dtype == bool


def test_extras_round_trip_through_labels_and_reads(tmp_path: Path) -> None:
    s = store(tmp_path, max_age=1e12)
    ex = extras_for(6)
    s.enqueue(replace(batch("e", 6, 10.0), extras=ex))
    s.enqueue(batch("plain", 2, 11.0))  # judged without the full model's inputs
    s.flush(now=20.0)
    out = s.apply_labels([(f"e:{i}", 0) for i in range(6)], 21.0)
    ((identity, rows),) = out.accepted
    assert identity == "m:b"
    assert_same_extras(rows.sample_extras(), ex)
    labels_e = batch("e", 6, 10.0).predicted
    got = rows.sample_extras()
    assert got is not None and got.label is not None and got.label.tolist() == labels_e.tolist()
    s.stop()
    s2 = store(tmp_path, max_age=1e12)  # read back after a restart, in prediction-time order
    assert_same_extras(s2.labeled_rows("m:b").sample_extras(), ex)
    again = s2.labeled_rows("m:b").sample_extras()
    assert again is not None and again.label is not None and again.label.tolist() == labels_e.tolist()
    assert_same_extras(s2.labeled_rows("m:b", limit=3).sample_extras(), ex.take(np.arange(3, 6)))
    # one labeled row without extras: the set as a whole has none
    s2.apply_labels([("plain:0", 1)], 22.0)
    mixed = s2.labeled_rows("m:b")
    assert mixed.n == 7 and mixed.sample_extras() is None
    assert mixed.extras is not None and np.isnan(mixed.extras[-1]).all()
    s2.stop()


def test_columns_and_empty_rows() -> None:
    ex = extras_for(4, seed=3)
    assert_same_extras(extras_from_columns(extras_columns(ex)), ex)
    assert LabeledRows.empty().sample_extras() is None
    assert LabeledRows.empty().extras is not None and LabeledRows.empty().extras.shape == (0, len(EXTRAS_FIELDS))


def per_prediction_file(directory: Path, *, extras_column: bool) -> sqlite3.Connection:
    """A store file in the earlier layout: one row per prediction (with or without ``extras``)."""
    db = sqlite3.connect(directory / STORE_FILE)
    db.execute(
        "CREATE TABLE predictions ("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT, pid TEXT NOT NULL UNIQUE, ts REAL NOT NULL,"
        " identity TEXT NOT NULL, predicted INTEGER NOT NULL, confidence REAL NOT NULL, verdict INTEGER NOT NULL,"
        " probs BLOB NOT NULL, label INTEGER, labeled_at REAL, abs_err REAL, sq_err REAL"
        + (", extras BLOB)" if extras_column else ")")
    )
    return db


def test_a_file_from_before_the_extras_column_is_upgraded(tmp_path: Path) -> None:
    db = per_prediction_file(tmp_path, extras_column=False)
    p = np.array([0.7, 0.2, 0.1], dtype="<f4")
    db.execute(
        "INSERT INTO predictions(pid, ts, identity, predicted, confidence, verdict, probs) VALUES(?,?,?,?,?,?,?)",
        ("old:0", 100.0, "m:b", 0, 0.7, 0, p.tobytes()),
    )
    db.commit()
    db.close()
    s = store(tmp_path, max_age=1e12)
    assert s.rows == 1
    s.enqueue(replace(batch("new", 3, 200.0), extras=extras_for(3)))
    s.flush(now=300.0)
    out = s.apply_labels([("old:0", 0), ("new:0", 1), ("new:1", 1), ("new:2", 1)], 301.0)
    assert out.n_accepted == 4
    rows = s.labeled_rows("m:b")
    assert rows.n == 4 and rows.sample_extras() is None  # the old row has none
    assert rows.extras is not None and np.isnan(rows.extras[0]).all() and not np.isnan(rows.extras[1:]).any()
    assert_same_extras(s.labeled_rows("m:b", since=150.0).sample_extras(), extras_for(3))
    s.stop()
    store(tmp_path, max_age=1e12).stop()  # opening an upgraded file again is a no-op


def test_a_reused_request_id_drops_every_earlier_prediction_and_label(tmp_path: Path) -> None:
    s = store(tmp_path, max_age=1e12)
    s.enqueue(batch("same", 5, 10.0, seed=1))
    s.flush(now=10.0)
    s.apply_labels([("same:4", 1)], 11.0)
    assert (s.rows, s.labeled) == (5, 1)
    s.enqueue(batch("same", 2, 12.0, seed=2))
    s.enqueue(batch("other", 1, 12.0))
    s.enqueue(batch("other", 3, 12.5))  # the same id twice in one write: the last one stays
    s.flush(now=13.0)
    assert (s.rows, s.labeled) == (5, 0)
    out = s.apply_labels([("same:4", 1), ("same:1", 0), ("other:2", 0)], 14.0)
    assert out.unknown == ["same:4"] and out.n_accepted == 2
    s.stop()
    reopened = store(tmp_path, max_age=1e12)
    assert (reopened.rows, reopened.labeled) == (5, 2)
    reopened.stop()


def test_eviction_inside_a_request_drops_its_older_labels(tmp_path: Path) -> None:
    s = store(tmp_path, max_predictions=100, max_age=1e12)
    s.enqueue(batch("a", 60, 1000.0))
    s.flush(now=1000.0)
    s.apply_labels([("a:0", 0), ("a:30", 0), ("a:59", 0)], 1001.0)
    s.enqueue(batch("b", 60, 1002.0))
    s.flush(now=1002.0)  # 120 stored > 100: a:0 .. a:19 go, a:20 .. a:59 stay
    assert (s.rows, s.labeled) == (100, 2)
    out = s.apply_labels([("a:19", 0), ("a:20", 0), ("a:30", 1), ("b:59", 0), ("a:60", 0)], 1003.0)
    assert out.unknown == ["a:19", "a:60"] and out.duplicate == ["a:30"] and out.n_accepted == 2
    assert s.labeled_rows("m:b").n == 4
    s.stop()
    reopened = store(tmp_path, max_predictions=100, max_age=1e12)
    assert (reopened.rows, reopened.labeled) == (100, 4)
    reopened.stop()


def test_prediction_ids_without_an_index_are_unknown(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.enqueue(batch("r", 2, 10.0))
    s.flush(now=10.0)
    out = s.apply_labels([("r", 0), ("r:", 0), ("r:x", 0), ("r:-1", 0), ("r:1", 0)], 11.0)
    assert out.unknown == ["r", "r:", "r:x", "r:-1"] and out.n_accepted == 1
    s.stop()


def test_labeled_predictions_of_a_per_prediction_file_survive_the_conversion(tmp_path: Path) -> None:
    db = per_prediction_file(tmp_path, extras_column=True)
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.5, 0.4, 0.1]], dtype="<f4")
    ex = extras_columns(extras_for(3))
    rows = [
        ("old:0", 100.0, "m:b", 0, 0.7, 0, p[0].tobytes(), 0, 150.0, *onehot_errors(p[0], 0), ex[0].tobytes()),
        ("old:1", 100.0, "m:b", 2, 0.6, 2, p[1].tobytes(), None, None, None, None, ex[1].tobytes()),
        ("old:2", 100.0, "m:b", 0, 0.5, 3, p[2].tobytes(), 1, 160.0, *onehot_errors(p[2], 1), None),
    ]
    db.executemany(
        "INSERT INTO predictions(pid, ts, identity, predicted, confidence, verdict, probs, label, labeled_at,"
        " abs_err, sq_err, extras) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    db.commit()
    db.close()
    s = store(tmp_path, max_age=1e12)
    assert (s.rows, s.labeled) == (3, 2)
    got = s.labeled_rows("m:b")
    assert got.correct.tolist() == [True, False] and got.verdict.tolist() == [0, 3]
    np.testing.assert_allclose(got.confidence, [0.7, 0.5], rtol=1e-6)
    assert got.extras is not None and np.array_equal(got.extras[0], ex[0]) and np.isnan(got.extras[1]).all()
    out = s.apply_labels([("old:0", 1), ("old:1", 2)], 200.0)
    assert out.duplicate == ["old:0"] and out.n_accepted == 1 and out.accepted[0][1].correct.tolist() == [True]
    s.stop()
    tables = {r[0] for r in sqlite3.connect(tmp_path / STORE_FILE).execute("SELECT name FROM sqlite_master")}
    assert "predictions" not in tables and {"requests", "labels"} <= tables


def _store_of_1000(dropped: list[tuple[int, str]]) -> PredictionStore:
    """An open in-memory store whose queue holds 1,000 predictions, its drops noted in ``dropped``."""
    s = PredictionStore(
        None,
        max_predictions=100_000,
        max_age_seconds=60,
        queue_limit=1000,
        on_drop=lambda n, reason: dropped.append((n, reason)),
    )
    s.open()
    return s
