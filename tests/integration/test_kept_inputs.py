"""The inputs of sampled predictions kept in the prediction store (``labels.keep_sampled_inputs``), in
SQLite and a real PostgreSQL alike: only sampled predictions, each within its byte bound, the oldest
dropped past the total bound, gone with their request, and older stores given the table."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.labels.kept_inputs import KeptInputsPolicy, decode_sample, encode_sample
from agent.labels.rows import PendingBatch
from agent.labels.store import STORE_FILE, PredictionStore


def batch(rid: str, n: int, ts: float, sampled: list[int] | None, inputs: dict[str, np.ndarray]) -> PendingBatch:
    rng = np.random.default_rng(n)
    p = rng.dirichlet(np.ones(3), n).astype(np.float32)
    s = np.asarray(sampled) if sampled is not None else None
    return PendingBatch(rid, ts, "m:b", p, p.argmax(axis=1), np.zeros(n, np.int8), sampled=s, inputs=inputs)


def images(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).random((n, 8, 8)).astype(np.float32)}


class Dropped:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, n: int, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + n


@pytest.fixture(params=["sqlite", "postgresql"])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = request.getfixturevalue("postgres").url if request.param == "postgresql" else None
    dropped = Dropped()
    # an 8x8 float32 image encodes to ~400 bytes: the total bound holds five
    policy = KeptInputsPolicy(True, max_input_bytes=1000, max_total_bytes=2200)
    s = PredictionStore(
        tmp_path, max_predictions=1000, max_age_seconds=1e12, store_url=url, kept=policy, on_inputs_dropped=dropped
    )
    s.open()
    yield s, dropped
    s.stop()


def test_encoding_round_trips_numbers_text_and_tables() -> None:
    batch_inputs = {
        "x": np.arange(12, dtype=np.float32).reshape(3, 2, 2),
        "t": np.asarray(["héllo", "b", "c"], dtype=object),
        "age": np.asarray([[30], [41], [52]], dtype=np.int64),
        "flag": np.asarray([True, False, True]),
    }
    text = encode_sample(batch_inputs, 1)
    back = decode_sample(json.loads(text))
    assert back["x"].dtype == np.float32 and back["x"].tolist() == [[4.0, 5.0], [6.0, 7.0]]
    assert back["t"].tolist() == "b" and back["age"].tolist() == [41] and back["flag"].tolist() is False
    with pytest.raises(ValueError, match="not numeric"):
        decode_sample({"x": {"dtype": "datetime64[s]", "shape": [], "base64": ""}})


def test_sampled_inputs_are_kept_bounded_and_evicted_oldest_first(opened: Any) -> None:
    store, dropped = opened
    store.enqueue(batch("a", 4, 100.0, [1, 3], images(4, 1)))
    store.enqueue(batch("b", 3, 101.0, None, images(3, 2)))  # nothing sampled: nothing kept
    huge = {"x": np.zeros((2, 64, 64), np.float32)}  # 16 KiB per input: over the 1000-byte bound
    store.enqueue(batch("c", 2, 102.0, [0, 1], huge))
    store.flush(now=110.0)
    assert dropped.counts == {"too_large": 2}
    kept = store.kept_inputs(["a:1", "a:3", "a:0", "b:0", "c:0", "zz:1"])
    assert sorted(kept) == ["a:1", "a:3"]
    predicted, confidence, data = kept["a:1"]
    p = np.random.default_rng(4).dirichlet(np.ones(3), 4).astype(np.float32)
    assert predicted == int(p[1].argmax()) and confidence == pytest.approx(float(p[1].max()))
    assert np.array_equal(decode_sample(json.loads(data))["x"], images(4, 1)["x"][1])

    # four more kept inputs: six in all are over the total bound (five fit), the oldest goes
    store.enqueue(batch("d", 4, 103.0, [0, 1, 2, 3], images(4, 3)))
    store.flush(now=120.0)
    assert dropped.counts == {"too_large": 2, "evicted": 1}
    assert sorted(store.kept_inputs(["a:1", "a:3", "d:0", "d:1", "d:2", "d:3"])) == [
        "a:3",
        "d:0",
        "d:1",
        "d:2",
        "d:3",
    ]
    # a request id used again replaces its predictions: their inputs go with them
    store.enqueue(batch("a", 1, 130.0, None, images(1)))
    store.flush(now=140.0)
    assert store.kept_inputs(["a:3"]) == {}


def test_inputs_are_not_kept_unless_asked(tmp_path: Path) -> None:
    store = PredictionStore(tmp_path, max_predictions=100, max_age_seconds=1e12)
    store.open()
    store.enqueue(batch("a", 2, 100.0, [0, 1], images(2)))
    store.flush(now=110.0)
    assert store.kept_inputs(["a:0", "a:1"]) == {}
    store.stop()


def test_a_store_file_without_the_inputs_table_gains_it(tmp_path: Path) -> None:
    s = PredictionStore(tmp_path, max_predictions=100, max_age_seconds=1e12)
    s.open()
    s.enqueue(batch("old", 2, 100.0, [0], images(2)))
    s.flush(now=110.0)
    s.stop()
    db = sqlite3.connect(tmp_path / STORE_FILE)  # as written before inputs were kept
    db.executescript("DROP TRIGGER inputs_of_deleted; DROP TRIGGER inputs_of_cut; DROP TABLE inputs;")
    db.close()
    s = PredictionStore(tmp_path, max_predictions=100, max_age_seconds=1e12, kept=KeptInputsPolicy(True))
    s.open()
    s.enqueue(batch("new", 2, 200.0, [1], images(2)))
    s.flush(now=210.0)
    assert sorted(s.kept_inputs(["old:0", "new:1"])) == ["new:1"]
    assert s.label_requests("m:b", 10) == [("new:1", 200.0), ("old:0", 100.0)]
    s.stop()
