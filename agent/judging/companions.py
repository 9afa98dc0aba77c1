"""Companions: what runs beside the serving path of one agent, off the request path (a challenger compared
with the champion, :mod:`agent.dataplane.challenger`).

A companion is to the composition (:class:`agent.server.composition.Agent`) what a collector is to
prometheus_client's registry: the composition keeps a ``list[Companion]``, calls every one at the same points
(start, stop, each recording's judged requests, each label outcome, each report, each scrape) and never asks
which kind it holds. Adding a kind of companion is one class and one line where the composition builds its
list; :class:`CompanionBase` gives the no-op of every method a companion does not need.

:class:`PendingBeside` is the label intake's view of the predictions on their way to the store: those in the
judge queue and those a companion still holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client.registry import Collector

from agent.judging.queue import JudgeQueue
from agent.judging.recorder import JudgedBatch
from agent.judging.runtime import Runtime


class Companion(Protocol):
    """What runs beside the serving path (see the module docstring)."""

    def start(self) -> None:
        """Start its own work (its thread), before the judge queue starts."""

    def stop(self) -> None:
        """Finish or hand on what it holds, after the judge queue stopped and before the store stops."""

    def take_judged(self, batches: Sequence[JudgedBatch]) -> Sequence[JudgedBatch]:
        """The judged requests of one recording call (called while recording: only enqueue); returns those it
        leaves to the labeling sample. A request it keeps is its own to hand on to the sample."""

    def holds(self, request_id: str) -> bool:
        """Whether it holds a request on its way to the store (a label naming it waits for it)."""

    def held_ids(self) -> list[str]:
        """The ids of every request it holds on its way to the store."""

    def on_labels(self, labels: list[tuple[str, int]], outcome: Any) -> None:
        """Labels the store applied (``outcome``: :class:`agent.labels.rows.LabelOutcome`)."""

    def sections(self, champion: Runtime, now: float) -> Mapping[str, Any]:
        """Its top-level sections of ``GET /v1/estimates`` (by name), the champion being ``champion``."""

    def collectors(self, champion: Callable[[], Runtime]) -> Sequence[Collector]:
        """Its collectors, read at scrape time (``champion``: the runtime serving then)."""


class CompanionBase:
    """A companion's no-op defaults: it takes no request, holds none, ignores labels, reports nothing."""

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def take_judged(self, batches: Sequence[JudgedBatch]) -> Sequence[JudgedBatch]:
        return batches

    def holds(self, request_id: str) -> bool:
        return False

    def held_ids(self) -> list[str]:
        return []

    def on_labels(self, labels: list[tuple[str, int]], outcome: Any) -> None:
        return None

    def sections(self, champion: Runtime, now: float) -> Mapping[str, Any]:
        return {}

    def collectors(self, champion: Callable[[], Runtime]) -> Sequence[Collector]:
        return ()


class PendingBeside:
    """Where judged predictions wait before the store: the judge queue, and the requests the companions hold
    (a label that names one waits for it as for the judge queue,
    :class:`~agent.labels.intake.PendingJudgement`)."""

    def __init__(self, queue: JudgeQueue, companions: Sequence[Companion]) -> None:
        self.queue = queue
        self.companions = tuple(companions)

    def holds(self, request_id: str) -> bool:
        return self.queue.holds(request_id) or any(c.holds(request_id) for c in self.companions)

    def held_ids(self) -> list[str]:
        return list(dict.fromkeys([*self.queue.held_ids(), *(i for c in self.companions for i in c.held_ids())]))

    def wake(self, hurry: bool = False) -> None:
        self.queue.wake(hurry)  # only the judge queue is hurried: a companion releases its holds on its own
