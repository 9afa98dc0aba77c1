"""Algorithm R reservoir: bounded, uniform over what it has seen, generations, thread safety."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from agent.data.reservoir import Reservoir


def test_fill_then_bounded() -> None:
    r = Reservoir(10, horizon_seconds=None, seed=0)
    assert r.sample() is None
    r.add(np.arange(4, dtype=np.float32).reshape(4, 1))
    s = r.sample()
    assert s is not None and s.ravel().tolist() == [0, 1, 2, 3]
    r.add(np.arange(4, 100, dtype=np.float32).reshape(-1, 1))
    s = r.sample()
    assert s is not None and s.shape == (10, 1) and len(set(s.ravel().tolist())) == 10
    assert r.seen == 100 and len(r) == 10


def test_inclusion_is_uniform() -> None:
    """Every item ends in the sample with probability k/N (Vitter 1985), whatever the batch sizes."""
    k, n, trials = 5, 50, 4000
    counts = np.zeros(n)
    rng = np.random.default_rng(1)
    for t in range(trials):
        r = Reservoir(k, horizon_seconds=None, seed=t)
        items = np.arange(n).reshape(-1, 1)
        start = 0
        while start < n:
            size = int(rng.integers(1, 9))
            r.add(items[start : start + size])
            start += size
        s = r.sample()
        assert s is not None
        counts[s.ravel()] += 1
    share = counts / trials
    expected = k / n
    # binomial standard error ~0.0047; 5 sigma
    assert np.all(np.abs(share - expected) < 0.025), share


def test_generations_keep_the_sample_recent() -> None:
    now = [0.0]
    r = Reservoir(8, horizon_seconds=10.0, min_samples=3, seed=0, clock=lambda: now[0])
    r.add(np.zeros((20, 2)))
    now[0] = 11.0
    r.add(np.ones((2, 2)))  # new generation, too small yet: the previous one is served
    s = r.sample()
    assert s is not None and s.shape == (8, 2) and float(s.max()) == 0.0
    r.add(np.ones((5, 2)))
    s = r.sample()
    assert s is not None and s.shape == (7, 2) and float(s.min()) == 1.0


def test_new_shape_starts_afresh() -> None:
    r = Reservoir(4, seed=0)
    r.add(np.zeros((3, 2)))
    r.add(np.zeros((2, 5)))
    s = r.sample()
    assert s is not None and s.shape == (2, 5)


def test_concurrent_adds() -> None:
    r = Reservoir(64, horizon_seconds=None, seed=0)

    def feed(v: int) -> None:
        for _ in range(200):
            r.add(np.full((3, 4), v, dtype=np.float32))

    threads = [threading.Thread(target=feed, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert r.seen == 4 * 200 * 3
    s = r.sample()
    assert s is not None and s.shape == (64, 4)
    assert set(np.unique(s).tolist()) <= {0.0, 1.0, 2.0, 3.0}


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Reservoir(0)


def test_named_inputs_with_text_and_dynamic_rows() -> None:
    """A model's inputs are kept sample by sample: text as strings, token rows of any length (padded with
    zeros when sampled); the layout of the first batch holds until another arrives."""
    r = Reservoir(6, horizon_seconds=None, seed=0)
    ids = np.array([[5, 6, 0], [7, 0, 0]], dtype=np.int64)
    r.add({"text": np.array([["a b"], ["c"]], dtype=object), "ids": ids}, dynamic={"ids"})
    r.add({"text": np.array([["longer text"]], dtype=object), "ids": np.array([[1, 2, 3, 4, 5]])}, dynamic={"ids"})
    s = r.sample()
    assert isinstance(s, dict) and set(s) == {"text", "ids"}
    assert s["text"][:, 0].tolist() == ["a b", "c", "longer text"]
    assert (
        s["ids"].shape == (3, 5) and s["ids"].tolist()[0] == [5, 6, 0, 0, 0] and s["ids"][2].tolist() == [1, 2, 3, 4, 5]
    )
    r.add(np.zeros((2, 3)))  # a bare array (another model) starts afresh
    assert isinstance(r.sample(), np.ndarray)


def test_samples_past_the_byte_bound_are_not_kept() -> None:
    r = Reservoir(10, horizon_seconds=None, seed=0, max_sample_bytes=8)
    r.add({"text": np.array([["short"], ["far too long for it"], ["ok"]], dtype=object)})
    s = r.sample()
    assert isinstance(s, dict) and s["text"][:, 0].tolist() == ["short", "ok"]
    assert r.too_large == 1 and r.seen == 2
    r.add({"ids": np.ones((2, 4), dtype=np.int64)}, dynamic={"ids"})  # 32 bytes a row: nothing offered
    assert r.too_large == 3 and r.seen == 2
