"""The estimator windows across restarts: saved in the state directory every
``state.flush_interval_seconds`` and at shutdown, restored at start for the same model and bundle.

A read-only or full state directory never stops serving: the failure is counted
(``icos_state_writable``, ``icos_state_write_failures_total``), logged once per outage, and the next
flush retries (opening the store too, when it could not be opened at start).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.core import logs
from agent.judging.state import StateStore
from agent.judging.windows import WindowSet
from exporters.prometheus import AgentMetrics

log = logs.get("app")


class WindowState:
    """Saves and restores ``windows`` in the state directory (none when ``directory`` is ``None``)."""

    def __init__(
        self,
        directory: Path | None,
        windows: WindowSet,
        metrics: AgentMetrics,
        model_name: str,
        identity: Callable[[], str],
        new_windows: Callable[[], WindowSet],
    ) -> None:
        self.directory = directory
        self.windows = windows
        self.metrics = metrics
        self.key = f"windows:{model_name}"
        #: The identity (model and bundle) the windows belong to now.
        self.identity = identity
        #: A scratch window set to try a saved document on before the live windows take it.
        self.new_windows = new_windows
        self.store: StateStore | None = None
        self._ok = True

    def open(self) -> StateStore | None:
        """Open the state database and restore the windows (at start); ``None`` without a directory or
        when it cannot be opened (counted and logged, never raised)."""
        if self.directory is not None and self._open_store():
            self.restore()
        return self.store

    def save(self) -> None:
        if self.store is None:
            return
        self.store.put_json(self.key, {"identity": self.identity(), "windows": self.windows.to_dict()})

    def restore(self) -> None:
        if self.store is None:
            return
        saved = self.store.get_json(self.key, self._check_saved, "windows")
        if saved and saved.get("identity") == self.identity():
            self.windows.restore(saved["windows"])
            log.info("restored estimator windows", extra={"judged": self.windows.total})
        elif saved:
            log.info("saved windows belong to another model or bundle; starting empty")

    def _check_saved(self, saved: Any) -> None:
        """Raise when saved windows cannot be restored: tried on a scratch set, so the live windows are
        never half restored (the store quarantines what this refuses and the agent starts empty)."""
        if not isinstance(saved, dict) or not isinstance(saved.get("identity"), str):
            raise ValueError("not a saved windows document")
        if saved["identity"] == self.identity():
            self.new_windows().restore(saved["windows"])

    def _failed(self, what: str, exc: BaseException) -> None:
        self.metrics.state_write(False, time.time())
        if self._ok:
            log.error(
                f"{what}; serving goes on, retrying every flush interval",
                extra={"state_dir": str(self.directory), "error": f"{type(exc).__name__}: {exc}"},
            )
        self._ok = False

    def _open_store(self) -> bool:
        assert self.directory is not None
        try:
            self.store = StateStore(self.directory, lambda what: self.metrics.state_quarantined.labels(what).inc())
        except Exception as exc:
            self.store = None
            self._failed("saving state failed: cannot open the state directory", exc)
            return False
        return True

    def save_guarded(self) -> bool:
        """Save the windows; a failure is counted and logged once per outage, never raised."""
        if self.directory is None:
            return False
        if self.store is None:
            if not self._open_store():
                return False
            if self.windows.total == 0:
                self.restore()
        try:
            self.save()
        except Exception as exc:
            self._failed("saving state failed", exc)
            return False
        self.metrics.state_write(True, time.time())
        if not self._ok:
            log.warning("saving state recovered", extra={"state_dir": str(self.directory)})
        self._ok = True
        return True

    async def flush_loop(self, interval: float, run_in_thread: Callable[..., Any]) -> None:
        """Save every ``interval`` seconds (in a worker thread) until cancelled."""
        while True:
            await asyncio.sleep(interval)
            await run_in_thread(self.save_guarded)

    def close(self) -> None:
        """Save one last time and close the database."""
        self.save_guarded()
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.close()
            self.store = None
