"""Prometheus metrics of proxy mode's upstream readiness (registered only by an agent in proxy mode):

* ``icos_upstream_ready`` — 1 while the upstream's model answered ready at the last check, else 0;
* ``icos_upstream_unready_seconds_total`` — seconds the upstream was seen not ready (from one check
  to the next), so ``increase(...[1h])`` says how long it was out in the last hour.

Failed inference calls to the upstream are ``icos_upstream_errors_total{reason}`` of
:class:`exporters.prometheus.AgentMetrics`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class UpstreamMetrics:
    """The upstream's current readiness and the time it spent unready."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ready = Gauge(
            "icos_upstream_ready",
            "Proxy mode: 1 while the upstream's model answered ready at the last check, else 0.",
            registry=registry,
        )
        self.unready_seconds = Counter(
            "icos_upstream_unready_seconds",
            "Proxy mode: seconds the upstream was seen not ready (counted from one readiness check to the next).",
            registry=registry,
        )

    def observe(self, ready: bool, unready_seconds: float) -> None:
        """Record one check: the readiness it found and the unready time since the previous one."""
        self.ready.set(1 if ready else 0)
        if unready_seconds > 0:
            self.unready_seconds.inc(unready_seconds)
