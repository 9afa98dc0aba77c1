"""Companions, what runs beside the serving path and the fleet's refresh: the lingering thread they share with
the judge queue, the label intake's view of what they hold, the no-op defaults, the window statistics they
build as the recorder does, and the fleet evaluator's list of them (sections and collectors read from each
one's part of the last refresh)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.fleet.evaluator import FleetEvaluator, FleetResult
from agent.fleet.prometheus_api import PrometheusAPI
from agent.judging.companions import CompanionBase, PendingBeside
from agent.judging.linger import LingerLoop
from agent.judging.recorder import judged_stats
from tests.unit.test_fleet_schema import CAL, _settings


class _Queue:
    """A LingerLoop's owner: submissions under its condition, each turn of the thread taking them all."""

    def __init__(self, linger: float, enough: int = 1_000) -> None:
        self.cond = threading.Condition()
        self.items: list[int] = []
        self.turns: list[list[int]] = []
        self.loop = LingerLoop(
            self.cond,
            "test-linger",
            linger,
            pending=lambda: bool(self.items),
            enough=lambda: len(self.items) >= enough,
            work=self.work,
        )

    def submit(self, item: int) -> None:
        with self.cond:
            self.items.append(item)
            if self.loop.idle:
                self.loop.notify()

    def work(self) -> None:
        with self.cond:
            took, self.items = self.items, []
        self.turns.append(took)


def _wait(done: Callable[[], bool], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if done():
            return True
        time.sleep(0.005)
    return done()


def test_the_loop_lingers_to_take_what_arrives_meanwhile_in_one_turn() -> None:
    q = _Queue(linger=0.5)
    q.loop.start()
    try:
        assert _wait(lambda: q.loop.idle)
        for k in range(5):
            q.submit(k)
        assert _wait(lambda: bool(q.turns))
        assert q.turns == [[0, 1, 2, 3, 4]]
    finally:
        q.loop.stop(timeout=10)
    assert not q.loop.running and q.loop.stopping


def test_enough_work_ends_the_lingering_and_a_stop_finishes_what_is_queued() -> None:
    q = _Queue(linger=60.0, enough=3)
    q.loop.start()
    try:
        assert _wait(lambda: q.loop.idle)
        for k in range(3):
            q.submit(k)
        with q.cond:  # enough waits: the lingering thread is woken as a submitter would wake it
            q.loop.notify()
        assert _wait(lambda: q.turns == [[0, 1, 2]], timeout=30)
        q.submit(3)  # lingers for a minute unless stopped
    finally:
        t0 = time.monotonic()
        q.loop.stop(timeout=30)
    assert time.monotonic() - t0 < 20 and q.turns[-1] == [3] and not q.items


def test_a_started_loop_starts_again_after_a_stop() -> None:
    q = _Queue(linger=0.0)
    q.loop.start()
    q.loop.stop(timeout=10)
    q.loop.start()
    try:
        assert q.loop.running and not q.loop.stopping
        q.submit(7)
        assert _wait(lambda: q.turns == [[7]])
    finally:
        q.loop.stop(timeout=10)


class _Held(CompanionBase):
    def __init__(self, ids: list[str]) -> None:
        self.ids = ids

    def holds(self, request_id: str) -> bool:
        return request_id in self.ids

    def held_ids(self) -> list[str]:
        return list(self.ids)


class _JudgeQueue:
    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.woken: list[bool] = []

    def holds(self, request_id: str) -> bool:
        return request_id in self.ids

    def held_ids(self) -> list[str]:
        return list(self.ids)

    def wake(self, hurry: bool = False) -> None:
        self.woken.append(hurry)


def test_a_label_waits_for_the_judge_queue_and_every_companion() -> None:
    queue = _JudgeQueue(["a", "b"])
    pending = PendingBeside(queue, [_Held(["b", "c"]), _Held(["d"])])  # type: ignore[arg-type]
    assert all(pending.holds(i) for i in "abcd") and not pending.holds("e")
    assert pending.held_ids() == ["a", "b", "c", "d"]
    pending.wake(hurry=True)
    assert queue.woken == [True]
    alone = PendingBeside(queue, [])  # type: ignore[arg-type]
    assert alone.held_ids() == ["a", "b"] and not alone.holds("c")


def test_a_companion_without_a_method_of_its_own_takes_nothing_and_reports_nothing() -> None:
    base = CompanionBase()
    batches: list[Any] = [object(), object()]
    assert base.take_judged(batches) is batches
    assert not base.holds("r") and base.held_ids() == []
    assert base.sections(None, 0.0) == {} and list(base.collectors(lambda: None)) == []  # type: ignore[arg-type,return-value]


def test_the_class_sums_are_left_out_only_when_asked() -> None:
    rt: Any = type("RT", (), {"calibration": CAL})()
    rng = np.random.default_rng(0)
    probabilities = rng.dirichlet(np.ones(3), 50)
    predicted = probabilities.argmax(axis=1)
    verdicts = np.zeros(50, dtype=np.int8)
    full, conf, correct = judged_stats(rt, probabilities, predicted, verdicts, None)
    plain, _, _ = judged_stats(rt, probabilities, predicted, verdicts, None, per_class=False)
    assert full.n == plain.n == 50 and len(conf) == len(correct) == 50
    np.testing.assert_allclose(conf, probabilities.max(axis=1))
    assert full.cbpe_n == 50 and full.cbpe_predicted == np.bincount(predicted, minlength=3).tolist()
    assert plain.cbpe_n == 0 and not plain.cbpe_predicted
    assert full.conf_sum == plain.conf_sum and full.cells == plain.cells  # the rest is the same


@dataclass
class _Part:
    queries: int
    value: float


class _FleetTally:
    """A fleet companion whose sections and collector show the part they were given."""

    async def evaluate(self, api: PrometheusAPI, at: float, windows: Mapping[str, float], lookback_s: float) -> _Part:
        return _Part(2, at)

    def sections(self, part: _Part | None, version: str) -> Mapping[str, Any]:
        return {"tally": {"version": version, "value": part.value if part is not None else None}}

    def collectors(self, part: Callable[[], _Part | None]) -> Sequence[Collector]:
        class _Gauge(Collector):
            def collect(self) -> Any:
                p = part()
                yield GaugeMetricFamily("test_tally", "the part", value=p.value if p is not None else -1.0)

        return [_Gauge()]


def test_the_fleet_reads_each_companion_from_its_part_of_the_last_refresh() -> None:
    url = "http://127.0.0.1:1"
    ev = FleetEvaluator(_settings(url), CAL, "b", PrometheusAPI(url, 5), companions=[_FleetTally()])
    registry = CollectorRegistry()
    for collector in ev.companion_collectors():
        registry.register(collector)
    assert ev.estimates("v1")["tally"] == {"version": "v1", "value": None}
    assert registry.get_sample_value("test_tally") == -1.0
    ev.result = FleetResult(at=5.0, parts=[_Part(2, 42.0)])
    assert ev.estimates("v1")["tally"] == {"version": "v1", "value": 42.0}
    assert registry.get_sample_value("test_tally") == 42.0
    plain = FleetEvaluator(_settings(url), CAL, "b", PrometheusAPI(url, 5))
    assert "tally" not in plain.estimates("v1") and plain.companion_collectors() == []
