"""The segment numbers of the labeling sample kept in both prediction-store backends (SQLite, a real
PostgreSQL): written with the sampled predictions, copied onto their labels, read back with them, kept across
a re-open, and added in place to a store written before they were kept (old rows read as unknown). The
realized windows then give every segment its realized accuracy from the stored labels alone, the Hájek
ratio of their ``1/π`` weights."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
import pytest

from agent.config.settings import AgentSettings
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.segments.realized import SegmentLabels
from agent.judging.runtime import load_runtime
from agent.labels.postgres_backend import SCHEMA_VERSION
from agent.labels.realized import RealizedWindows, sample_segment_labels
from agent.labels.rows import PendingBatch
from agent.labels.store import STORE_FILE, PredictionStore
from tests.support.postgres import PostgresDatabase

IDENTITY = "m:b"


@pytest.fixture(scope="module")
def calibration(digits_logreg: dict[str, Path]) -> EstimatorCalibration:
    """The calibration of a real bundle with segments (a skl2onnx logistic regression on digits)."""
    model, bundle = str(digits_logreg["model"]), str(digits_logreg["bundle"])
    settings = AgentSettings.model_validate({"model": {"name": "digits", "path": model}, "bundle": {"path": bundle}})
    cal = load_runtime(settings).calibration
    assert cal.segments is not None and len(cal.segments.dimensions) >= 2
    return cal


def sampled_batch(
    rid: str, ts: float, seed: int, cal: EstimatorCalibration
) -> tuple[PendingBatch, np.ndarray, np.ndarray]:
    """A request of 8 predictions, 4 of them drawn with their probabilities and segment numbers ``[4, D]``."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(3), 8).astype(np.float32)
    sampled = np.array([0, 2, 5, 7])
    seg = cal.segments
    assert seg is not None
    segments = np.stack(
        [off + rng.integers(0, len(dim.segments), 4) for off, dim in zip(seg.offsets, seg.dimensions, strict=True)],
        axis=1,
    )
    pi = rng.uniform(0.2, 0.9, 4)
    b = PendingBatch(
        rid, ts, IDENTITY, p, p.argmax(axis=1), np.zeros(8, np.int8), sampled=sampled, sampled_p=pi,
        sampled_segments=segments,
    )  # fmt: skip
    return b, segments, pi


def check_round_trip(open_store: Callable[[], PredictionStore], cal: EstimatorCalibration) -> None:
    assert cal.segments is not None
    size, dims = cal.segments.size, len(cal.segments.dimensions)
    s = open_store()
    written = [sampled_batch(f"r{i}", 100.0 + i, i, cal) for i in range(3)]
    for b, _, _ in written:
        s.enqueue(b)
    assert s.flush(now=200.0) == 24
    labels, want_ids, want_y, want_w = [], [], [], []
    for b, segments, pi in written:
        for j, idx in enumerate(b.sampled.tolist()):  # type: ignore[union-attr]
            label = int(b.predicted[idx]) if j % 2 else (int(b.predicted[idx]) + 1) % 3
            labels.append((f"{b.request_id}:{idx}", label))
            want_ids.append(segments[j])
            want_y.append(j % 2 == 1)
            want_w.append(1.0 / pi[j])
        labels.append((f"{b.request_id}:1", 0))  # a prediction outside the sample: no segments kept
    assert s.apply_labels(labels, now=300.0).n_accepted == len(labels)
    s.stop()
    again = open_store()  # read back after a re-open
    rows = again.labeled_rows(IDENTITY)
    assert rows.segments is not None and rows.segments.shape == (len(labels), dims)
    in_sample = rows.sampled
    assert int(in_sample.sum()) == len(want_ids)  # type: ignore[union-attr]
    assert (rows.segments[~in_sample] == -1).all()  # type: ignore[operator]
    got = rows.segments[in_sample]
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, np.asarray(want_ids).tolist()))
    by_segment = sample_segment_labels(rows, cal)
    want = SegmentLabels.of(np.asarray(want_ids).T, size, np.asarray(want_y), np.asarray(want_w))
    assert by_segment is not None
    for name in ("n", "w", "wy", "w2"):
        np.testing.assert_allclose(getattr(by_segment, name), getattr(want, name), rtol=1e-9)
    windows = RealizedWindows({"1h": 3600.0}, None, 1000)
    windows.reset(rows)
    per_window = windows.segment_labels(cal, now=400.0)
    np.testing.assert_allclose(per_window["1h"].wy, want.wy, rtol=1e-9)
    for s_ in range(size):  # each segment's realized accuracy: the Hájek ratio of its labels
        n, est = per_window["1h"].estimate(s_)
        mine = np.array([s_ in ids for ids in want_ids])
        assert n == int(mine.sum())
        if n:
            w, y = np.asarray(want_w)[mine], np.asarray(want_y)[mine]
            ratio = float(np.sum(w * y) / np.sum(w))
            assert est is not None and est.value == pytest.approx(ratio)
    again.stop()


def test_sqlite_keeps_the_segments_of_the_labeling_sample(tmp_path: Path, calibration: EstimatorCalibration) -> None:
    def open_store() -> PredictionStore:
        s = PredictionStore(tmp_path, max_predictions=1000, max_age_seconds=1e12)
        s.open()
        return s

    check_round_trip(open_store, calibration)


def test_an_sqlite_file_from_before_segments_is_migrated_in_place(
    tmp_path: Path, calibration: EstimatorCalibration
) -> None:
    s = PredictionStore(tmp_path, max_predictions=1000, max_age_seconds=1e12)
    s.open()
    b, _, _ = sampled_batch("old", 100.0, 1, calibration)
    s.enqueue(b)
    s.flush(now=200.0)
    s.stop()
    db = sqlite3.connect(tmp_path / STORE_FILE)  # the file as the version before segments wrote it
    db.execute("ALTER TABLE requests DROP COLUMN sampled_seg")
    db.execute("ALTER TABLE labels DROP COLUMN segments")
    db.commit()
    db.close()
    s = PredictionStore(tmp_path, max_predictions=1000, max_age_seconds=1e12)
    s.open()
    assert s.rows == 8  # kept
    new, segments, _ = sampled_batch("new", 150.0, 2, calibration)
    s.enqueue(new)
    s.flush(now=200.0)
    assert s.apply_labels([("old:0", 0), ("new:0", 0)], now=300.0).n_accepted == 2
    rows = s.labeled_rows(IDENTITY)
    assert rows.segments is not None
    assert rows.segments.tolist() == [[-1] * segments.shape[1], segments[0].tolist()]  # the old one's are unknown
    s.stop()


def test_postgresql_keeps_the_segments_of_the_labeling_sample(
    postgres: PostgresDatabase, calibration: EstimatorCalibration
) -> None:
    def open_store() -> PredictionStore:
        s = PredictionStore(None, max_predictions=1000, max_age_seconds=1e12, store_url=postgres.url)
        s.open()
        return s

    check_round_trip(open_store, calibration)


def test_a_postgresql_schema_from_before_segments_is_migrated_in_place(
    postgres: PostgresDatabase, calibration: EstimatorCalibration
) -> None:
    s = PredictionStore(None, max_predictions=1000, max_age_seconds=1e12, store_url=postgres.url)
    s.open()
    b, _, _ = sampled_batch("old", 100.0, 1, calibration)
    s.enqueue(b)
    s.flush(now=200.0)
    s.stop()
    with psycopg.connect(postgres.url) as conn:  # the schema as the version before segments made it
        conn.execute("ALTER TABLE icos_requests DROP COLUMN sampled_seg")
        conn.execute("ALTER TABLE icos_labels DROP COLUMN segments")
        conn.execute("DELETE FROM icos_store_schema WHERE version = %s", (SCHEMA_VERSION,))
    s = PredictionStore(None, max_predictions=1000, max_age_seconds=1e12, store_url=postgres.url)
    s.open()
    with psycopg.connect(postgres.url) as conn:
        assert conn.execute("SELECT MAX(version) FROM icos_store_schema").fetchone() == (SCHEMA_VERSION,)
    new, segments, _ = sampled_batch("new", 150.0, 2, calibration)
    s.enqueue(new)
    s.flush(now=200.0)
    assert s.rows == 16
    assert s.apply_labels([("old:0", 0), ("new:0", 0)], now=300.0).n_accepted == 2
    rows = s.labeled_rows(IDENTITY)
    assert rows.segments is not None
    assert rows.segments.tolist() == [[-1] * segments.shape[1], segments[0].tolist()]
    s.stop()
