"""A hostile Prometheus query API for the fleet evaluator (``mode: fleet``): a raw asyncio HTTP/1.1
server on a loopback port that answers ``POST /api/v1/query`` and ``/api/v1/query_range`` as its
:attr:`HostilePrometheus.mode` says, from a consistent answer to everything a scrape target matching
``fleet.selector`` (or a broken store) could make it send: a huge class index, 200,000 series, a 200 MB
body, negative sums, values that are no counters, malformed documents and an answer dripped one byte per
second.

The consistent answer (``mode = "good"``) is one replica's ``icos_window_stat_total`` totals at the
window's start and end (the range query of the sums: the start's totals at every point before its end),
made by :meth:`WindowStats.of_samples` from random verdicts and confidences, so the evaluator has a
good estimate to keep. Hostile modes change the values at the range's end (the evaluator's first
query); the other queries keep their consistent answers.

Used by ``tests/integration/test_fleet_hostile.py`` and ``bench/fleet/hostile.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable

import numpy as np

from agent.estimation.statistics.items import stat_items
from agent.estimation.statistics.window import WindowStats

#: What each hostile mode sends instead of the sums' range answer (its end's values).
CASES: dict[str, str] = {
    "class_index": 'one series stat="class_counts:100000000" (150 bytes) beside the good ones',
    "many_series": "200,000 series of distinct versions, at the end only (about 31 MB, formatted like Prometheus)",
    "huge_body": "a 200 MB body (an empty result and a padding string), chunked, no declared length",
    "negative_sums": "conf_sum at the window's end 500 below its value at the start: a negative confidence sum",
    "inf": 'conf_sum "+Inf"',
    "huge_value": 'n "1e300"',
    "value_list": 'a value [1,2,3] instead of [time, "value"]',
    "data_string": '"data": "x"',
    "drip": "a valid beginning, then one byte per second, without end",
    "many_versions": "the good series under 40 versions (within the byte and series bounds)",
    "compact_cap": "a matrix of compact points just under 8 MiB (the default byte bound): the most a "
    "parse within the bounds costs",
}
#: An answer's time stamp (the evaluator's own times are not checked against it).
AT = 1_700_000_000.0
DRIP_SECONDS = 1.0
DRIP_BYTES = 3600
CHUNK = 1024 * 1024
HUGE_BODY = 200 * 1024 * 1024
MANY_SERIES = 200_000
#: The time written into the ``many_series`` answer as it is built (replaced by the range's end).
MANY_END = 1.25
COMPACT_BYTES = 8 * 1024 * 1024 - 4096


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def vector_body(series: Iterable[tuple[dict[str, str], object]]) -> bytes:
    """A Prometheus instant-vector answer of ``(labels, value)``; ``value`` is sent as given."""
    result = [{"metric": labels, "value": [AT, value]} for labels, value in series]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def range_body(series: Iterable[tuple[dict[str, str], list[list[object]]]]) -> bytes:
    """A Prometheus range answer (a matrix) of ``(labels, [[time, value], ...])``, sent as given."""
    result = [{"metric": labels, "values": values} for labels, values in series]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


def grid(form: dict[str, str]) -> list[float]:
    """The times a range query asks for (``start``, ``start + step``, … up to ``end``; at most 1,000)."""
    start, end, step = (float(form.get(k, "0")) for k in ("start", "end", "step"))
    points = min(999, round((end - start) / step)) if step > 0 else 0
    return [round(start + k * step, 3) for k in range(points + 1)]


def good_totals(seed: int = 0) -> tuple[dict[str, float], dict[str, float]]:
    """One replica's statistic totals at the window's start and at its end (2,000 then 3,000 judged
    predictions of random verdicts and confidences)."""
    rng = np.random.default_rng(seed)

    def stats(n: int) -> WindowStats:
        verdicts = rng.choice(4, size=n, p=[0.8, 0.1, 0.06, 0.04])
        return WindowStats.of_samples(verdicts, rng.beta(8, 1, size=n), 0.7)

    begin = stats(2000)
    end = begin + stats(1000)
    return dict(stat_items(begin)), dict(stat_items(end))


class HostilePrometheus:
    """The API on ``127.0.0.1:<port>``, run by an asyncio loop in a thread; set :attr:`mode` (a key of
    :data:`CASES`, or ``"good"``) to choose how it answers."""

    def __init__(self, model: str, version: str, bundle: str) -> None:
        self.model, self.version, self.bundle = model, version, bundle
        self.begin, self.end = good_totals()
        self.mode = "good"
        #: queries answered per mode
        self.served: Counter[str] = Counter()
        self._many: bytes | None = None
        #: answers of the window's end totals (the query a case answers) begun in a hostile mode
        self.hostile_ends = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="hostile-prometheus", daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop
        ).result(10)
        self.port = int(self.server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def labels(self, stat: str, version: str | None = None) -> dict[str, str]:
        return {
            "__name__": "icos_window_stat_total",
            "bundle": self.bundle,
            "model": self.model,
            "stat": stat,
            "version": version or self.version,
        }

    def _totals(
        self, times: list[float], change: Callable[[str, float], object] | None = None, version: str | None = None
    ) -> list[tuple[dict[str, str], list[list[object]]]]:
        """Every statistic's series of the range: the start's totals at every point but the last, the
        end's (``change``d) at the last."""
        return [
            (
                self.labels(k, version),
                [[t, repr(float(self.begin[k]))] for t in times[:-1]]
                + [[times[-1], repr(float(v)) if change is None else change(k, v)]],
            )
            for k, v in self.end.items()
        ]

    def _many_series(self, end: float) -> bytes:
        """The ``many_series`` answer at the range's ``end``, built once (building it holds this process's
        GIL for most of a second, which would otherwise recur at every refresh; the time is put in after)."""
        if self._many is None:
            self._many = range_body((self.labels("n", f"v{i}"), [[MANY_END, "1"]]) for i in range(MANY_SERIES))
        return self._many.replace(json.dumps(MANY_END).encode(), json.dumps(end).encode())

    # -- the answers -----------------------------------------------------------------------------
    async def _answer(self, form: dict[str, str], writer: asyncio.StreamWriter) -> None:
        mode = self.mode
        self.served[mode] += 1
        query = form.get("query", "")
        if query.startswith("count without"):  # restarted replicas, replicas gone before the span: none
            await self._send(writer, vector_body([]))
        elif query.startswith("count by"):
            labels = {"bundle": self.bundle, "model": self.model, "version": self.version}
            await self._send(writer, vector_body([(labels, "1")]))
        elif query.startswith("sum by"):
            self.hostile_ends += mode != "good"
            await self._end_answer(mode, grid(form), writer)
        else:  # the raw samples of a restarted replica: none restarted
            await self._send(writer, b'{"status":"success","data":{"resultType":"matrix","result":[]}}')

    async def _end_answer(self, mode: str, times: list[float], writer: asyncio.StreamWriter) -> None:
        if mode == "class_index":
            extra = (self.labels("class_counts:100000000"), [[times[-1], "1"]])
            await self._send(writer, range_body([*self._totals(times), extra]))
        elif mode == "many_series":
            await self._send(writer, self._many_series(times[-1]))
        elif mode == "many_versions":
            await self._send(writer, range_body(s for i in range(40) for s in self._totals(times, version=f"v{i}")))
        elif mode == "negative_sums":
            start = self.begin["conf_sum"]
            await self._send(
                writer, range_body(self._totals(times, lambda k, v: repr(start - 500.0 if k == "conf_sum" else v)))
            )
        elif mode == "inf":
            inf = self._totals(times, lambda k, v: "+Inf" if k == "conf_sum" else repr(v))
            await self._send(writer, range_body(inf))
        elif mode == "huge_value":
            await self._send(writer, range_body(self._totals(times, lambda k, v: "1e300" if k == "n" else repr(v))))
        elif mode == "value_list":
            series = self._totals(times)
            series[0][1][-1] = [1, 2, 3]
            await self._send(writer, range_body(series))
        elif mode == "data_string":
            await self._send(writer, b'{"status":"success","data":"x"}')
        elif mode == "huge_body":
            await self._huge(writer)
        elif mode == "drip":
            await self._drip(writer)
        elif mode == "compact_cap":
            head = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":['
            count = (COMPACT_BYTES - len(head) - 4) // 8
            await self._send(writer, head + b",".join([b'[0,"1"]'] * count) + b"]}]}}")
        else:
            await self._send(writer, range_body(self._totals(times)))

    async def _send(self, writer: asyncio.StreamWriter, body: bytes) -> None:
        head = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        writer.write(_head(200, head))
        for i in range(0, len(body), CHUNK):
            writer.write(body[i : i + CHUNK])
            await writer.drain()

    async def _huge(self, writer: asyncio.StreamWriter) -> None:
        writer.write(_head(200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}))

        def chunk(data: bytes) -> bytes:
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        writer.write(chunk(b'{"status":"success","data":{"resultType":"vector","result":[]},"padding":"'))
        pad = chunk(b"x" * CHUNK)
        for _ in range(HUGE_BODY // CHUNK):
            if writer.is_closing():
                return
            writer.write(pad)
            await writer.drain()
        writer.write(chunk(b'"}') + b"0\r\n\r\n")
        await writer.drain()

    async def _drip(self, writer: asyncio.StreamWriter) -> None:
        head = b'{"status":"success","data":{"resultType":"vector","result":['
        writer.write(_head(200, {"Content-Type": "application/json", "Content-Length": str(len(head) + DRIP_BYTES)}))
        writer.write(head)
        for _ in range(DRIP_BYTES):
            if writer.is_closing():
                return
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(DRIP_SECONDS)

    # -- HTTP --------------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            while True:  # keep-alive: one request after another
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length:\s*(\d+)", head)
                body = await reader.readexactly(int(length.group(1))) if length else b""
                form = urllib.parse.parse_qs(body.decode("latin-1"))
                await self._answer({k: v[0] for k, v in form.items()}, writer)
        self._writers.discard(writer)
        writer.close()

    def stop(self) -> None:
        async def close() -> None:
            self.server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            await asyncio.sleep(0.1)

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
