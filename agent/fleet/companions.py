"""Fleet companions: what the fleet evaluator runs beside its own sums at every refresh (the fleet's comparison
of the champion with a challenger, :mod:`agent.fleet.challenger`), as one agent runs its companions
(:mod:`agent.judging.companions`).

The evaluator keeps a list of them and never asks which kind it holds: each refresh asks every one for its part
(within the refresh's deadline, its queries counted with the refresh's), ``/v1/estimates`` takes every one's
sections of a version and the fleet's ``/metrics`` registers every one's collectors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from prometheus_client.registry import Collector

from agent.fleet.prometheus_api import PrometheusAPI


class FleetPart(Protocol):
    """A companion's part of one refresh."""

    #: the queries it sent (counted with the refresh's)
    queries: int


P = TypeVar("P", bound=FleetPart)


class FleetCompanion(Protocol[P]):
    """What the fleet evaluator runs beside its own sums (see the module docstring)."""

    async def evaluate(self, api: PrometheusAPI, at: float, windows: Mapping[str, float], lookback_s: float) -> P:
        """Its part of the refresh at ``at`` (raises :class:`~agent.fleet.prometheus_api.RefreshError`)."""

    def sections(self, part: P | None, version: str) -> Mapping[str, Any]:
        """Its top-level sections of the fleet's ``/v1/estimates`` for champion ``version`` (``part``: that of
        the last successful refresh, None before one)."""

    def collectors(self, part: Callable[[], P | None]) -> Sequence[Collector]:
        """Its collectors of the fleet's ``/metrics`` (``part``: that of the last successful refresh at scrape
        time)."""
