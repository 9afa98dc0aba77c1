"""A real single-node VictoriaMetrics on a loopback port (requirement ``victoria-metrics``): it scrapes
with a Prometheus-style config (``-promscrape.config``), accepts samples in Prometheus's text format
(``/api/v1/import/prometheus``) and serves Prometheus's query API, so the fleet evaluator reads it
unchanged."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.ports import free_port
from tests.support.processes import read_log, stop_process
from tests.support.requirements import require
from tests.support.waiting import wait_http_ready


class VictoriaMetricsServer:
    """``victoria-metrics`` with its data in ``directory``, scraping by ``config`` (the ``global`` and
    ``scrape_configs`` of a prometheus.yml; None: no scraping, samples are imported); :meth:`stop`
    returns the end of its log."""

    def __init__(
        self,
        directory: Path,
        config: dict[str, Any] | None = None,
        port: int | None = None,
        flags: Sequence[str] = (),
    ) -> None:
        self.binary: str = require("victoria-metrics")
        #: further command-line flags (e.g. a search limit a benchmark's many series need)
        self.flags = list(flags)
        self.dir = directory
        self.config = _scrape_part(config) if config is not None else None
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = directory / f"victoria-metrics-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> VictoriaMetricsServer:
        cmd = [self.binary, f"-httpListenAddr=127.0.0.1:{self.port}", f"-storageDataPath={self.dir / 'vm-data'}"]
        cmd += ["-retentionPeriod=1d", "-loggerLevel=ERROR", "-search.disableCache", *self.flags]
        if self.config is not None:
            path = self.dir / "promscrape.yml"
            path.write_text(yaml.safe_dump(self.config, sort_keys=False), encoding="utf-8")
            cmd.append(f"-promscrape.config={path}")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log)
        try:
            wait_http_ready(f"{self.url}/health", timeout=timeout)
        except TimeoutError:
            raise RuntimeError(f"victoria-metrics did not start: {self.stop()}") from None
        return self

    def log(self) -> str:
        return read_log(self.log_path)

    def stop(self) -> str:
        """Stop the server (SIGTERM, then SIGKILL after 20 s); the last 3,000 characters of its log."""
        stop_process(self.proc)
        return self.log()[-3000:]

    def import_text(self, text: bytes) -> None:
        """Samples in Prometheus's text format (timestamps in milliseconds), then a flush so that
        queries see them at once."""
        r = httpx.post(f"{self.url}/api/v1/import/prometheus", content=text, timeout=120)
        r.raise_for_status()
        httpx.get(f"{self.url}/internal/force_flush", timeout=60).raise_for_status()

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result (``nocache``: exactly at ``at``, not ``-search.latencyOffset`` earlier)."""
        params: dict[str, str] = {"query": expr, "nocache": "1"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        r = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=5)
        r.raise_for_status()
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        return result


def _scrape_part(config: dict[str, Any]) -> dict[str, Any]:
    """What VictoriaMetrics reads of a prometheus.yml (it refuses any other field): the scrape
    settings of ``global`` and ``scrape_configs`` (rules are evaluated by Prometheus only)."""
    known = ("scrape_interval", "scrape_timeout", "external_labels")
    out: dict[str, Any] = {"global": {k: v for k, v in config.get("global", {}).items() if k in known}}
    out["scrape_configs"] = config.get("scrape_configs", [])
    return out
