"""Recording a judged batch in a few passes gives what recording it piece by piece gave.

The window statistic is exported by adding each batch's statistic in place and flattening the sum at
scrape time: the same series with the same values, bit for bit, as adding every batch's flat pairs. The
labeling sample draws the requests of one recording call in one draw: with the same random source, the
same predictions as drawing them request by request. The recorder hands the sample the calibrated
predictor it computed for the windows: the same numbers the sample computed from the request itself. The served
windows hold every statistic the offline read of the same predictions holds."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.config.settings import load_settings
from agent.estimation.layout import N_CELLS
from agent.estimation.statistics.items import stat_items
from agent.estimation.statistics.window import WindowStats
from agent.judging.queue import JudgeQueue
from agent.judging.recorder import JudgedBatch, Recorder
from agent.judging.runtime import Runtime, load_runtime
from agent.judging.verdicts import JudgeWork, RowBuffer
from agent.judging.windows import WindowSet
from agent.labels.rows import PendingBatch
from agent.labels.sample import LabelingSample, open_prediction_store
from agent.labels.store import PredictionStore
from agent.labels.uniform_draws import UniformDraws
from agent.model.classifier import default_model_path, label_confidences
from exporters.label_metrics import LabelMetrics
from exporters.prometheus import AgentMetrics
from tests.support.waiting import wait_until


def random_stats(rng: np.random.Generator, size: int, leaves: int) -> WindowStats:
    """A batch's statistic with every kind of field filled, some vectors of varying length."""
    n = int(rng.integers(1, 40))
    verdicts = rng.integers(0, 4, n).astype(np.int8)
    conf = rng.random(n)
    out = WindowStats.of_samples(verdicts, conf, 0.5)
    out.n_ext, out.margin_sum, out.pca_sum = n, float(rng.random() * n), float(rng.random() * n)
    out.leaves = rng.integers(0, 3, leaves).tolist()
    p = rng.dirichlet(np.ones(4), n)
    out.add_class_sums(p, np.argmax(p, axis=1))
    out.pcorrect_n, out.pcorrect_sum = n, float(conf.sum())
    ids = rng.integers(0, size + 1, (2, n))  # size: counted nowhere
    out.add_segment_sums(ids, size, conf, verdicts, rng.random(n) < 0.1)
    return out


def exported(metrics: AgentMetrics) -> dict[tuple[str, ...], float]:
    return {
        tuple(s.labels.values()): s.value
        for fam in metrics.window_stats.collect()
        for s in fam.samples
        if s.name == "icos_window_stat_total"
    }


def test_window_stats_summed_then_flattened_export_what_batches_flattened_did() -> None:
    rng = np.random.default_rng(3)
    batches = [random_stats(rng, 12, leaves) for leaves in (0, 0, 5, 3, 7, 7, 2, 0, 9, 4)]
    by_items, by_sums = AgentMetrics(CollectorRegistry()), AgentMetrics(CollectorRegistry())
    for m in (by_items, by_sums):
        m.record_window_stats("m", "1", "b", stat_items(WindowStats()))  # what a runtime starts with
    for classes, inputs in ((True, True), (False, True), (True, False)):
        flatten = lambda s, c=classes, i=inputs: stat_items(s, classes=c, inputs=i, sparse_segments=True)  # noqa: E731
        key = f"b{classes}{inputs}"
        for m in (by_items, by_sums):
            m.record_window_stats("m", "1", key, stat_items(WindowStats()))
        for stats in batches:
            by_items.record_window_stats("m", "1", key, flatten(stats))
            by_sums.add_window_stats("m", "1", key, stats, flatten)
    old, new = exported(by_items), exported(by_sums)
    assert old == new  # the same series, the same sums bit for bit
    assert any(k[3] == "seg_n:3" for k in new) and any(k[3] == "leaves:8" for k in new)
    assert len({k for k in new if k[3].startswith("cells:")}) == 4 * N_CELLS


def test_add_in_place_is_the_sum() -> None:
    rng = np.random.default_rng(4)
    a, b = random_stats(rng, 6, 3), random_stats(rng, 6, 8)
    total = a.copy()
    total.add_in_place(b)
    assert total == a + b
    empty = WindowStats()
    empty.add_in_place(a)
    assert empty == WindowStats() + a


def runtime(bundle: Path, tmp: Path) -> tuple[Runtime, PredictionStore, LabelMetrics]:
    settings = load_settings(
        None,
        mode="serve",
        model={"name": "mnist", "path": str(default_model_path())},
        bundle={"path": str(bundle)},
        state_dir=str(tmp),
    )
    metrics = LabelMetrics(CollectorRegistry())
    store = open_prediction_store(settings.labels, tmp, metrics)
    store.open()
    return load_runtime(settings), store, metrics


def judged(rt: Runtime, sizes: list[int]) -> list[JudgeWork]:
    assert rt.classifier is not None
    x = np.random.default_rng(5).random((sum(sizes), 1, 28, 28), dtype=np.float32)
    works, start = [], 0
    for i, n in enumerate(sizes):
        xb = rt.classifier.prepare(x[start : start + n])
        pred = rt.classifier.predict_prepared(xb)
        works.append(JudgeWork(rt, rt.features(xb, pred), pred.probabilities, pred.predicted, None, None, f"r{i}"))
        start += n
    return works


def test_group_draw_draws_what_request_by_request_drew(tmp_path: Path, mnist_bundle_dir: Path) -> None:
    rt, store, metrics = runtime(mnist_bundle_dir, tmp_path)
    got: list[JudgedBatch] = []
    Recorder(WindowSet({"5m": 300.0}, None), AgentMetrics(CollectorRegistry()), [got.append]).record(
        judged(rt, [1, 7, 32, 1, 3])
    )
    one = LabelingSample(store, UniformDraws(0.3), metrics, rng=np.random.default_rng(11))
    group = LabelingSample(store, UniformDraws(0.3), metrics, rng=np.random.default_rng(11))
    for batch in got:
        one.on_judged(batch)
    first = store._take()
    group.on_judged_group(got)
    second = store._take()

    def drawn(rows: list[PendingBatch]) -> list[tuple[str, list[int]]]:
        return [(r.request_id, [] if r.sampled is None else r.sampled.tolist()) for r in rows]

    assert drawn(first) == drawn(second)
    assert sum(len(s) for _, s in drawn(first)) > 0


def test_recorder_hands_the_sample_the_predictor_it_computed(tmp_path: Path, mnist_bundle_dir: Path) -> None:
    rt, _store, _metrics = runtime(mnist_bundle_dir, tmp_path)
    groups: list[list[JudgedBatch]] = []
    recorder = Recorder(
        WindowSet({"5m": 300.0}, None),
        AgentMetrics(CollectorRegistry()),
        judged_group_sinks=[lambda batches: groups.append(list(batches))],
    )
    recorder.record(judged(rt, [4, 1, 16]))
    (batches,) = groups
    assert [b.request_id for b in batches] == ["r0", "r1", "r2"]
    for b in batches:
        assert b.predicted_correct is not None
        conf = label_confidences(b.probabilities, b.predicted)
        np.testing.assert_allclose(
            b.predicted_correct, rt.calibration.predicted_correct(conf, b.verdicts), rtol=1e-12, atol=0
        )


def test_reservoir_offered_a_group_keeps_what_request_by_request_kept() -> None:
    from agent.data.reservoir import Reservoir

    rng = np.random.default_rng(6)
    sizes = [3, 1, 5, 1, 1, 9, 2, 4, 1, 7, 6, 3, 1, 8]
    batches = [{"x": rng.random((n, 2, 3), dtype=np.float32), "k": rng.integers(0, 9, (n, 1))} for n in sizes]
    one, group = Reservoir(12, horizon_seconds=None, seed=2), Reservoir(12, horizon_seconds=None, seed=2)
    for b in batches[:2]:  # part of the fill before, the rest within the groups
        one.add(b)
    group.add_many(batches[:2])
    for b in batches[2:]:
        one.add(b)
    group.add_many(batches[2:7])
    group.add_many(batches[7:])
    a, b = one.sample(), group.sample()
    assert isinstance(a, dict) and isinstance(b, dict)
    assert one.seen == group.seen == sum(sizes)
    for name in ("x", "k"):
        np.testing.assert_array_equal(a[name], b[name])
    # token ids of a dynamic length: kept row by row, the same way
    dyn = [{"ids": rng.integers(0, 5, (n, 3 + n))} for n in (2, 1, 4, 6)]
    one, group = Reservoir(5, horizon_seconds=None, seed=3), Reservoir(5, horizon_seconds=None, seed=3)
    for d in dyn:
        one.add(d, {"ids"})
    group.add_many(dyn, {"ids"})
    left, right = one.sample(), group.sample()
    assert isinstance(left, dict) and isinstance(right, dict)
    assert [r.tolist() for r in left["ids"]] == [r.tolist() for r in right["ids"]]


def test_verdicts_as_codes_encode_as_their_bytes_did() -> None:
    from agent.dataplane.admission import VERDICT_BYTES, VERDICT_VOCABULARY
    from agent.protocol import v2, v2_grpc
    from agent.protocol.inference import InferResponse, Tensor, encode_bytes_elements

    codes = np.random.default_rng(8).integers(0, len(VERDICT_BYTES), 97).astype(np.int8)
    plain = Tensor("icos_verdict", "BYTES", [97], VERDICT_BYTES[codes])
    coded = Tensor("icos_verdict", "BYTES", [97], VERDICT_BYTES[codes], coded=(codes, VERDICT_VOCABULARY))
    assert coded.bytes_wire() == plain.bytes_wire() == encode_bytes_elements(VERDICT_BYTES[codes])
    assert coded.bytes_texts() == plain.bytes_texts()
    assert coded.bytes_elements() == plain.bytes_elements()
    for binary in (True, False):
        plain.binary = coded.binary = binary
        assert v2.encode_answer(InferResponse("m", "1", "r", {}, [coded])) == v2.encode_answer(
            InferResponse("m", "1", "r", {}, [plain])
        )
    for raw in (True, False):
        a = v2_grpc.encode_infer_response(InferResponse("m", "1", "r", {}, [coded]), raw)
        b = v2_grpc.encode_infer_response(InferResponse("m", "1", "r", {}, [plain]), raw)
        assert a.SerializeToString() == b.SerializeToString()
    empty = np.zeros(0, dtype=np.int8)
    assert VERDICT_VOCABULARY.wire(empty) == b"" and VERDICT_VOCABULARY.texts(empty).tolist() == []


def test_segment_sums_count_each_prediction_once_in_its_segment_of_every_dimension() -> None:
    """The ``seg_*`` sums equal a plain loop over predictions and dimensions; id ``size`` counts nowhere."""
    rng = np.random.default_rng(11)
    size, n = 9, 200
    ids = rng.integers(0, size + 1, (3, n))
    conf = rng.random(n)
    verdicts = rng.integers(0, 4, n).astype(np.int8)
    novel = rng.random(n) < 0.2
    out = WindowStats()
    out.add_segment_sums(ids, size, conf, verdicts, novel)
    want_n, want_fails, want_novel = [0] * size, [0] * size, [0] * size
    want_conf, want_sq = [0.0] * size, [0.0] * size
    for d in range(ids.shape[0]):
        for i in range(n):
            s = int(ids[d, i])
            if s == size:
                continue
            want_n[s] += 1
            want_fails[s] += int(verdicts[i] != 0)
            want_novel[s] += int(novel[i])
            want_conf[s] += float(conf[i])
            want_sq[s] += float(conf[i]) ** 2
    assert (out.seg_n, out.seg_fails, out.seg_novel) == (want_n, want_fails, want_novel)
    assert all(isinstance(v, int) for v in out.seg_n + out.seg_fails + out.seg_novel)
    np.testing.assert_allclose(out.seg_conf, want_conf)
    np.testing.assert_allclose(out.seg_conf_sq, want_sq)
    out.add_segment_sums(ids, size, conf, verdicts, None)  # without novelty: none counted
    assert out.seg_novel == [0] * size and out.seg_n == want_n


def test_the_row_buffer_concatenates_like_numpy_and_lends_no_memory_beyond_its_bound() -> None:
    """A recording call's feature rows: what ``np.concatenate`` gives, in one reused array per row shape (the next
    call of that shape overwrites it); a call beyond the bound, or of parts that do not stack, gets its own."""
    rng = np.random.default_rng(0)
    rows = RowBuffer(limit_bytes=64 * 8 * 4)
    parts = [rng.random((n, 8)).astype(np.float32) for n in (3, 5, 2)]
    first = rows.rows(parts)
    assert np.array_equal(first, np.concatenate(parts)) and first.dtype == np.float32
    again = rows.rows(parts[:2])
    assert np.shares_memory(first, again) and np.array_equal(again, np.concatenate(parts[:2]))
    assert rows.rows(parts[:1]) is parts[0]  # one work: its own rows, uncopied
    wide = [rng.random((2, 3, 4)), rng.random((1, 3, 4))]  # another shape and dtype: a buffer of its own
    assert np.array_equal(rows.rows(wide), np.concatenate(wide)) and np.array_equal(rows.rows(parts), first)
    big = [rng.random((40, 8)).astype(np.float32) for _ in range(2)]  # 80 rows > the bound of 64
    out = rows.rows(big)
    assert np.array_equal(out, np.concatenate(big)) and not np.shares_memory(out, first)
    mixed = [parts[0], parts[1].astype(np.float64)]
    assert np.array_equal(rows.rows(mixed), np.concatenate(mixed))


def test_the_judge_stops_lingering_once_enough_bytes_wait_not_only_enough_predictions(
    tmp_path: Path, mnist_bundle_dir: Path
) -> None:
    """The background thread records what waits after ``linger_seconds``, or at once when enough predictions or
    enough bytes of their features and inputs wait: large inputs are not held for the whole linger period."""
    rt, _store, _metrics = runtime(mnist_bundle_dir, tmp_path)
    works = judged(rt, [8, 8, 8])
    per_work = works[0].nbytes
    assert per_work >= 8 * 28 * 28 * 4  # the features at least
    queue = JudgeQueue(
        Recorder(WindowSet({"5m": 300.0}, None), AgentMetrics(CollectorRegistry())),
        linger_seconds=60,
        linger_samples=10_000,
        linger_bytes=2 * per_work,
    )
    queue.start()
    try:
        queue.submit(works[0])  # below both bounds: it lingers
        assert not wait_until(lambda: works[0].done, 0.5)
        queue.submit(works[1])  # two works' bytes: recorded without waiting out the 60 s
        assert wait_until(lambda: works[0].done and works[1].done, 10)
    finally:
        queue.stop()
    assert works[0].verdicts is not None and not works[2].done


def test_the_served_windows_hold_every_statistic_the_offline_check_computes(
    tmp_path: Path, mnist_bundle_dir: Path
) -> None:
    """The recorder behind ``serve``, ``proxy`` and ``observe`` and the offline read (``check``, the Python API,
    Spark: :meth:`WindowStats.from_batch`) build a batch's statistics each in their own steps: every field of a
    served window, its time window's and its count window's, equals the offline read of the same predictions (a
    statistic the served side skipped, as the change sums once were, leaves its field empty there)."""
    rt, _store, _metrics = runtime(mnist_bundle_dir, tmp_path)
    assert rt.calibration.segments is not None and rt.calibration.segments.change is not None
    windows = WindowSet({"5m": 300.0}, 10_000)
    works = judged(rt, [5, 32, 1, 17])
    Recorder(windows, AgentMetrics(CollectorRegistry())).record(works)
    probabilities = np.concatenate([w.probabilities for w in works])
    predicted = np.concatenate([w.predicted for w in works])
    verdicts = np.concatenate([w.verdicts_or_raise() for w in works]).astype(np.int8)
    rules = np.concatenate([w.tdi_rules for w in works if w.tdi_rules is not None])
    offline = WindowStats.from_batch(
        verdicts,
        label_confidences(probabilities, predicted),
        rt.calibration,
        probabilities=probabilities,
        labels=predicted,
        features=np.concatenate([w.features for w in works]),
        tdi_rules=rules,
    ).to_dict()
    assert offline["change_sum"] and offline["seg_n"] and offline["n_ext"] == len(verdicts)
    for name, served in windows.stats(rt.calibration, time.time()).items():
        got = served.to_dict()
        assert set(got) == set(offline)
        rel = 1e-6 if name == windows.count_name else 1e-9  # the count window keeps some columns in float32
        for key, want in offline.items():
            if isinstance(want, list):
                np.testing.assert_allclose(got[key], want, rtol=rel, atol=1e-9, err_msg=f"{name}: {key}")
            elif isinstance(want, float):
                assert got[key] == pytest.approx(want, rel=rel, abs=1e-9), (name, key)
            else:
                assert got[key] == want, (name, key)
