"""Streaming windows: time buckets expire, the count window is exact, state round-trips."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from agent.core.array_json import decode_array, is_encoded
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import estimate_all
from agent.estimation.intervals import Estimate
from agent.estimation.statistics.window import SampleExtras, WindowStats
from agent.judging.windows import CountWindow, TimeWindow, WindowSet, bucket_seconds_for

CAL = EstimatorCalibration(tpr=0.6, fpr=0.05, n_wrong=50, n_right=950, accuracy=0.95, avg_conf=0.93, atc_threshold=0.7)


def batch(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.choice(4, size=n, p=[0.85, 0.05, 0.05, 0.05]).astype(np.int8), rng.uniform(0.3, 1.0, n)


def test_bucket_sizes() -> None:
    assert bucket_seconds_for(300) == 5
    assert bucket_seconds_for(3600) == 60
    assert bucket_seconds_for(10) == 1


def test_time_window_expires_old_buckets() -> None:
    w = TimeWindow(60)
    one = WindowStats.from_batch(np.zeros(3, np.int8), np.ones(3), CAL)
    w.add(one, now=1000.0)
    w.add(one, now=1030.0)
    assert w.stats(1030.0).n == 6
    assert w.stats(1059.0).n == 6
    assert w.stats(1061.0).n == 3  # the first bucket is older than 60 s
    assert w.stats(1100.0).n == 0
    assert len(w.buckets) == 0


def test_time_window_matches_batch_statistics() -> None:
    rng = np.random.default_rng(1)
    w = TimeWindow(300)
    vs, cs = [], []
    for t in range(0, 200, 7):
        v, c = batch(rng, 13)
        w.add(WindowStats.from_batch(v, c, CAL), now=10_000.0 + t)
        vs.append(v)
        cs.append(c)
    expected = WindowStats.from_batch(np.concatenate(vs), np.concatenate(cs), CAL)
    got = w.stats(10_200.0)
    assert got.n == expected.n and got.fails == expected.fails and got.atc_above == expected.atc_above
    assert got.fails_by_family == expected.fails_by_family
    assert got.conf_sum == pytest.approx(expected.conf_sum)


@pytest.mark.parametrize("chunks", [[5, 5, 5], [3, 9, 2, 7, 11], [30], [1] * 25, [8, 8, 8, 8]])
def test_count_window_is_exact(chunks: list[int]) -> None:
    rng = np.random.default_rng(sum(chunks))
    w = CountWindow(10)
    vs, cs = [], []
    for n in chunks:
        v, c = batch(rng, n)
        w.add(v, c)
        vs.append(v)
        cs.append(c)
    v_all, c_all = np.concatenate(vs)[-10:], np.concatenate(cs)[-10:]
    expected = WindowStats.from_batch(v_all, c_all, CAL)
    got = w.stats(CAL)
    assert got.n == expected.n == min(10, sum(chunks))
    assert got.fails == expected.fails and got.conf_sum == pytest.approx(expected.conf_sum)
    restored = CountWindow.from_dict(json.loads(json.dumps(w.to_dict())))
    again = restored.stats(CAL)
    assert (again.n, again.fails, again.atc_above, again.fails_by_family) == (
        got.n,
        got.fails,
        got.atc_above,
        got.fails_by_family,
    )
    assert again.conf_sum == pytest.approx(got.conf_sum)
    np.testing.assert_array_equal(np.sort(restored._filled()[1]), np.sort(w._filled()[1]))


def test_window_set_estimates_and_roundtrip() -> None:
    rng = np.random.default_rng(3)
    ws = WindowSet({"1m": 60, "1h": 3600}, 50)
    for t in range(10):
        v, c = batch(rng, 20)
        ws.record(v, c, CAL, now=5_000.0 + 10 * t)
    est = estimates_of(ws, now=5_095.0)
    assert set(est) == {"1m", "1h", "last50"}
    assert est["1h"][0].n == 200 and est["last50"][0].n == 50
    assert est["1m"][0].n < 200  # the first ones have left the minute window
    for _stats, values in est.values():
        for e in values.values():
            assert 0.0 <= e.lower <= e.value <= e.upper <= 1.0
    saved = json.loads(json.dumps(ws.to_dict()))
    other = WindowSet({"1m": 60, "1h": 3600, "5m": 300}, 50)
    other.restore(saved)
    again = estimates_of(other, now=5_095.0)
    assert again["1h"][0].n == 200 and again["last50"][0].n == 50 and again["5m"][0].n == 0
    assert other.total == 200
    other.reset()
    assert all(s.n == 0 for s, _ in estimates_of(other, now=5_095.0).values())


def estimates_of(ws: WindowSet, now: float) -> dict[str, tuple[WindowStats, dict[str, Estimate]]]:
    return {name: (s, estimate_all(s, CAL)) for name, s in ws.stats(CAL, now).items()}


def test_empty_windows_have_no_estimates() -> None:
    ws = WindowSet({"5m": 300}, 10)
    assert all(values == {} for _s, values in estimates_of(ws, now=1.0).values())


def test_buckets_summed_in_place_equal_the_sum_of_batches() -> None:
    rng = np.random.default_rng(7)
    w = TimeWindow(60)
    expected: dict[int, WindowStats] = {}  # what ``+`` gives, bucket by bucket
    for i in range(30):
        v, c = batch(rng, int(rng.integers(1, 40)))
        s = WindowStats.from_batch(v, c, CAL)
        s.leaves = [int(k) for k in rng.integers(0, 5, size=int(rng.integers(0, 6)))]  # lists of unequal length
        s.n_ext, s.pca_sum, s.pca_bins = s.n, float(rng.uniform()), [int(k) for k in rng.integers(0, 4, 4)]
        snapshot = s.to_dict()
        w.add(s, now=1000.0 + i % 3)  # three bucket seconds: new buckets and in-place sums
        assert s.to_dict() == snapshot  # the added batch itself is left alone
        expected[i % 3] = expected[i % 3] + s if i % 3 in expected else s
    assert [b.to_dict() for b in w.buckets.values()] == [b.to_dict() for b in expected.values()]


def _probabilities(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 probability vectors (as models answer) and predictions, some not the most probable class."""
    p = rng.dirichlet(np.full(k, 0.7), n).astype(np.float32)
    pred = p.argmax(axis=1)
    pred[::7] = (pred[::7] + 1) % k
    return p, pred


@pytest.mark.parametrize("chunks", [[5, 5, 5], [3, 9, 2, 7, 11], [30], [1] * 25])
def test_count_window_per_class_sums_are_those_of_its_last_predictions(chunks: list[int]) -> None:
    """The count window keeps the probability vectors: its CBPE sums are exactly those of the last
    ``size`` predictions (after wrapping and after a round trip through its state)."""
    from agent.estimation.statistics.class_metrics import expected_confusion, metrics_of_confusion, window_class_metrics

    rng = np.random.default_rng(len(chunks))
    w = CountWindow(10)
    ps, preds = [], []
    for n in chunks:
        v, c = batch(rng, n)
        p, pred = _probabilities(rng, n, 3)
        w.add(v, c, None, p, pred)
        ps.append(p)
        preds.append(pred)
    p_all, pred_all = np.concatenate(ps)[-10:], np.concatenate(preds)[-10:]
    want = WindowStats()
    want.add_class_sums(p_all, pred_all)
    for window in (w, CountWindow.from_dict(json.loads(json.dumps(w.to_dict())))):
        got = window.stats(CAL)
        assert got.cbpe_n == len(p_all) and got.cbpe_predicted == want.cbpe_predicted
        assert got.cbpe_true_positive == pytest.approx(want.cbpe_true_positive, rel=1e-12)
        assert got.cbpe_support == pytest.approx(want.cbpe_support, rel=1e-12)
        figures = window_class_metrics(got.cbpe_predicted, got.cbpe_true_positive, got.cbpe_support, ["a", "b", "c"])
        offline = metrics_of_confusion(expected_confusion(p_all, pred_all), ["a", "b", "c"])
        assert figures is not None and figures["macro"] == pytest.approx(offline["macro"])


def test_count_window_reports_per_class_sums_only_when_every_kept_prediction_has_them() -> None:
    rng = np.random.default_rng(5)
    w = CountWindow(8)
    v, c = batch(rng, 4)
    p, pred = _probabilities(rng, 4, 3)
    w.add(v, c, None, p, pred)
    w.add(v, c)  # a batch without probability vectors (e.g. a model above the class cap)
    assert w.stats(CAL).cbpe_n == 0 and "classes" not in w.to_dict()
    w.add(*batch(rng, 8), None, *_probabilities(rng, 8, 3))  # pushes the incomplete ones out
    assert w.stats(CAL).cbpe_n == 8
    # vectors of another width (another model) restart the per-class columns
    w.add(*batch(rng, 2), None, *_probabilities(rng, 2, 5))
    assert w.stats(CAL).cbpe_n == 0
    w.add(*batch(rng, 6), None, *_probabilities(rng, 6, 5))
    s = w.stats(CAL)
    assert s.cbpe_n == 8 and len(s.cbpe_support) == 5
    # a state of an older layout (no per-class columns) restores without them
    saved = w.to_dict()
    del saved["classes"]
    assert CountWindow.from_dict(saved).stats(CAL).cbpe_n == 0


def test_window_set_passes_probability_vectors_to_the_count_window_only() -> None:
    rng = np.random.default_rng(9)
    ws = WindowSet({"1m": 60}, 20)
    v, c = batch(rng, 30)
    p, pred = _probabilities(rng, 30, 4)
    stats = WindowStats.from_batch(v, c, CAL, probabilities=p, labels=pred)
    ws.record(v, c, CAL, now=100.0, stats=stats, probabilities=p, labels=pred)
    got = ws.stats(CAL, now=100.0)
    assert got["1m"].cbpe_n == 30 and got["last20"].cbpe_n == 20
    tail = WindowStats.from_batch(v[-20:], c[-20:], CAL, probabilities=p[-20:], labels=pred[-20:])
    assert got["last20"].cbpe_support == pytest.approx(tail.cbpe_support)


def _full_count_window(rng: np.random.Generator, size: int, n: int) -> CountWindow:
    """A count window whose every column is filled: extras, probability vectors, segments and change columns."""
    w = CountWindow(size)
    v, c = batch(rng, n)
    extras = SampleExtras(
        margin=rng.random(n),
        rules=rng.integers(0, 9, n),
        agree=rng.random(n) < 0.8,
        covered=rng.random(n) < 0.5,
        pca_error=rng.random(n),
        label=rng.integers(0, 3, n),
    )
    p, pred = _probabilities(rng, n, 3)
    segments = rng.integers(0, 7, (2, n)).astype(np.int32)
    w.add(v, c, extras, p, pred, segments, rng.random((n, 5)).astype(np.float32))
    return w


def _as_lists(saved: dict[str, Any]) -> dict[str, Any]:
    """The same state as the versions that saved every column as a list of numbers wrote it."""
    return {
        k: (
            decode_array(v).tolist()
            if is_encoded(v)
            else {kk: decode_array(vv).tolist() for kk, vv in v.items()}
            if isinstance(v, dict)
            else v
        )
        for k, v in saved.items()
    }


def test_the_count_window_saves_its_columns_as_their_bytes_and_reads_states_of_older_versions() -> None:
    """Its columns are saved as base64 of their bytes: a column read back bit for bit, a document about a third over
    the columns' own bytes (a list of numbers costs a Python object per number while saved, and its decimal text);
    a state saved as lists by older versions restores to the same window."""
    rng = np.random.default_rng(21)
    w = _full_count_window(rng, 400, 700)  # the ring has wrapped: saved oldest first
    text = json.dumps(w.to_dict())
    own = sum(b[: w.count].nbytes for b in w._buffers())
    assert len(text) <= 1.4 * own + 2_000
    restored = CountWindow.from_dict(json.loads(text))
    for mine, theirs in zip(w._ordered(), restored._ordered(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    older = CountWindow.from_dict(json.loads(json.dumps(_as_lists(json.loads(text)))))
    for mine, theirs in zip(w._ordered(), older._ordered(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert older.stats(CAL) == w.stats(CAL)


def test_a_damaged_count_window_column_is_refused_by_name() -> None:
    """A saved column whose bytes do not fill its shape, or that is neither encoded nor a list, raises ``ValueError``
    naming it: the state store quarantines such a document and the agent starts with empty windows."""
    saved = _full_count_window(np.random.default_rng(3), 50, 50).to_dict()
    cut = dict(saved, confidences=dict(saved["confidences"], base64=saved["confidences"]["base64"][:-8]))
    with pytest.raises(ValueError, match="confidences"):
        CountWindow.from_dict(cut)
    with pytest.raises(ValueError, match="change"):
        CountWindow.from_dict(dict(saved, change="3"))
