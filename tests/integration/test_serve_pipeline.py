"""The serve path's judging and recording: deferred (the judge queue's lingering background thread),
on the event loop and combined, they give the same verdicts as the reference oracle, and every
prediction reaches the windows exactly once."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.data.datasets import Splits
from agent.estimation.estimators.registry import estimate_all
from agent.judging.queue import JudgeQueue
from agent.judging.recorder import JudgedBatch, JudgedSink, Recorder
from agent.judging.runtime import Runtime, load_runtime
from agent.judging.verdicts import JudgeWork
from agent.judging.windows import WindowSet
from agent.server.composition import Agent
from agent.server.http_infer import answer_http
from exporters.prometheus import AgentMetrics
from invariants.oracle import VERDICTS as VERDICT_NAMES
from tests.support.settings import mnist_app, mnist_settings
from tests.support.waiting import wait_until


def runtime(bundle: Path) -> Runtime:
    return load_runtime(mnist_settings(bundle))


def service(bundle: Path) -> Agent:
    """The serve-mode agent of an app that is not started (no lifespan: no background judge)."""
    svc: Agent = mnist_app(bundle, audits={"reservoir": {"size": 0}, "mlflow": {"enabled": False}}).state.agent
    return svc


def queue_with(windows: WindowSet, sink: JudgedSink | None = None, linger_seconds: float = 0.05) -> JudgeQueue:
    recorder = Recorder(windows, AgentMetrics(CollectorRegistry()), [sink] if sink is not None else [])
    return JudgeQueue(recorder, linger_seconds=linger_seconds)


def add_sink(svc: Agent, sink: JudgedSink) -> None:
    """Give the agent's recorder one more judged-batch sink (a spy)."""
    rec = svc.judge_queue.recorder
    svc.judge_queue.recorder = Recorder(
        rec.windows,
        rec.metrics,
        [*rec.judged_sinks, sink],
        input_sinks=rec.input_sinks,
        judged_group_sinks=rec.judged_group_sinks,
    )


async def infer(svc: Agent, body: bytes, header_length: str | None) -> tuple[bytes, dict[str, str]]:
    return await answer_http(svc.plane, body, header_length, "mnist", None)


def reference_verdicts(rt: Runtime, x: np.ndarray) -> np.ndarray:
    assert rt.classifier is not None
    pred = rt.classifier.predict(x)
    result = rt.bundle.oracle().judge(
        rt.classifier.features(rt.classifier.prepare(x)), pred.probabilities, pred.predicted
    )
    return np.asarray(result.verdict, dtype=np.int8)


def test_deferred_judging_matches_the_oracle(mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    rt = runtime(mnist_bundle_dir)
    assert rt.classifier is not None
    judged: dict[str, np.ndarray] = {}
    windows = WindowSet({"1m": 60.0}, 500)
    pipe = queue_with(windows, lambda b: judged.__setitem__(b.request_id, b.verdicts))
    x = mnist_splits.test.x[:500]
    sizes = [1] * 40 + [7, 32, 1, 64, 3] * 4
    pipe.start()
    try:
        start = 0
        for i, n in enumerate(sizes):
            xb = rt.classifier.prepare(x[start : start + n])
            pred = rt.classifier.predict_prepared(xb)
            feats = rt.classifier.features(xb)
            pipe.submit(JudgeWork(rt, feats, pred.probabilities, pred.predicted, None, 0.001, f"r{i}"))
            start += n
        # recorded by the lingering thread on its own, without a flush
        assert wait_until(lambda: windows.total == start, timeout=20)
    finally:
        pipe.stop()
    assert windows.total == start
    got = np.concatenate([judged[f"r{i}"] for i in range(len(sizes))])
    np.testing.assert_array_equal(got, reference_verdicts(rt, x[:start]))


def test_inline_judging_takes_the_deferred_work_along(mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    rt = runtime(mnist_bundle_dir)
    assert rt.classifier is not None
    batches: list[JudgedBatch] = []
    windows = WindowSet({"1m": 60.0}, None)
    pipe = queue_with(windows, batches.append, linger_seconds=60.0)
    x = rt.classifier.prepare(mnist_splits.test.x[:20])
    pred = rt.classifier.predict_prepared(x)
    feats = rt.classifier.features(x)
    pipe.start()
    try:
        pipe.submit(JudgeWork(rt, feats[:5], pred.probabilities[:5], pred.predicted[:5], None, None, "later"))
        now = JudgeWork(rt, feats[5:], pred.probabilities[5:], pred.predicted[5:], None, None, "now")
        pipe.record_now([now])
        # the background thread still lingers; the call that recorded now took both requests along
        assert windows.total == 20
        assert sorted(b.request_id for b in batches) == ["later", "now"]
    finally:
        pipe.stop()
    ref = reference_verdicts(rt, mnist_splits.test.x[:20])
    np.testing.assert_array_equal(now.verdicts_or_raise(), ref[5:])
    assert windows.total == 20


def test_live_windows_use_the_full_shift_aware_model(mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    """The serve path passes the oracle's TDI leaves, margins and inputs to the windows, so the live
    count window and time window give exactly the offline `check` statistics (not the reduced model)."""
    from agent.data.files import Dataset
    from agent.estimation.estimators.registry import RECOMMENDED_ESTIMATOR
    from agent.offline.check import check_report

    rt = runtime(mnist_bundle_dir)
    assert rt.classifier is not None and rt.calibration.shift is not None
    x = mnist_splits.test.x[:300]
    windows = WindowSet({"1h": 3600.0}, 300)
    pipe = queue_with(windows, linger_seconds=60.0)
    for start in range(0, 300, 37):
        xb = rt.classifier.prepare(x[start : start + 37])
        pred = rt.classifier.predict_prepared(xb)
        feats = rt.classifier.features(xb)
        pipe.record_now([JudgeWork(rt, feats, pred.probabilities, pred.predicted, None, None, f"r{start}")])
    offline = check_report(rt.classifier, rt.bundle, Dataset(x, mnist_splits.test.y[:300]))
    expected = offline["estimates"][RECOMMENDED_ESTIMATOR]["value"]
    import time

    now = time.time()
    for window, stats in windows.stats(rt.calibration, now).items():
        est = estimate_all(stats, rt.calibration)
        assert stats.n_ext == 300, window  # every sample carried the full model's inputs
        assert est[RECOMMENDED_ESTIMATOR].value == pytest.approx(expected, abs=1e-9), window
    # restoring the count window from state keeps the extras
    from agent.judging.windows import CountWindow

    count = windows.count
    assert count is not None
    restored = CountWindow.from_dict(count.to_dict()).stats(rt.calibration)
    assert restored.n_ext == 300


def test_verdict_requests_of_one_loop_turn_are_judged_together(mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    """Small requests asking for ``icos_verdict`` run on the event loop; those that arrive together are
    judged in one oracle call and each still gets its own verdicts; a lone request is judged at once.
    Their predictions are recorded afterwards, off the request path, in one lingering batch."""
    import asyncio
    import json

    from tests.support.v2 import verdict_body

    svc = service(mnist_bundle_dir)
    rt = svc.runtimes.current
    xs = [mnist_splits.test.x[3 * i : 3 * i + 3] for i in range(12)]

    def verdicts_of(answer: tuple[bytes, dict[str, str]]) -> list[str]:
        (out,) = [o for o in json.loads(answer[0])["outputs"] if o["name"] == "icos_verdict"]
        return list(out["data"])

    async def together() -> list[tuple[bytes, dict[str, str]]]:
        bodies = [json.dumps(verdict_body(x)).encode() for x in xs]
        return list(await asyncio.gather(*(infer(svc, b, None) for b in bodies)))

    async def together_then_recorded() -> list[tuple[bytes, dict[str, str]]]:
        answers = await together()
        assert svc.windows.total == 0  # answered before anything was recorded
        for _ in range(100):
            await asyncio.sleep(0.02)
            if svc.windows.total:
                break
        return answers

    answers = asyncio.run(together_then_recorded())
    assert (svc.verdicts.calls, svc.verdicts.works) == (1, 12)
    for x, answer in zip(xs, answers, strict=True):
        assert verdicts_of(answer) == [VERDICT_NAMES[v] for v in reference_verdicts(rt, x)]
    assert svc.windows.total == 36
    assert svc.loop_recorder.calls == 1  # the twelve requests recorded in one call

    alone = asyncio.run(infer(svc, json.dumps(verdict_body(mnist_splits.test.x[100:101])).encode(), None))
    assert (svc.verdicts.calls, svc.verdicts.works) == (2, 13)
    assert verdicts_of(alone) == [VERDICT_NAMES[v] for v in reference_verdicts(rt, mnist_splits.test.x[100:101])]


def test_small_requests_are_judged_on_the_loop_and_large_ones_in_the_thread(
    mnist_bundle_dir: Path, mnist_splits: Splits
) -> None:
    """Small requests that do not wait for their verdicts are judged on the event loop, together, once
    the linger period is over; beyond ``max_samples`` pending predictions the background thread
    judges them. Every prediction reaches the windows once, with the reference oracle's verdict, and a
    large binary request (model in a worker thread) is judged like the others."""
    import asyncio

    from agent.protocol import v2

    svc = service(mnist_bundle_dir)
    rt = svc.runtimes.current
    judged: dict[str, np.ndarray] = {}
    add_sink(svc, lambda b: judged.__setitem__(b.request_id, b.verdicts))
    xs = [mnist_splits.test.x[3 * i : 3 * i + 3] for i in range(40)]

    no_verdicts = [v2.RequestedOutput("probabilities", True), v2.RequestedOutput("label", True)]

    def request(i: int) -> tuple[bytes, str]:
        x = np.ascontiguousarray(xs[i], dtype=np.float32)
        raw, headers = v2.encode_request(
            [v2.tensor("input", x, "FP32")], binary=True, request_id=f"r{i}", outputs=no_verdicts
        )
        return raw, headers[v2.HEADER_LENGTH.lower()]

    assert rt.classifier is not None
    rt.classifier.predict(xs[0])  # onnxruntime's first run is slow; it would count as a costly request
    svc.judge_queue.linger_seconds = 0.5  # far longer than a burst takes

    async def burst(ids: range) -> None:
        before = svc.windows.total
        await asyncio.gather(*(infer(svc, *request(i)) for i in ids))
        assert svc.windows.total == before  # nothing judged in the requests' own turns
        for _ in range(100):
            await asyncio.sleep(0.05)
            if svc.loop_recorder.calls and svc.windows.total == 3 * ids.stop:
                break

    asyncio.run(burst(range(10)))
    assert (svc.loop_recorder.calls, svc.loop_recorder.handed_over) == (1, 0)
    assert svc.windows.total == 30

    svc.loop_recorder.max_samples = 12  # the 5th request of the next burst goes to the background thread
    svc.judge_queue.start()
    try:
        asyncio.run(burst(range(10, 40)))
        assert wait_until(lambda: svc.windows.total == 120, timeout=20)
        assert svc.loop_recorder.handed_over >= 1

        big = np.ascontiguousarray(mnist_splits.test.x[200:232], dtype=np.float32)  # 100 KB
        raw, headers = v2.encode_request(
            [v2.tensor("input", big, "FP32")], binary=True, request_id="big", outputs=no_verdicts
        )
        header_length = headers[v2.HEADER_LENGTH.lower()]
        assert len(raw) > 64 * 1024
        asyncio.run(infer(svc, raw, header_length))
        assert wait_until(lambda: svc.windows.total == 152, timeout=20)
    finally:
        svc.judge_queue.stop()
    got = np.concatenate([judged[f"r{i}"] for i in range(40)] + [judged["big"]])
    np.testing.assert_array_equal(got, reference_verdicts(rt, np.concatenate([*xs, big])))


def test_a_large_verdict_call_is_judged_in_a_worker_thread(mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    """Verdict requests of one loop turn holding more than ``max_samples`` predictions are judged in
    one oracle call in a worker thread, not on the loop; each request still gets its own verdicts."""
    import asyncio
    import json

    from tests.support.v2 import verdict_body

    svc = service(mnist_bundle_dir)
    rt = svc.runtimes.current
    judging_threads: list[str] = []
    import agent.judging.loop as loop_module

    judge = loop_module.judge

    def spy(works: list[JudgeWork]) -> None:
        judging_threads.append(threading.current_thread().name)
        judge(works)

    loop_module.judge = spy  # type: ignore[assignment]
    xs = [mnist_splits.test.x[3 * i : 3 * i + 3] for i in range(4)]

    async def together(max_samples: int) -> list[tuple[bytes, dict[str, str]]]:
        svc.verdicts.max_samples = max_samples
        bodies = [json.dumps(verdict_body(x)).encode() for x in xs]
        return list(await asyncio.gather(*(infer(svc, b, None) for b in bodies)))

    for max_samples, in_thread in ((12, 0), (11, 1)):
        judging_threads.clear()
        answers = asyncio.run(together(max_samples))
        assert svc.verdicts.in_thread == in_thread
        assert len(judging_threads) == 1
        assert (judging_threads[0] == "MainThread") == (in_thread == 0)
        for x, answer in zip(xs, answers, strict=True):
            (out,) = [o for o in json.loads(answer[0])["outputs"] if o["name"] == "icos_verdict"]
            assert list(out["data"]) == [VERDICT_NAMES[v] for v in reference_verdicts(rt, x)]
    loop_module.judge = judge  # type: ignore[assignment]
    assert (svc.verdicts.calls, svc.verdicts.works) == (2, 8)


def test_verdicts_do_not_wait_for_a_busy_judge(mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    """While another judging call holds the judging lock (the background thread recording a batch), a
    verdict request is still answered at once, on the loop: the oracle takes no lock. Its predictions
    are recorded once the lock is free."""
    import asyncio
    import json

    from tests.support.v2 import verdict_body

    svc = service(mnist_bundle_dir)
    rt = svc.runtimes.current
    x = mnist_splits.test.x[:3]
    lock = svc.judge_queue._judge_lock  # what a recording call in the background thread holds

    async def scenario() -> tuple[bytes, dict[str, str]]:
        lock.acquire()
        try:
            answer = await asyncio.wait_for(infer(svc, json.dumps(verdict_body(x)).encode(), None), timeout=10)
            first = svc.loop_recorder._timer
            assert first is not None  # the loop's recording call is scheduled
            for _ in range(100):  # until it came due, found the lock taken and scheduled itself again
                await asyncio.sleep(svc.judge_queue.linger_seconds)
                if svc.loop_recorder._timer is not first:
                    break
            assert svc.loop_recorder._timer not in (None, first)
            assert svc.windows.total == 0  # recording waits for the lock
        finally:
            lock.release()
        for _ in range(100):
            await asyncio.sleep(svc.judge_queue.linger_seconds)
            if svc.windows.total:
                break
        assert svc.windows.total == 3
        return answer

    answer = asyncio.run(scenario())
    assert (svc.verdicts.calls, svc.verdicts.in_thread) == (1, 0)
    (out,) = [o for o in json.loads(answer[0])["outputs"] if o["name"] == "icos_verdict"]
    assert list(out["data"]) == [VERDICT_NAMES[v] for v in reference_verdicts(rt, x)]


def test_the_loop_leaves_a_large_backlog_to_the_background_thread(mnist_bundle_dir: Path, mnist_splits: Splits) -> None:
    """When the loop's judging call comes due and more than ``max_samples`` predictions wait (work of
    large requests queued meanwhile), the loop wakes the background thread instead of judging them."""
    import asyncio

    svc = service(mnist_bundle_dir)
    rt = svc.runtimes.current
    assert rt.classifier is not None

    def work(x: np.ndarray, rid: str) -> JudgeWork:
        xb = rt.classifier.prepare(x)
        pred = rt.classifier.predict_prepared(xb)
        return JudgeWork(rt, rt.classifier.features(xb), pred.probabilities, pred.predicted, None, 0.001, rid)

    judging_threads: list[str] = []
    add_sink(svc, lambda _b: judging_threads.append(threading.current_thread().name))
    small, large = work(mnist_splits.test.x[:2], "small"), work(mnist_splits.test.x[2:202], "large")

    async def scenario() -> None:
        svc.loop_recorder.add(small)  # schedules the loop's call
        svc.judge_queue.hold(large)  # 200 more predictions arrive before it comes due
        for _ in range(100):  # until the loop's call came due
            await asyncio.sleep(svc.judge_queue.linger_seconds)
            if svc.loop_recorder._timer is None:
                break

    svc.judge_queue.start()
    # a thread still starting would take the pending work itself (it checks before it first waits)
    assert wait_until(lambda: svc.judge_queue.idle, timeout=10)
    try:
        asyncio.run(scenario())
        assert wait_until(lambda: svc.windows.total == 202, timeout=20)
    finally:
        svc.judge_queue.stop()
    assert (svc.loop_recorder.calls, svc.loop_recorder.handed_over) == (0, 1)
    assert judging_threads == ["icos-judge", "icos-judge"]
