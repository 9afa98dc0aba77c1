"""The runtime the agent serves now (model + bundle + calibration): the one place it is replaced.

A :class:`~agent.judging.runtime.Runtime` is immutable and swapped whole, by reload and by
recalibration from labels alike, so a request in flight keeps the runtime it started with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio.to_thread

from agent.config.settings import AgentSettings
from agent.core import logs
from agent.errors import ClientError, UserError
from agent.estimation.statistics.items import stat_items
from agent.estimation.statistics.window import WindowStats
from agent.judging.runtime import Runtime, load_runtime
from agent.judging.windows import WindowSet
from exporters.prometheus import AgentMetrics

log = logs.get("app")


class RuntimeHolder:
    """Holds the current runtime; :meth:`swap` replaces it (windows and model metrics follow)."""

    def __init__(
        self,
        runtime: Runtime,
        settings: AgentSettings,
        windows: WindowSet,
        metrics: AgentMetrics,
        after_reload: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.current = runtime
        self.settings = settings
        self.windows = windows
        self.metrics = metrics
        #: Awaited after a reload swapped the runtime (proxy mode re-reads its upstream's metadata).
        self.after_reload = after_reload
        self._reload_lock = asyncio.Lock()
        metrics.set_model(runtime.name, runtime.version, runtime.model_sha256, runtime.classes)
        metrics.record_window_stats(runtime.name, runtime.version, runtime.bundle_label, stat_items(WindowStats()))

    def resolve(self, name: str, version: str | None) -> Runtime:
        """The runtime a request addresses (404 for another model or version)."""
        rt = self.current
        if name != rt.name:
            raise ClientError(
                f"unknown model {name!r}; this agent serves {rt.name!r}", status=404, reason="unknown_model"
            )
        if version is not None and version != rt.version:
            raise ClientError(
                f"unknown version {version!r} of model {name!r}; serving {rt.version!r}",
                status=404,
                reason="unknown_model",
            )
        return rt

    def swap(self, new: Runtime) -> None:
        """Serve ``new`` from now on (an atomic swap). The windows restart when the model or the bundle
        changed (not for a new calibration of the same ones); the model metrics follow."""
        if new.identity != self.current.identity:
            self.windows.reset()
        self.current = new
        self.metrics.set_model(new.name, new.version, new.model_sha256, new.classes)
        self.metrics.record_window_stats(new.name, new.version, new.bundle_label, stat_items(WindowStats()))

    async def reload(self, model_path: str | None, bundle_path: str | None, version: str | None) -> Runtime:
        """Load a model and bundle and swap them in. A model or bundle that does not load is a 400
        ``reload`` (:class:`~agent.errors.ClientError`) naming the problem: the previous runtime keeps
        serving."""
        async with self._reload_lock:
            try:
                new = await anyio.to_thread.run_sync(
                    lambda: load_runtime(self.settings, model_path=model_path, bundle_path=bundle_path, version=version)
                )
            except ClientError:
                raise
            except UserError as exc:
                raise ClientError(
                    f"reload failed, still serving the previous model: {exc}", status=400, reason="reload"
                ) from None
            self.swap(new)
            if self.after_reload is not None:
                await self.after_reload()
            log.info(
                "reloaded", extra={"sha256": new.model_sha256, "bundle": new.bundle_digest, "version": new.version}
            )
            return new
