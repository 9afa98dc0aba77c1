"""A small client of the Prometheus HTTP query API (``/api/v1/query``) over httpx.

Only instant queries are used (vectors, and matrices of raw samples for range selectors), so the same
code works against Prometheus, Thanos Query, Mimir or any API that speaks this protocol.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from agent.errors import UserError

#: A series' labels, sorted (hashable; ``__name__`` dropped).
LabelSet = tuple[tuple[str, str], ...]


class QueryError(RuntimeError):
    """A query to the Prometheus API failed (unreachable, timeout, an error answer, a malformed one)."""


@dataclass(frozen=True)
class Sample:
    labels: LabelSet
    value: float


@dataclass(frozen=True)
class Series:
    labels: LabelSet
    points: tuple[tuple[float, float], ...]  # (unix time, value), oldest first


def label_set(metric: Mapping[str, str]) -> LabelSet:
    return tuple(sorted((k, str(v)) for k, v in metric.items() if k != "__name__"))


def _float(raw: object) -> float:
    value = float(str(raw))
    if math.isnan(value):
        raise QueryError("the API answered NaN for a counter")
    return value


class PrometheusAPI:
    """Instant queries at a given time against ``base_url`` (no retries: the caller keeps its last
    answer and tries again at its next refresh)."""

    def __init__(self, base_url: str, timeout: float, transport: httpx.BaseTransport | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise UserError(f"fleet.prometheus_url: not an http(s) URL: {base_url!r}")
        self._client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout, transport=transport)
        self.queries = 0

    def close(self) -> None:
        self._client.close()

    def _query(self, expr: str, at: float) -> tuple[str, list[dict[str, object]]]:
        self.queries += 1
        try:
            r = self._client.post("/api/v1/query", data={"query": expr, "time": f"{at:.3f}"})
        except httpx.HTTPError as exc:
            raise QueryError(f"{type(exc).__name__}: {exc}") from exc
        try:
            body = r.json()
        except ValueError as exc:
            raise QueryError(f"HTTP {r.status_code}: not a JSON answer") from exc
        if r.status_code != 200 or body.get("status") != "success":
            raise QueryError(f"HTTP {r.status_code}: {body.get('errorType', '')} {body.get('error', '')}".strip())
        data = body.get("data") or {}
        return str(data.get("resultType")), list(data.get("result") or [])

    def vector(self, expr: str, at: float) -> list[Sample]:
        """The instant vector of ``expr`` at ``at``."""
        kind, result = self._query(expr, at)
        if kind != "vector":
            raise QueryError(f"expected a vector from {expr!r}, got {kind}")
        try:
            return [Sample(label_set(r["metric"]), _float(r["value"][1])) for r in result]  # type: ignore[index,arg-type]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise QueryError(f"malformed vector answer: {exc}") from exc

    def matrix(self, expr: str, at: float) -> list[Series]:
        """The raw samples of a range selector ``expr`` (e.g. ``m{...}[5m]``) ending at ``at``."""
        kind, result = self._query(expr, at)
        if kind != "matrix":
            raise QueryError(f"expected a matrix from {expr!r}, got {kind}")
        try:
            return [
                Series(label_set(r["metric"]), tuple((float(t), _float(v)) for t, v in r["values"]))  # type: ignore[index,arg-type,union-attr,attr-defined]
                for r in result
            ]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise QueryError(f"malformed matrix answer: {exc}") from exc
