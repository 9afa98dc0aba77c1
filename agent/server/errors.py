"""The one table from errors to HTTP and gRPC answers, read by the FastAPI exception handlers, the fast
path and the gRPC service alike.

A :class:`~agent.errors.ClientError` (and its subclasses: protocol errors, invalid inputs, refused
recalibrations...) answers its own ``status`` and counts its ``reason`` in
``icos_invalid_requests_total``. Types from outside that hierarchy are mapped in :data:`ERROR_TABLE`;
anything else is an internal error: 500, logged with its traceback, never its message (it may hold
internals). Every HTTP answer is the V2 error object ``{"error": "..."}``; over gRPC the same message
is the call's status details, with the status code of :attr:`HttpAnswer.grpc_code` (the name of a
``grpc.StatusCode``: this module stays free of ``grpc``, which only ``agent.server.grpc_server`` imports).
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
from agent.dataplane.upstream import UpstreamError
from agent.errors import ClientError
from agent.labels.store import StoreUnavailable
from agent.server.body_budget import ServerBusy
from agent.server.responses import error_response
from exporters.prometheus import AgentMetrics

log = logs.get("app")


@dataclass(frozen=True)
class HttpAnswer:
    """What an error answers: ``status`` and ``message`` (over gRPC: ``grpc_code`` and ``message``); what
    it counts: ``invalid`` (a client's mistake, ``icos_invalid_requests_total{reason}``) or ``upstream``
    (``icos_upstream_errors_total``)."""

    status: int
    message: str
    invalid: str | None = None
    upstream: str | None = None
    #: a request refused for the server's load (``icos_connections_refused_total{reason}``)
    refused: str | None = None
    headers: Mapping[str, str] | None = None
    #: The gRPC status code of the same answer (a ``grpc.StatusCode`` name).
    grpc_code: str = "INTERNAL"

    def count(self, metrics: AgentMetrics) -> None:
        if self.invalid is not None:
            metrics.invalid(self.invalid)
        if self.upstream is not None:
            metrics.upstream_errors.labels(self.upstream).inc()
        if self.refused is not None:
            metrics.connection_refused(self.refused)


#: HTTP status → gRPC status code, as gRPC's own HTTP mapping reads them, and for the statuses it
#: leaves open (413 too large, 409 conflict) the code a gRPC server answers for the same mistake.
GRPC_CODES: Mapping[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "FAILED_PRECONDITION",
    413: "RESOURCE_EXHAUSTED",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def grpc_code_of(status: int) -> str:
    """The gRPC status code of an HTTP status (other 4xx: ``INVALID_ARGUMENT``; other 5xx: ``INTERNAL``)."""
    return GRPC_CODES.get(status, "INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL")


def _client(exc: ClientError) -> HttpAnswer:
    return HttpAnswer(exc.status, str(exc), invalid=exc.reason, headers=exc.headers, grpc_code=grpc_code_of(exc.status))


def _upstream(exc: UpstreamError) -> HttpAnswer:
    code = grpc_code_of(exc.status)
    if exc.reason == "client_error":  # the upstream refused the client's request: the client's mistake
        return HttpAnswer(exc.status, str(exc), invalid="upstream_rejected", grpc_code=code)
    return HttpAnswer(exc.status, str(exc), upstream=exc.reason, grpc_code=code)


def _store(exc: StoreUnavailable) -> HttpAnswer:
    return HttpAnswer(503, str(exc), invalid="store_unavailable", grpc_code="UNAVAILABLE")


def _busy(exc: ServerBusy) -> HttpAnswer:
    return HttpAnswer(503, str(exc), refused="bytes_in_flight", headers={"Retry-After": "1"}, grpc_code="UNAVAILABLE")


def _gone(_exc: ClientDisconnect) -> HttpAnswer:
    # Nobody reads this answer; a body that timed out is counted in icos_connections_refused_total.
    return HttpAnswer(400, "the client closed the connection before sending its whole request")


def _http(exc: StarletteHTTPException) -> HttpAnswer:
    reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
    return HttpAnswer(
        exc.status_code,
        str(exc.detail),
        invalid=reason if exc.status_code < 500 else None,
        headers=exc.headers,
        grpc_code=grpc_code_of(exc.status_code),
    )


#: Error types and their answers, most specific first (the first ``isinstance`` match wins).
ERROR_TABLE: tuple[tuple[type[Exception], Callable[[Any], HttpAnswer]], ...] = (
    (ClientError, _client),
    (UpstreamError, _upstream),
    (StoreUnavailable, _store),
    (ServerBusy, _busy),
    (StarletteHTTPException, _http),
    (ClientDisconnect, _gone),
)


def answer_of(exc: BaseException) -> HttpAnswer:
    """The answer to ``exc``; an internal error (500, ``INTERNAL``, traceback logged) when the table has no entry."""
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
