"""A declared sequence of named, typed stages, run in order over one source, each timed and moving the one
progress bar of the run (:mod:`agent.offline.fit_progress`).

A sequence is built stage by stage with :meth:`Stages.then`, whose argument must take what the previous stage
gives: the type checker proves the chain fits when the sequence is declared, and :meth:`Stages.run` is the one
loop that runs any sequence.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from agent.offline.fit_progress import FitMeter

S = TypeVar("S")
In = TypeVar("In")
Out = TypeVar("Out")
Next = TypeVar("Next")
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Stage(Generic[S, In, Out]):
    """One stage: its name (what the timings and the bar say) and what it does with the source ``S`` and
    the previous stage's result ``In``."""

    name: str
    run: Callable[[S, In, Progress], Out]


@dataclass(frozen=True)
class Stages(Generic[S, Out]):
    """Stages run in order over a source ``S``, the last giving ``Out``."""

    steps: tuple[Stage[S, Any, Any], ...]

    @staticmethod
    def first(name: str, run: Callable[[S, None, Progress], Out]) -> Stages[S, Out]:
        """A sequence of one stage, which reads only the source."""
        return Stages((Stage(name, run),))

    def then(self, name: str, run: Callable[[S, Out, Progress], Next]) -> Stages[S, Next]:
        """This sequence and, last, a stage that takes what it gives."""
        return Stages((*self.steps, Stage(name, run)))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)

    def run(self, source: S, say: Progress, meter: FitMeter) -> tuple[Out, dict[str, float]]:
        """The last stage's result, and the seconds each stage took (rounded to the millisecond)."""
        state: Any = None
        seconds: dict[str, float] = {}
        for step in self.steps:
            started = time.perf_counter()
            meter.begin(step.name)
            state = step.run(source, state, say)
            meter.end()
            seconds[step.name] = round(time.perf_counter() - started, 3)
        return state, seconds
