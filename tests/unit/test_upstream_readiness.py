"""Proxy mode's cached upstream readiness: what each check records (the readiness gauge, the unready
time counted from one check to the next, one log line per change) and what a return to ready runs.
The checks' answers and the clock are scripted; the loop itself runs in the integration test
(tests/integration/test_proxy_readiness.py) against a real upstream."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from agent.dataplane.upstream_readiness import UpstreamReadiness
from exporters.upstream_metrics import UpstreamMetrics
from tests.support.metrics import Scrape


def _run(answers: list[str | None], times: list[float]) -> tuple[UpstreamReadiness, Scrape, int]:
    registry = CollectorRegistry()
    script, clock = iter(answers), iter(times)
    refreshed = 0

    async def check() -> str | None:
        return next(script)

    async def on_ready() -> None:
        nonlocal refreshed
        refreshed += 1

    readiness = UpstreamReadiness(check, 1.0, UpstreamMetrics(registry), on_ready, clock=lambda: next(clock))

    async def checks() -> None:
        for _ in answers:
            await readiness.check_now()

    asyncio.run(checks())
    return readiness, Scrape.of_registry(registry), refreshed


def test_unready_time_is_counted_from_check_to_check() -> None:
    # ready at 0, down at 10 (unready from 10), still down at 12 and 15, back at 16: 6 s unready
    answers = [None, "unreachable", "unreachable", "answered 503", None]
    readiness, scraped, refreshed = _run(answers, [0, 10, 12, 15, 16])
    assert readiness.ready and readiness.reason is None
    assert scraped.value("icos_upstream_unready_seconds_total") == pytest.approx(6.0)
    assert scraped.value("icos_upstream_ready") == 1
    assert refreshed == 2  # at the first check, and on the return


def test_not_ready_at_start_counts_from_the_first_check() -> None:
    readiness, scraped, refreshed = _run(["unreachable", "unreachable"], [5, 7.5])
    assert not readiness.ready and readiness.reason == "unreachable"
    assert scraped.value("icos_upstream_unready_seconds_total") == pytest.approx(2.5)
    assert scraped.value("icos_upstream_ready") == 0
    assert refreshed == 0


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_one_log_line_per_change() -> None:
    logger, handler = logging.getLogger("icos_agent.proxy"), _Records()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        _run([None, "a", "b", "c", None, None, "d"], [0, 1, 2, 3, 4, 5, 6])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    messages = [r.getMessage() for r in handler.records]
    assert [m.split(":")[0] for m in messages] == ["upstream not ready", "upstream ready again", "upstream not ready"]
    again = next(r for r in handler.records if r.getMessage() == "upstream ready again")
    assert again.unready_seconds == pytest.approx(3.0)  # type: ignore[attr-defined]
