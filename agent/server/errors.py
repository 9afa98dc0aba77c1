"""The one table from errors to HTTP answers, read by the FastAPI exception handlers and the fast path.

A :class:`~agent.errors.ClientError` (and its subclasses: protocol errors, invalid inputs, refused
recalibrations...) answers its own ``status`` and counts its ``reason`` in
``icos_invalid_requests_total``. Types from outside that hierarchy are mapped in :data:`ERROR_TABLE`;
anything else is an internal error: 500, logged with its traceback, never its message (it may hold
internals). Every answer is the V2 error object ``{"error": "..."}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from agent.core import logs
from agent.errors import ClientError
from agent.labels.store import StoreUnavailable
from agent.server.responses import error_response
from agent.server.upstream import UpstreamError
from exporters.prometheus import AgentMetrics

log = logs.get("app")


@dataclass(frozen=True)
class HttpAnswer:
    """What an error answers: ``status`` and ``message``; what it counts: ``invalid`` (a client's
    mistake, ``icos_invalid_requests_total{reason}``) or ``upstream`` (``icos_upstream_errors_total``)."""

    status: int
    message: str
    invalid: str | None = None
    upstream: str | None = None
    headers: Mapping[str, str] | None = None

    def count(self, metrics: AgentMetrics) -> None:
        if self.invalid is not None:
            metrics.invalid(self.invalid)
        if self.upstream is not None:
            metrics.upstream_errors.labels(self.upstream).inc()


def _client(exc: ClientError) -> HttpAnswer:
    return HttpAnswer(exc.status, str(exc), invalid=exc.reason, headers=exc.headers)


def _upstream(exc: UpstreamError) -> HttpAnswer:
    if exc.reason == "client_error":  # the upstream refused the client's request: the client's mistake
        return HttpAnswer(exc.status, str(exc), invalid="upstream_rejected")
    return HttpAnswer(exc.status, str(exc), upstream=exc.reason)


def _store(exc: StoreUnavailable) -> HttpAnswer:
    return HttpAnswer(503, str(exc), invalid="store_unavailable")


def _gone(_exc: ClientDisconnect) -> HttpAnswer:
    # Nobody reads this answer; a body that timed out is counted in icos_connections_refused_total.
    return HttpAnswer(400, "the client closed the connection before sending its whole request")


def _http(exc: StarletteHTTPException) -> HttpAnswer:
    reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
    return HttpAnswer(
        exc.status_code, str(exc.detail), invalid=reason if exc.status_code < 500 else None, headers=exc.headers
    )


#: Error types and their answers, most specific first (the first ``isinstance`` match wins).
ERROR_TABLE: tuple[tuple[type[Exception], Callable[[Any], HttpAnswer]], ...] = (
    (ClientError, _client),
    (UpstreamError, _upstream),
    (StoreUnavailable, _store),
    (StarletteHTTPException, _http),
    (ClientDisconnect, _gone),
)


def answer_of(exc: BaseException) -> HttpAnswer:
    """The HTTP answer to ``exc``; an internal error (500, traceback logged) when the table has no entry."""
    for kind, answer in ERROR_TABLE:
        if isinstance(exc, kind):
            return answer(exc)
    log.exception("internal error", exc_info=exc)
    return HttpAnswer(500, f"internal error: {type(exc).__name__}")


def install_error_handlers(app: FastAPI, metrics: AgentMetrics) -> None:
    """Answer every error of ``app``'s routes from :data:`ERROR_TABLE`, counting it in ``metrics``."""

    async def handle(_r: Request, exc: Exception) -> Response:
        answer = answer_of(exc)
        answer.count(metrics)
        return error_response(answer.status, answer.message, answer.headers)

    for kind, _answer in ERROR_TABLE:
        app.add_exception_handler(kind, handle)
    app.add_exception_handler(Exception, handle)
