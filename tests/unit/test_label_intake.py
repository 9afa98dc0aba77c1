"""The label intake with real parts: the shipped CNN's runtime, a judge queue, a SQLite prediction store.

A label finds a prediction that is still on its way to the store (queued in the judge queue, or in the
store's write queue) by waiting for it, without draining the judge queue itself; a label for a
prediction nobody holds is answered ``unknown`` at once."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent.config.settings import AgentSettings, load_settings
from agent.data.datasets import Splits
from agent.errors import ClientError
from agent.judging.queue import JudgeQueue
from agent.judging.recorder import Recorder
from agent.judging.runtime import Runtime, load_runtime
from agent.judging.verdicts import JudgeWork
from agent.judging.windows import WindowSet
from agent.labels.intake import LabelIntake
from agent.labels.rows import LabelOutcome
from agent.labels.sample import LabelingSample, open_prediction_store
from agent.labels.store import PredictionStore
from agent.labels.uniform_draws import UniformDraws
from agent.model.classifier import default_model_path
from exporters.label_metrics import LabelMetrics
from exporters.prometheus import AgentMetrics


class Holder:
    def __init__(self, rt: Runtime) -> None:
        self.current = rt


async def run_inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


@pytest.fixture()
def parts(
    tmp_path: Path, mnist_bundle_dir: Path
) -> Iterator[tuple[AgentSettings, Runtime, JudgeQueue, PredictionStore]]:
    settings = load_settings(
        None,
        mode="serve",
        model={"name": "mnist", "path": str(default_model_path())},
        bundle={"path": str(mnist_bundle_dir)},
        labels={"flush_interval_seconds": 60, "commit_timeout_seconds": 10, "sample_rate": 0},
        state_dir=str(tmp_path),
    )
    rt = load_runtime(settings)
    metrics = LabelMetrics(CollectorRegistry())
    store = open_prediction_store(settings.labels, tmp_path, metrics)
    store.open()
    store.start()
    sample = LabelingSample(store, UniformDraws(0.0), metrics)
    windows = WindowSet(settings.window_seconds, None)
    # lingers a minute: nothing is recorded unless somebody asks for it
    queue = JudgeQueue(Recorder(windows, AgentMetrics(CollectorRegistry()), [sample.on_judged]), linger_seconds=60)
    queue.start()
    try:
        yield settings, rt, queue, store
    finally:
        queue.stop()
        store.stop()


def work(rt: Runtime, x: Any, request_id: str) -> JudgeWork:
    assert rt.classifier is not None
    xb = rt.classifier.prepare(x)
    pred = rt.classifier.predict_prepared(xb)
    return JudgeWork(rt, rt.classifier.features(xb), pred.probabilities, pred.predicted, None, None, request_id)


def intake(
    settings: AgentSettings, rt: Runtime, queue: JudgeQueue, store: PredictionStore
) -> tuple[LabelIntake, list[int]]:
    accepted: list[int] = []
    metrics = LabelMetrics(CollectorRegistry())

    def on_accepted(outcome: LabelOutcome) -> None:
        accepted.append(outcome.n_accepted)

    return LabelIntake(settings.labels, store, Holder(rt), queue, metrics, run_inline, on_accepted), accepted


def body(labels: list[tuple[str, int]]) -> bytes:
    return json.dumps({"labels": [{"id": i, "label": y} for i, y in labels]}).encode()


def test_a_label_waits_for_its_prediction_in_the_judge_queue(
    parts: tuple[AgentSettings, Runtime, JudgeQueue, PredictionStore], mnist_splits: Splits
) -> None:
    settings, rt, queue, store = parts
    x, y = mnist_splits.test.x[:4], mnist_splits.test.y[:4]
    queue.submit(work(rt, x, "req-1"))
    assert queue.holds("req-1") and not store.holds("req-1")
    li, accepted = intake(settings, rt, queue, store)
    t0 = time.monotonic()
    result = asyncio.run(li.accept(body([(f"req-1:{i}", int(y[i])) for i in range(4)]), "test"))
    assert result["accepted"] == 4 and result["unknown"] == 0, result
    assert accepted == [4]
    assert not queue.holds("req-1") and not store.holds("req-1")
    # the wait ended when the prediction was written, long before the queue's linger or the writer's interval
    assert time.monotonic() - t0 < 30


def test_a_label_for_a_prediction_nobody_holds_is_unknown_at_once(
    parts: tuple[AgentSettings, Runtime, JudgeQueue, PredictionStore],
) -> None:
    settings, rt, queue, store = parts
    li, accepted = intake(settings, rt, queue, store)
    result = asyncio.run(li.accept(body([("never-seen:0", 1)]), "test"))
    assert result["unknown"] == 1 and result["accepted"] == 0
    assert result["problems"] == [{"id": "never-seen:0", "error": "unknown: no stored prediction has this id"}]
    assert accepted == []


def test_labels_of_stored_and_pending_predictions_in_one_body(
    parts: tuple[AgentSettings, Runtime, JudgeQueue, PredictionStore], mnist_splits: Splits
) -> None:
    settings, rt, queue, store = parts
    x, y = mnist_splits.test.x[:6], mnist_splits.test.y[:6]
    queue.record_now([work(rt, x[:3], "stored")])
    store.flush()
    queue.hold(work(rt, x[3:], "pending"))  # queued, the background thread not even woken
    li, _ = intake(settings, rt, queue, store)
    labels = [(f"stored:{i}", int(y[i])) for i in range(3)] + [(f"pending:{i}", int(y[3 + i])) for i in range(3)]
    result = asyncio.run(li.accept(body([*labels, ("pending:9", 0)]), "test"))
    assert (result["accepted"], result["unknown"], result["duplicate"]) == (6, 1, 0), result
    again = asyncio.run(li.accept(body(labels[:2]), "test"))
    assert (again["accepted"], again["duplicate"]) == (0, 2)


def test_a_body_that_is_not_a_label_list_is_a_client_error(
    parts: tuple[AgentSettings, Runtime, JudgeQueue, PredictionStore],
) -> None:
    settings, rt, queue, store = parts
    li, _ = intake(settings, rt, queue, store)
    for bad, status in ((b"{", 400), (b'{"labels": 3}', 400), (body([("a:0", 1)] * 20_000), 413)):
        with pytest.raises(ClientError) as info:
            asyncio.run(li.accept(bad, "test"))
        assert info.value.status == status


def test_the_labeling_sample_lists_predictions_answered_a_moment_ago(
    tmp_path: Path, mnist_bundle_dir: Path, mnist_splits: Splits
) -> None:
    settings = load_settings(
        None,
        mode="serve",
        model={"name": "mnist", "path": str(default_model_path())},
        bundle={"path": str(mnist_bundle_dir)},
        labels={"flush_interval_seconds": 60, "sample_rate": 1.0},
        state_dir=str(tmp_path),
    )
    rt = load_runtime(settings)
    metrics = LabelMetrics(CollectorRegistry())
    store = open_prediction_store(settings.labels, tmp_path, metrics)
    store.open()
    store.start()
    sample = LabelingSample(store, UniformDraws(1.0), metrics)
    queue = JudgeQueue(
        Recorder(WindowSet(settings.window_seconds, None), AgentMetrics(CollectorRegistry()), [sample.on_judged]),
        linger_seconds=60,
    )
    queue.start()
    try:
        queue.submit(work(rt, mnist_splits.test.x[:5], "fresh"))
        li, _ = intake(settings, rt, queue, store)
        listed = asyncio.run(li.requests(100))
        assert sorted(r["id"] for r in listed["requests"]) == [f"fresh:{i}" for i in range(5)]
    finally:
        queue.stop()
        store.stop()


def test_a_label_finds_a_prediction_written_between_its_lookup_and_the_look_at_what_is_on_its_way(
    parts: tuple[AgentSettings, Runtime, JudgeQueue, PredictionStore], mnist_splits: Splits
) -> None:
    """The store's writer may write a prediction just after a label's lookup missed it: by the time the intake
    asks what is still on its way, that prediction is in the store, no longer on its way, and must still be found."""
    settings, rt, queue, store = parts
    x, y = mnist_splits.test.x[:4], mnist_splits.test.y[:4]
    queue.record_now([work(rt, x, "just-written")])
    assert store.holds("just-written")  # in the store's write queue (its writer waits a minute)

    li, accepted = intake(settings, rt, queue, store)

    async def run_then_write(fn: Any, *args: Any) -> Any:
        result = fn(*args)
        if fn == li._apply:
            store.flush()  # the writer's turn comes right after the lookup
        return result

    li.run = run_then_write
    result = asyncio.run(li.accept(body([(f"just-written:{i}", int(y[i])) for i in range(4)]), "test"))
    assert (result["accepted"], result["unknown"]) == (4, 0), result
    assert accepted == [4]
