"""A small client of the Prometheus HTTP query API (``/api/v1/query`` and ``/api/v1/query_range``) over
httpx, that trusts no answer.

Instant queries (vectors, and matrices of raw samples for range selectors) and range queries (an
expression evaluated on a grid of times) only, so the same code works against Prometheus,
VictoriaMetrics, Thanos Query, Mimir or any API that speaks this protocol.

Every answer is bounded before it is believed: one query has one total deadline
(``fleet.query_timeout_seconds``: connecting, sending and reading the whole answer, so a server
dripping its answer cannot hold it); the body is streamed under ``fleet.max_response_bytes`` (a larger
declared length is refused at once, a longer stream as soon as it passes the bound; no compression,
which could expand past it) and only then parsed; an answer of more than ``fleet.max_series`` series
is refused; every value must be a finite number. What goes wrong is a :class:`QueryError` whose
``reason`` is one of :data:`REASONS` (the label of ``icos_fleet_query_errors_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import math
import re
from array import array
from collections.abc import AsyncIterator, Awaitable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

import httpx

from agent.errors import Unavailable, UserError

#: A series' labels, sorted (hashable; ``__name__`` dropped).
LabelSet = tuple[tuple[str, str], ...]

#: Why a refresh failed (a bounded set: the ``reason`` label of ``icos_fleet_query_errors_total``).
Reason = Literal[
    "unreachable",  # the API could not be reached (connection refused, reset, DNS)
    "timeout",  # one query past fleet.query_timeout_seconds
    "deadline",  # the whole refresh past fleet.refresh_timeout_seconds
    "error_answer",  # an HTTP error status or "status": "error"
    "too_large",  # a body over fleet.max_response_bytes
    "too_many_series",  # an answer of more than fleet.max_series series
    "too_many_versions",  # more than fleet.max_versions model versions
    "malformed",  # not the API's JSON document (wrong shape, types, result type, encoding)
    "bad_label",  # a model, version, bundle or label name that cannot be what a replica exports
    "bad_value",  # NaN, ±Inf, or a value no counter of the statistic can hold
    "bad_stat",  # a statistic of the bundle with an index beyond its size (a class it has not)
    "inconsistent",  # window sums no set of predictions can have (fails > n, a negative sum, ...)
    "internal",  # any other exception: a bug of the evaluator
]
REASONS: tuple[str, ...] = get_args(Reason)
#: Queries of one refresh in flight at once (``PrometheusAPI(max_concurrent=…)``): the store answers
#: them on several cores, while the evaluator holds at most this many answers, each bounded.
MAX_CONCURRENT = 4
T = TypeVar("T")
#: How the query API writes a raw sample that is a staleness marker (a series gone at a failed scrape).
STALE = "NaN"
#: Characters of an API's own error message (or of any text it sent) kept in ``last_error``.
MESSAGE_CHARS = 200
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


class RefreshError(Unavailable):
    """A refresh failed; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason


class QueryError(RefreshError):
    """A query to the API failed: unreachable, timeout, an error answer, an answer too large, too many
    series, or one that is not the API's document."""


def printable(text: object, limit: int = MESSAGE_CHARS) -> str:
    """``text`` as printable ASCII of at most ``limit`` characters (for logs and ``last_error``)."""
    s = _UNPRINTABLE.sub("?", str(text))
    return s if len(s) <= limit else s[: limit - 3] + "..."


@dataclass(frozen=True)
class Sample:
    labels: LabelSet
    value: float


@dataclass(frozen=True)
class Series:
    """A range selector's raw samples of one series, oldest first (compact: two float arrays)."""

    labels: LabelSet
    times: array[float]
    values: array[float]

    @property
    def points(self) -> Iterator[tuple[float, float]]:
        return zip(self.times, self.values, strict=True)


def label_set(metric: object) -> LabelSet:
    """The sorted labels of an answer's ``metric`` object (strings only)."""
    if not isinstance(metric, dict):
        raise QueryError("malformed", "a series' metric is not an object")
    out = []
    for k, v in metric.items():
        if not isinstance(v, str):
            raise QueryError("malformed", f"label {printable(k, 40)} is not a string")
        if k != "__name__":
            out.append((k, v))
    return tuple(sorted(out))


def _number(raw: object, what: str) -> float:
    """A finite float from an answer (values come as strings, times as numbers)."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise QueryError("malformed", f"{what} is a {type(raw).__name__}, not a number")
    try:
        value = float(raw)
    except ValueError:
        raise QueryError("malformed", f"{what} is not a number: {printable(raw, 40)}") from None
    if not math.isfinite(value):
        raise QueryError("bad_value", f"{what} is {printable(raw, 40)}: not a finite number")
    return value


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(pairs)


def _float(text: str) -> float:
    return float(text)


def _int(text: str) -> int:
    return int(text)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused (then resumed as it was): a full collection over the objects
    of a parsed answer (hundreds of thousands) holds the GIL, and the app's event loop, for hundreds of
    milliseconds, and there is nothing cyclic to collect in an answer."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _parse(raw: bytes) -> Any:
    """``json.loads`` that lets the app's event loop run meanwhile, with the cyclic garbage collector
    paused.

    The refresh parses in its own thread, but ``json.loads`` is one call into C that holds the GIL from
    the first byte to the last: 200,000 series (33 MB) held it, and the app's liveness and ``/metrics``
    answers waited, for a second. Here every object and number of the answer goes through a Python
    function (:func:`_object`, :func:`_float`, :func:`_int`), and the interpreter hands the GIL to a
    waiting thread at the start of a Python function once its switch interval (5 ms) has passed: the loop
    waits at most about that long at a time, for about a third more CPU in the parse (a Prometheus answer
    is objects and numbers; the rest of its values are short strings). Pausing the collector matters
    too: a bounded answer of many small lists (a matrix's points) otherwise triggers collections over
    every object made so far, which made the parse 2 to 3 times longer."""
    with _collector_paused():
        return json.loads(
            raw, parse_constant=_refuse_constant, object_pairs_hook=_object, parse_float=_float, parse_int=_int
        )


class PrometheusAPI:
    """Instant queries at a given time against ``base_url`` (no retries: the caller keeps its last
    answer and tries again at its next refresh). Queries are made inside :meth:`connected`, which
    holds one HTTP client for a refresh."""

    def __init__(
        self,
        base_url: str,
        timeout: float,
        *,
        max_response_bytes: int = 8 * 1024 * 1024,
        max_series: int = 20_000,
        max_concurrent: int = MAX_CONCURRENT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise UserError(f"fleet.prometheus_url: not an http(s) URL: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self.max_series = max_series
        self.max_concurrent = max(1, max_concurrent)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None
        self.queries = 0

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[PrometheusAPI]:
        """One pooled client for the queries made inside (closed on the way out, also on a deadline);
        at most ``max_concurrent`` of them in flight at once."""
        limits = httpx.Limits(max_connections=self.max_concurrent, max_keepalive_connections=self.max_concurrent)
        async with httpx.AsyncClient(
            base_url=self.base_url,
            timeout=self.timeout,
            transport=self._transport,
            follow_redirects=False,
            limits=limits,
        ) as client:
            self._client = client
            self._slots = asyncio.Semaphore(self.max_concurrent)
            try:
                yield self
            finally:
                self._client = None
                self._slots = None

    async def _body(self, path: str, form: dict[str, str]) -> tuple[int, bytes]:
        """The status and the whole body of one query (``form`` posted to ``path``), within its deadline
        and the byte bound."""
        if self._client is None:
            raise RuntimeError("PrometheusAPI queried outside connected()")
        self.queries += 1
        cap = self.max_response_bytes
        # nocache: VictoriaMetrics otherwise answers a query for the last -search.latencyOffset (30 s)
        # as of that long ago, and from its cache of answers; Prometheus and the others ignore it
        data = {**form, "nocache": "1"}
        headers = {"Accept-Encoding": "identity"}  # a compressed answer could expand far past the bound
        try:
            async with asyncio.timeout(self.timeout):
                async with self._client.stream("POST", path, data=data, headers=headers) as r:
                    encoding = r.headers.get("content-encoding", "identity").strip().lower()
                    if encoding not in ("", "identity"):
                        raise QueryError("malformed", f"the answer is compressed ({printable(encoding, 40)})")
                    declared = r.headers.get("content-length")
                    if declared is not None and declared.isdigit() and int(declared) > cap:
                        raise QueryError("too_large", self._too_large(f"it declares {declared} bytes"))
                    buf = bytearray()
                    async for chunk in r.aiter_raw():
                        if len(buf) + len(chunk) > cap:
                            raise QueryError("too_large", self._too_large("it streamed more"))
                        buf += chunk
                    return r.status_code, bytes(buf)
        except TimeoutError as exc:  # this query's own deadline (a refresh's deadline is the caller's)
            raise QueryError(
                "timeout", f"the API did not answer within fleet.query_timeout_seconds ({self.timeout:g} s)"
            ) from exc
        except httpx.TimeoutException as exc:
            raise QueryError("timeout", f"{type(exc).__name__}: {printable(exc)}") from exc
        except httpx.HTTPError as exc:
            raise QueryError("unreachable", f"{type(exc).__name__}: {printable(exc)}") from exc

    def _too_large(self, what: str) -> str:
        return f"the answer is larger than fleet.max_response_bytes ({self.max_response_bytes} bytes): {what}"

    async def _query(self, form: dict[str, str], kind: str, path: str = "/api/v1/query") -> list[Any]:
        """The ``result`` list of a successful answer of ``kind`` (``vector`` or ``matrix``). A slot is
        held from the request to the parse: at most ``max_concurrent`` bodies are held at once."""
        if self._slots is None:
            raise RuntimeError("PrometheusAPI queried outside connected()")
        async with self._slots:
            status, raw = await self._body(path, form)
            return self._result(status, raw, kind)

    def _result(self, status: int, raw: bytes, kind: str) -> list[Any]:
        """The checked ``result`` of one body (parsed with nothing else awaited meanwhile)."""
        body: Any
        data: Any = None
        result: Any = None
        try:
            body = _parse(raw)
        except (ValueError, RecursionError) as exc:
            raise QueryError("malformed", f"HTTP {status}: not a JSON answer ({printable(exc, 80)})") from None
        try:
            if not isinstance(body, dict):
                raise QueryError("malformed", f"HTTP {status}: the answer is not a JSON object")
            if status != 200 or body.get("status") != "success":
                why = f"{printable(body.get('errorType', ''), 40)} {printable(body.get('error', ''))}"
                raise QueryError("error_answer", f"HTTP {status}: {why}".strip())
            data = body.get("data")
            if not isinstance(data, dict) or not isinstance(data.get("result"), list):
                raise QueryError("malformed", "the answer's data is not an object with a result list")
            if data.get("resultType") != kind:
                raise QueryError("malformed", f"expected a {kind}, got {printable(data.get('resultType'), 40)}")
            result = data["result"]
            if len(result) > self.max_series:
                raise QueryError(
                    "too_many_series",
                    f"the answer holds {len(result)} series, more than fleet.max_series ({self.max_series})",
                )
            return result
        except QueryError:
            # refused: a traceback keeping this frame must not keep the document (with several
            # queries in flight, another may parse its own before this failure ends the refresh)
            body = data = result = None
            raise

    async def vector(self, expr: str, at: float) -> list[Sample]:
        """The instant vector of ``expr`` at ``at``."""
        result = await self._query({"query": expr, "time": f"{at:.3f}"}, "vector")
        try:
            with _collector_paused():
                out = []
                for i, r in enumerate(result):
                    if not isinstance(r, dict) or not isinstance(r.get("value"), list) or len(r["value"]) != 2:
                        raise QueryError("malformed", "a vector sample is not {metric, value: [time, value]}")
                    out.append(Sample(label_set(r.get("metric")), _number(r["value"][1], "a sample's value")))
                    result[i] = None  # let the parsed document go as it is read
                return out
        finally:
            _let_go(result)  # also when refused: a traceback keeping this frame must not keep the document

    async def matrix(self, expr: str, at: float) -> list[Series]:
        """The raw samples of a range selector ``expr`` (e.g. ``m{...}[5m]``) ending at ``at``; the
        times of each series must increase."""
        return await self._series_of({"query": expr, "time": f"{at:.3f}"})

    async def range_points(
        self, expr: str, grid: tuple[int, int, int], wanted: Collection[int]
    ) -> dict[int, list[Sample]]:
        """``expr`` evaluated on the ``grid`` ``(start, end, step)`` of a range query (``/api/v1/query_range``;
        milliseconds): each ``wanted`` time's values (see :func:`grid_points`)."""
        start, end, step = (f"{ms / 1000:.3f}" for ms in grid)
        form = {"query": expr, "start": start, "end": end, "step": step}
        result = await self._query(form, "matrix", "/api/v1/query_range")
        try:
            with _collector_paused():
                return grid_points(result, grid, wanted)
        finally:
            _let_go(result)

    async def _series_of(self, form: dict[str, str]) -> list[Series]:
        """The series of a matrix answer, each as two float arrays."""
        result = await self._query(form, "matrix")
        try:
            with _collector_paused():
                out = []
                for i in range(len(result)):
                    out.append(_series(result[i]))
                    result[i] = None
                return out
        finally:
            _let_go(result)


def grid_points(result: list[Any], grid: tuple[int, int, int], wanted: Collection[int]) -> dict[int, list[Sample]]:
    """The values of a range answer's series (``result``, emptied as it is read) at each ``wanted`` time
    (ms) of ``grid`` ``(start, end, step)``: a time with no value is an empty list (nothing there). A
    point off the grid is refused (a store that moved the grid would otherwise have its times read as
    these), and so is any value that is not a finite number; a series' times must increase."""
    start, end, step = grid
    out: dict[int, list[Sample]] = {t: [] for t in wanted if start <= t <= end and (t - start) % step == 0}
    for i, r in enumerate(result):
        if not isinstance(r, dict) or not isinstance(r.get("values"), list):
            raise QueryError("malformed", "a matrix series is not {metric, values: [[time, value], ...]}")
        labels = label_set(r.get("metric"))
        last = -math.inf
        for point in r["values"]:
            if not isinstance(point, list) or len(point) != 2:
                raise QueryError("malformed", "a matrix point is not [time, value]")
            t = _number(point[0], "a point's time")
            if t <= last:
                raise QueryError("malformed", "a series' point times do not increase")
            last = t
            ms = round(t * 1000)
            if not (start <= ms <= end and (ms - start) % step == 0):
                raise QueryError("malformed", "a range answer holds a point off the times asked")
            if ms in out:
                out[ms].append(Sample(labels, _number(point[1], "a point's value")))
        result[i] = None  # let the parsed document go as it is read
    return out


def _let_go(result: list[Any]) -> None:
    """Empty a parsed answer's result list item by item: ``clear()`` frees what is left of it in one call
    into C, holding the GIL for as long as that takes (200,000 series: a tenth of a second)."""
    for _ in range(len(result)):
        result.pop()


async def concurrently(*awaitables: Awaitable[T]) -> list[T]:
    """The results of ``awaitables`` run at once, in their order. The first failure is raised as itself
    (its reason is what is counted), the others are cancelled and awaited first: none outlives the
    refresh's client."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _series(r: object) -> Series:
    """One series of a matrix answer, its points in two float arrays. A raw sample ``"NaN"`` is a
    staleness marker (VictoriaMetrics returns them among raw samples, after a failed scrape; Prometheus
    leaves them out): it holds no value and is skipped, as ``last_over_time`` and ``resets`` skip it.
    Any other value that is not a finite number is refused."""
    if not isinstance(r, dict) or not isinstance(r.get("values"), list):
        raise QueryError("malformed", "a matrix series is not {metric, values: [[time, value], ...]}")
    times, values = array("d"), array("d")
    last = -math.inf
    for point in r["values"]:
        if not isinstance(point, list) or len(point) != 2:
            raise QueryError("malformed", "a matrix point is not [time, value]")
        t = _number(point[0], "a sample's time")
        if t <= last:
            raise QueryError("malformed", "a series' sample times do not increase")
        last = t
        if point[1] == STALE:
            continue
        times.append(t)
        values.append(_number(point[1], "a sample's value"))
    return Series(label_set(r.get("metric")), times, values)
