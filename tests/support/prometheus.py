"""A real Prometheus server on a loopback port (requirement ``prometheus``), with its HTTP API."""

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

#: Scrape and evaluate every second: what the tests wait for shows up quickly.
FAST = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}


def scrape_every_second(
    targets: list[str], labels: dict[str, str] | None = None, rule_files: list[str] | None = None
) -> dict[str, Any]:
    """A prometheus.yml scraping ``targets`` (``host:port``, job ``icos-agent``, with ``labels``)
    and evaluating ``rule_files`` every second."""
    static: dict[str, Any] = {"targets": targets}
    if labels:
        static["labels"] = labels
    config: dict[str, Any] = {"global": dict(FAST)}
    if rule_files:
        config["rule_files"] = rule_files
    config["scrape_configs"] = [{"job_name": "icos-agent", "static_configs": [static]}]
    return config


class PrometheusServer:
    """``prometheus`` with ``config`` (a prometheus.yml as a mapping) and its TSDB in ``directory``;
    :meth:`stop` returns the end of its log (stderr)."""

    def __init__(
        self,
        directory: Path,
        config: dict[str, Any],
        retention: str | None = "1h",
        port: int | None = None,
        flags: Sequence[str] = (),
    ) -> None:
        self.binary: str = require("prometheus")
        #: further command-line flags (e.g. a query limit a benchmark's many series need)
        self.flags = list(flags)
        self.dir = directory
        self.config = config
        self.retention = retention
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = directory / f"prometheus-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        config_path = self.dir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(self.config, sort_keys=False), encoding="utf-8")
        cmd = [self.binary, f"--config.file={config_path}", f"--storage.tsdb.path={self.dir / 'tsdb'}"]
        cmd += [f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", *self.flags]
        if self.retention:
            cmd.append(f"--storage.tsdb.retention.time={self.retention}")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_http_ready(f"{self.url}/-/ready", timeout=timeout)
        except TimeoutError:
            raise RuntimeError(f"prometheus did not start: {self.stop()}") from None
        return self

    def log(self) -> str:
        return read_log(self.log_path)

    def stop(self) -> str:
        """Stop the server (SIGTERM, then SIGKILL after 20 s); the last 3,000 characters of its log."""
        stop_process(self.proc)
        return self.log()[-3000:]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector, now or ``at`` (unix seconds)."""
        params = {"query": expr} if at is None else {"query": expr, "time": str(at)}
        r = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=5)
        r.raise_for_status()
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's result matrix: every series with its ``values`` at ``start``, ``start + step``, … up to
        ``end`` (unix seconds; explicit times, so that stored history is read whatever the clock says)."""
        params = {"query": expr, "start": str(start), "end": str(end), "step": str(step)}
        r = httpx.get(f"{self.url}/api/v1/query_range", params=params, timeout=5)
        r.raise_for_status()
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        return result

    def get(self, path: str) -> Any:
        """``GET /api/v1/<path>``'s ``data`` (alerts, rules)."""
        r = httpx.get(f"{self.url}/api/v1/{path}", timeout=5)
        r.raise_for_status()
        return r.json()["data"]


def sample_since(url: str, selector: str, since: float, lookback: str = "60s") -> tuple[float, float] | None:
    """The newest stored sample ``(timestamp, value)`` of ``selector`` (one series) taken at or after ``since``
    (unix seconds), else None. An instant query answers with the last sample under the query's own time, so a
    value compared with another read must come from a sample known to be newer than that read."""
    r = httpx.get(f"{url}/api/v1/query", params={"query": f"{selector}[{lookback}]"}, timeout=5)
    r.raise_for_status()
    result = r.json()["data"]["result"]
    samples = [(float(t), float(v)) for series in result for t, v in series["values"] if float(t) >= since]
    return max(samples) if samples else None
