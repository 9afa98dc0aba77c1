"""The one test every registered draw policy of the labeling sample passes (:mod:`agent.labels.draw_policies`):
adding a labeling design is one module, its entry in the registry, and passing these."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from agent.config.sampling import SAMPLINGS
from agent.config.settings import LabelsConfig
from agent.judging.recorder import JudgedBatch
from agent.labels.draw_policies import DRAW_POLICIES, draw_policy_of
from agent.labels.rows import PendingBatch
from agent.labels.sample import LabelingSample
from agent.labels.store import PredictionStore
from exporters.label_metrics import LabelMetrics

PER_WINDOW, WINDOW, EVERY, SIZE = 200, 3600.0, 10.0, 200  # a batch of 200 every 10 s over a window of an hour


def settings(name: str, per_window: int = PER_WINDOW) -> LabelsConfig:
    """``labels`` settings of the design ``name``; uniform draws at the rate that meets the same budget."""
    rate = per_window / (SIZE * WINDOW / EVERY)
    return LabelsConfig(sampling=name, per_window=per_window, budget_window="1h", sample_rate=rate)


def batches(seed: int, count: int) -> list[JudgedBatch]:
    """Judged batches whose predicted correctness is known (no model needed), of a bundle without segments."""
    rng = np.random.default_rng(seed)
    rt = cast(Any, SimpleNamespace(calibration=SimpleNamespace(segments=None), identity="bundle"))
    out = []
    for k in range(count):
        p = rng.dirichlet(np.ones(3), SIZE)
        f = rng.beta(8, 2, SIZE)
        out.append(JudgedBatch(rt, f"r{seed}-{k}", 0.0, p, p.argmax(1), np.ones(SIZE, bool), predicted_correct=f))
    return out


@dataclass
class Store:
    """What the sample needs of a prediction store: the queue it hands every request to."""

    queued: list[PendingBatch] = field(default_factory=list)
    kept: Any = field(default_factory=lambda: SimpleNamespace(enabled=False))

    def enqueue_many(self, batches: list[PendingBatch]) -> list[bool]:
        self.queued.extend(batches)
        return [True] * len(batches)


def sample(name: str, seed: int) -> tuple[LabelingSample, Store]:
    """A sample of design ``name`` drawing about a third of the traffic, a batch every :data:`EVERY` seconds."""
    store, ticks = Store(), iter(np.arange(1, 10_000) * EVERY)
    policy = draw_policy_of(settings(name, per_window=24_000), start=0.0)
    drawing = LabelingSample(
        cast(PredictionStore, store),
        policy,
        LabelMetrics(CollectorRegistry()),
        rng=np.random.default_rng(seed),
        clock=lambda: float(next(ticks)),
    )
    return drawing, store


def test_the_registry_is_the_settings_choice() -> None:
    assert sorted(DRAW_POLICIES) == sorted(SAMPLINGS)
    for name, cls in DRAW_POLICIES.items():
        assert cls.name == name
        assert type(draw_policy_of(settings(name))) is cls


@pytest.mark.parametrize("name", sorted(DRAW_POLICIES))
def test_probabilities_are_probabilities_and_the_expected_draws_meet_the_budget(name: str) -> None:
    """Two windows of steady traffic: every probability in [0, 1], and over the second window the expected number
    drawn is the budget (``labels.per_window``; for uniform draws, the rate times the traffic)."""
    policy = draw_policy_of(settings(name), start=0.0)
    expected = []
    for k, batch in enumerate(batches(1, int(2 * WINDOW / EVERY))):
        pi = policy.probabilities([batch], (k + 1) * EVERY).pi
        assert pi.shape == (SIZE,) and float(pi.min()) >= 0.0 and float(pi.max()) <= 1.0
        expected.append(float(pi.sum()))
    assert sum(expected[len(expected) // 2 :]) == pytest.approx(PER_WINDOW, rel=0.1)


@pytest.mark.parametrize("name", sorted(DRAW_POLICIES))
def test_every_draw_keeps_a_probability_in_the_unit_interval_under_a_preference(name: str) -> None:
    """A challenger's preference raises any policy's probabilities; every drawn prediction keeps its own, in
    (0, 1], at least the preference."""
    drawing, _ = sample(name, 3)
    prefer = np.where(np.arange(SIZE) % 4 == 0, 0.9, 0.0)
    for batch in batches(2, 20):
        drawn, pi = drawing.on_judged(batch, prefer)
        assert pi is not None and len(pi) == len(drawn)
        assert float(pi.min(initial=1.0)) > 0.0 and float(pi.max(initial=0.0)) <= 1.0
        assert np.all(pi >= prefer[drawn])
        assert np.count_nonzero(drawn % 4 == 0) > 0.7 * SIZE / 4  # the preferred are drawn


@pytest.mark.parametrize("name", sorted(DRAW_POLICIES))
def test_draws_are_reproducible_with_a_seed(name: str) -> None:
    def drawn(seed: int) -> list[tuple[str, list[int], list[float] | None]]:
        drawing, store = sample(name, seed)
        group = batches(4, 30)
        drawing.on_judged_group(group[:10])
        for batch in group[10:]:
            drawing.on_judged(batch)
        return [
            (
                q.request_id,
                [] if q.sampled is None else q.sampled.tolist(),
                None if q.sampled_p is None else q.sampled_p.tolist(),
            )
            for q in store.queued
        ]

    first = drawn(7)
    assert len(first) == 30 and any(d for _, d, _ in first)
    assert drawn(7) == first
    assert drawn(8) != first


@pytest.mark.parametrize("name", sorted(DRAW_POLICIES))
def test_labels_of_draws_teach_only_the_policies_that_learn(name: str) -> None:
    """Labels of drawn predictions reach the policy; one that learns nothing from them says so (0), one that does
    learns from every label of a prediction it drew."""
    drawing, store = sample(name, 5)
    drawing.on_judged_group(batches(6, 5))
    labels = [
        (f"{q.request_id}:{i}", int(q.predicted[i])) for q in store.queued if q.sampled is not None for i in q.sampled
    ]
    assert labels
    learnt = drawing.draw_policy.learn(labels)
    assert learnt in (0, len(labels))
    assert (learnt > 0) == (drawing.draw_policy.worth_of() is not None)


@pytest.mark.parametrize("name", sorted(DRAW_POLICIES))
def test_a_boost_spends_a_budget_faster_and_leaves_a_rate_alone(name: str) -> None:
    """After a window of steady traffic, a boost of 2 doubles a budgeted policy's expected draws and leaves a
    policy without a budget as it was."""
    policy = draw_policy_of(settings(name), start=0.0)
    group = batches(9, int(WINDOW / EVERY) + 2)
    for k, batch in enumerate(group[:-2]):
        policy.probabilities([batch], (k + 1) * EVERY)
    end = len(group) * EVERY
    plain = float(policy.probabilities([group[-2]], end - EVERY).pi.sum())
    boosted = float(policy.probabilities([group[-1]], end, boost=2.0).pi.sum())
    assert boosted / plain == pytest.approx(2.0 if policy.boostable else 1.0, rel=0.15)
