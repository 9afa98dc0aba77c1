"""The ``fleet`` section of ``mode: fleet``: the Prometheus-compatible API the evaluator reads, and the
bounds on its answers."""

from __future__ import annotations

from pydantic import Field, field_validator

from agent.config.section import Section


class FleetConfig(Section):
    """``mode: fleet``: the evaluator that sums every replica's ``icos_window_stat_total`` from a
    Prometheus-compatible API and serves the fleet's estimates (:mod:`agent.fleet`)."""

    prometheus_url: str | None = None
    """base URL of a Prometheus-compatible HTTP API (Prometheus, VictoriaMetrics, Thanos Query, Mimir's /prometheus
    prefix); /api/v1/query and /api/v1/query_range are appended"""

    refresh_seconds: float = Field(30.0, ge=1, le=3600)
    """seconds between two evaluations of the fleet"""

    query_timeout_seconds: float = Field(10.0, gt=0, le=600)
    """total deadline of one query to the API: connecting, sending and reading its whole answer
    (icos_fleet_query_errors_total{reason="timeout"})"""

    refresh_timeout_seconds: float = Field(60.0, gt=0, le=3600)
    """total deadline of one refresh (every query of every window, and the estimators); a refresh past it fails
    (icos_fleet_query_errors_total{reason="deadline"}) and the last estimates are kept, so a slow or dripping API
    cannot hold the evaluator longer"""

    max_response_bytes: int = Field(8 * 1024 * 1024, ge=64 * 1024, le=1 << 30)
    """largest answer of the API read (its declared length and the bytes streamed); a larger one fails the refresh
    (reason="too_large") without being buffered past this. Parsing an answer costs up to about 15 times its size
    in memory; a restarted replica's raw samples are the largest legitimate answer (docs/scaling.md)"""

    max_series: int = Field(20_000, ge=100, le=1_000_000)
    """most series in one answer of the API; more fail the refresh (reason="too_many_series")"""

    max_versions: int = Field(16, ge=1, le=1000)
    """most model versions in one window's answers (each one is estimated and exported); more fail the refresh
    (reason="too_many_versions")"""

    selector: str = Field("", pattern=r'^[A-Za-z0-9_]+(=|!=|=~|!~)"[^"\\]*"(,[A-Za-z0-9_]+(=|!=|=~|!~)"[^"\\]*")*$|^$')
    """further label matchers of the replicas' series, e.g. namespace="prod",job="icos-agent\""""

    lookback_seconds: float = Field(300.0, ge=1, le=86_400)
    """how far before the longest window's start a replica's last counter value is looked for (every window reads
    from there: Prometheus's default lookback is 5 minutes)"""

    stale_after_seconds: float | None = Field(None, gt=0)
    """age of the last successful evaluation after which estimates are marked stale (default: three refresh periods)"""

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/") if v else v

    @property
    def stale_seconds(self) -> float:
        return self.stale_after_seconds or 3 * self.refresh_seconds
