"""Periodic jobs of the agent on APScheduler (the only module that imports ``apscheduler``).

A :class:`JobScheduler` wraps a ``BackgroundScheduler``: each job runs in the scheduler's own
thread pool, off the request path. Every job is added with ``max_instances=1`` (a run that is
still going makes the next trigger skip instead of piling up) and ``coalesce=True`` (triggers
missed while the process was busy or asleep fire once, not once per miss).

A trigger is either a cron expression (five fields, ``crontab(5)`` syntax, evaluated in UTC) or a
fixed interval in seconds — exactly one of the two (:func:`check_trigger`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("icos_agent.scheduler")

__all__ = ["JobScheduler", "check_trigger", "validate_cron"]


def validate_cron(expression: str) -> str:
    """Return the expression if APScheduler accepts it as a 5-field crontab, else raise ``ValueError``."""
    from apscheduler.triggers.cron import CronTrigger

    text = " ".join(str(expression).split())
    if len(text.split(" ")) != 5:
        raise ValueError(f"cron {expression!r} must have 5 fields: minute hour day-of-month month day-of-week")
    try:
        CronTrigger.from_crontab(text, timezone=UTC)
    except ValueError as exc:
        raise ValueError(f"cron {expression!r} is not valid: {exc}") from None
    return text


def check_trigger(cron: str | None, interval_seconds: float | None) -> None:
    """Exactly one of ``cron`` and ``interval_seconds``; the interval must be positive."""
    if (cron is None) == (interval_seconds is None):
        raise ValueError("set exactly one of cron and interval")
    if interval_seconds is not None and not interval_seconds > 0:
        raise ValueError(f"interval must be positive, got {interval_seconds} s")
    if cron is not None:
        validate_cron(cron)


class JobScheduler:
    """Named periodic jobs in a background thread pool; one running instance per job."""

    def __init__(self, max_workers: int = 2) -> None:
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler

        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=max_workers)},
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None},
            timezone=UTC,
        )
        self._lock = threading.Lock()

    def add(
        self,
        job_id: str,
        func: Callable[[], Any],
        *,
        cron: str | None = None,
        interval_seconds: float | None = None,
        first_run_in: float | None = None,
    ) -> None:
        """Schedule ``func`` under ``job_id`` (cron XOR interval, see :func:`check_trigger`).

        ``first_run_in`` (interval jobs) delays the first run by that many seconds instead of one
        full interval.
        """
        from apscheduler.triggers.cron import CronTrigger
        from apscheduler.triggers.interval import IntervalTrigger

        check_trigger(cron, interval_seconds)
        trigger: Any
        kwargs: dict[str, Any] = {}
        if cron is not None:
            trigger = CronTrigger.from_crontab(" ".join(cron.split()), timezone=UTC)
        else:
            assert interval_seconds is not None
            trigger = IntervalTrigger(seconds=interval_seconds, timezone=UTC)
            if first_run_in is not None:
                from datetime import timedelta

                kwargs["next_run_time"] = datetime.now(UTC) + timedelta(seconds=max(0.0, first_run_in))
        with self._lock:
            self._scheduler.add_job(
                func,
                trigger,
                id=job_id,
                name=job_id,
                replace_existing=True,
                max_instances=1,
                coalesce=True,
                **kwargs,
            )

    def submit(self, job_id: str, func: Callable[[], Any]) -> None:
        """Run ``func`` once, now, in the scheduler's thread pool (a one-off ``date`` job)."""
        with self._lock:
            self._scheduler.add_job(func, "date", id=job_id, name=job_id, replace_existing=True, max_instances=1)

    def next_run(self, job_id: str) -> datetime | None:
        job = self._scheduler.get_job(job_id)
        return None if job is None else job.next_run_time

    def job_ids(self) -> list[str]:
        return [j.id for j in self._scheduler.get_jobs()]

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    def start(self) -> None:
        if not self._scheduler.running:
            self._scheduler.start()

    def shutdown(self, wait: bool = True) -> None:
        """Stop triggering; with ``wait`` the runs in progress finish first."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=wait)
