"""One progress bar over a whole ``icos-agent fit``, with an estimate of the time left.

The bar counts the fit's stages (:data:`agent.offline.fit.STAGES`), one unit each. The stages that pass
rows through a model (reading the training and validation sets, judging the corrupted copies of the
calibration split) say how many rows they will pass (:meth:`FitMeter.expect`) and
:func:`agent.offline.viewing.predict_and_view` reports each batch (:func:`rows_done`), so the bar also moves
inside them, where most of a slow model's fit goes; tqdm's estimate of the time left is the elapsed time
scaled by what is left of the bar.

The meter of the fit running in this context is found through a context variable, so that the offline
passes report to it without taking it as an argument; outside a fit they report to nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

_CURRENT: ContextVar[FitMeter | None] = ContextVar("icos_fit_meter", default=None)


class FitMeter:
    """The bar of one fit: ``stages`` units, each stage's share moved by the rows it passes."""

    def __init__(self, stages: Sequence[str], *, disable: bool = False) -> None:
        from tqdm import tqdm

        self.bar: Any = tqdm(
            total=len(stages),
            desc="fit",
            unit="stage",
            leave=False,
            mininterval=0.5,
            delay=1.0,
            disable=disable,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} elapsed, ~{remaining} left",
        )
        self.stage = ""
        #: units of the bar done (also when it is not shown)
        self.done = 0.0
        self._expected = 0
        self._rows = 0
        self._moved = 0.0  # of the current stage's unit

    def begin(self, stage: str) -> None:
        """A stage starts: it moves the bar only by the rows it announces (:meth:`expect`)."""
        self.stage = stage
        self._expected = self._rows = 0
        self._moved = 0.0
        self.bar.set_description_str(f"fit: {stage}", refresh=False)

    def expect(self, rows: int) -> None:
        """The current stage will pass about ``rows`` more rows through the model."""
        self._expected += max(0, int(rows))

    def rows(self, n: int) -> None:
        """``n`` rows went through the model: the stage's unit moves by their share (never past it)."""
        if self._expected <= 0:
            return
        self._rows += n
        share = min(1.0, self._rows / self._expected) * 0.99
        if share > self._moved:
            self._move(share - self._moved)
            self._moved = share

    def end(self) -> None:
        """The stage is done: the rest of its unit."""
        self._move(1.0 - self._moved)
        self._moved = 1.0

    def _move(self, units: float) -> None:
        units = max(0.0, min(units, float(self.bar.total) - self.done))  # sums of shares never pass the total
        self.done += units
        self.bar.update(units)

    def close(self) -> None:
        self.bar.close()


@contextlib.contextmanager
def fit_meter(stages: Sequence[str], *, disable: bool = False) -> Iterator[FitMeter]:
    """The bar of a fit over ``stages``, current in this context while the fit runs."""
    meter = FitMeter(stages, disable=disable)
    token = _CURRENT.set(meter)
    try:
        yield meter
    finally:
        _CURRENT.reset(token)
        meter.close()


def current() -> FitMeter | None:
    """The meter of the fit running in this context (None outside a fit)."""
    return _CURRENT.get()


def rows_done(n: int) -> None:
    """``n`` rows went through a model: moves the running fit's bar (nothing outside a fit)."""
    meter = _CURRENT.get()
    if meter is not None:
        meter.rows(n)


def expect_rows(rows: int) -> None:
    """The running fit's current stage will pass about ``rows`` rows through a model."""
    meter = _CURRENT.get()
    if meter is not None:
        meter.expect(rows)
