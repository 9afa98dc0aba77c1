"""When active sampling spends its label budget sooner: decided on a timer of its own, so that labeling
never depends on anyone scraping ``/metrics``.

Every :attr:`BudgetBoost.interval` seconds the agent looks at its windows' trust signal
(:func:`~agent.estimation.estimators.registry.window_trust`, the ``shift_aware`` computation alone); while a
window lies outside the calibrated range (trust distance above
:data:`~agent.estimation.estimators.trust.FULL_TRUST`), the labeling sample is boosted
(:meth:`~agent.labels.sample.LabelingSample.boost`) for a tenth of ``labels.budget_window``: labels
are drawn where the label-free estimate is least to be believed. The timer looks twice per boost (at
most every :data:`MAX_INTERVAL`, at least every :data:`MIN_INTERVAL` seconds), so a boost stays on
without a gap while a window stays outside the range.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from agent.core import logs
from agent.estimation.estimators.registry import window_trust
from agent.estimation.estimators.trust import FULL_TRUST
from agent.judging.runtime import Runtime
from agent.judging.windows import WindowSet
from agent.labels.sample import LabelingSample

log = logs.get("labels")

#: Bounds of the time between two looks at the windows (seconds).
MIN_INTERVAL = 1.0
MAX_INTERVAL = 60.0


class BudgetBoost:
    """Boosts ``sample`` while one of ``windows`` lies outside the calibrated range of ``runtime()``'s
    bundle (see the module docstring)."""

    def __init__(
        self,
        sample: LabelingSample,
        windows: WindowSet,
        runtime: Callable[[], Runtime],
        budget_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sample = sample
        self.windows = windows
        self.runtime = runtime
        self.clock = clock
        #: how long one boost lasts: a tenth of the budget window
        self.seconds = budget_seconds / 10.0
        self.interval = min(max(self.seconds / 2.0, MIN_INTERVAL), MAX_INTERVAL)

    @property
    def active(self) -> bool:
        """Whether boosting can change anything: a budgeted draw policy (a uniform rate knows no boost)."""
        return self.sample.draw_policy.boostable

    def check(self) -> bool:
        """Look at the windows now; boost when one is outside the calibrated range. True when boosted."""
        rt = self.runtime()
        outside = False
        for stats in self.windows.stats(rt.calibration, self.clock()).values():
            trust = window_trust(stats, rt.calibration)
            if trust is not None and trust.distance > FULL_TRUST:
                outside = True
                break
        if outside:
            self.sample.boost(self.seconds)
        return outside

    async def loop(self, run_in_thread: Callable[..., Any]) -> None:
        """:meth:`check` every :attr:`interval` seconds (in a worker thread) until cancelled; a failed
        look is logged and the next one comes as usual."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await run_in_thread(self.check)
            except Exception:
                log.exception("deciding the label budget's boost failed")
