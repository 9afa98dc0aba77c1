"""The error table (agent/server/errors.py): every error type the agent raises to a client maps to its
HTTP status, the metric it counts (``icos_invalid_requests_total{reason}`` or
``icos_upstream_errors_total{reason}``) and its gRPC status code; anything else is a 500 that does not
leak its message. Every ``ClientError`` subclass in the agent is in the table below."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

import agent
from agent.dataplane.admission import MetadataTooLarge
from agent.dataplane.observe import PendingFull
from agent.dataplane.upstream import UpstreamError
from agent.errors import ClientError
from agent.labels.backend import StoreUnavailable, StoreUnreachable
from agent.labels.recalibration import RecalibrationRefused
from agent.labels.service import PredictionNotStored
from agent.model.classifier import InvalidInput
from agent.protocol.inference import ProtocolError
from agent.server.body_budget import ServerBusy
from agent.server.errors import ERROR_TABLE, GRPC_CODES, answer_of, grpc_code_of, install_error_handlers
from exporters.prometheus import AgentMetrics
from tests.support.inprocess import start_server
from tests.support.metrics import Scrape


@dataclass(frozen=True)
class Case:
    id: str
    error: BaseException
    status: int
    grpc: str
    invalid: str | None = None  # icos_invalid_requests_total{reason}
    upstream: str | None = None  # icos_upstream_errors_total{reason}
    refused: str | None = None  # icos_connections_refused_total{reason}
    headers: dict[str, str] | None = None


CASES = [
    Case("client-error", ClientError("bad"), 400, "INVALID_ARGUMENT", invalid="invalid"),
    Case(
        "client-error-unknown-model",
        ClientError("no such model", status=404, reason="unknown_model"),
        404,
        "NOT_FOUND",
        invalid="unknown_model",
    ),
    Case(
        "client-error-queue-full",
        ClientError("full", status=429, reason="queue_full", headers={"Retry-After": "1"}),
        429,
        "RESOURCE_EXHAUSTED",
        invalid="queue_full",
        headers={"Retry-After": "1"},
    ),
    Case(
        "client-error-shutting-down",
        ClientError("bye", status=503, reason="shutting_down"),
        503,
        "UNAVAILABLE",
        invalid="shutting_down",
    ),
    Case(
        "protocol-error", ProtocolError("malformed_json", "not JSON"), 400, "INVALID_ARGUMENT", invalid="malformed_json"
    ),
    Case(
        "protocol-error-too-large",
        ProtocolError("too_large", "too big", status=413),
        413,
        "RESOURCE_EXHAUSTED",
        invalid="too_large",
    ),
    Case("invalid-input", InvalidInput("shape", "wrong shape"), 400, "INVALID_ARGUMENT", invalid="shape"),
    Case("invalid-input-too-large", InvalidInput("too_large", "batch"), 413, "RESOURCE_EXHAUSTED", invalid="too_large"),
    Case(
        "recalibration-refused",
        RecalibrationRefused("too few labels"),
        409,
        "FAILED_PRECONDITION",
        invalid="recalibration_refused",
    ),
    Case(
        "prediction-not-stored",
        PredictionNotStored("store down"),
        503,
        "UNAVAILABLE",
        invalid="prediction_store_unavailable",
        headers={"Retry-After": "1"},
    ),
    Case("pending-full", PendingFull("wait"), 429, "RESOURCE_EXHAUSTED", invalid="observe_pending_full"),
    Case("metadata-too-large", MetadataTooLarge("long"), 413, "RESOURCE_EXHAUSTED", invalid="metadata_too_large"),
    Case("upstream-unreachable", UpstreamError(502, "unreachable", "down"), 502, "UNAVAILABLE", upstream="unreachable"),
    Case("upstream-timeout", UpstreamError(504, "timeout", "slow"), 504, "DEADLINE_EXCEEDED", upstream="timeout"),
    Case("upstream-too-large", UpstreamError(502, "too_large", "huge"), 502, "UNAVAILABLE", upstream="too_large"),
    Case(
        "upstream-rejected",
        UpstreamError(400, "client_error", "upstream says no"),
        400,
        "INVALID_ARGUMENT",
        invalid="upstream_rejected",
    ),
    Case(
        "upstream-rejected-404",
        UpstreamError(404, "client_error", "no model"),
        404,
        "NOT_FOUND",
        invalid="upstream_rejected",
    ),
    Case("store-unavailable", StoreUnavailable("disk"), 503, "UNAVAILABLE", invalid="store_unavailable"),
    Case("store-unreachable", StoreUnreachable("network"), 503, "UNAVAILABLE", invalid="store_unavailable"),
    Case(
        "server-busy",
        ServerBusy(4096, 1024),
        503,
        "UNAVAILABLE",
        refused="bytes_in_flight",
        headers={"Retry-After": "1"},
    ),
    Case("http-404", StarletteHTTPException(404, "Not Found"), 404, "NOT_FOUND", invalid="not_found"),
    Case(
        "http-405",
        StarletteHTTPException(405, "Method Not Allowed"),
        405,
        "UNIMPLEMENTED",
        invalid="method_not_allowed",
    ),
    Case("http-other-4xx", StarletteHTTPException(418, "teapot"), 418, "INVALID_ARGUMENT", invalid="http"),
    Case("http-5xx", StarletteHTTPException(503, "busy"), 503, "UNAVAILABLE"),
    # nobody reads this answer (the client is gone); it counts nothing
    Case("client-disconnect", ClientDisconnect(), 400, "INTERNAL"),
]


def _subclasses(kind: type) -> Iterator[type]:
    sub: type
    for sub in kind.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _import_agent() -> None:
    """Import every module of the agent, so that every error type it defines exists; but its gRPC
    messages, which tritonclient's (loaded by other tests in this process) would collide with in
    protobuf's pool; those modules raise the error types of the others."""
    for module in pkgutil.walk_packages(agent.__path__, "agent."):
        if not module.name.endswith("__main__") and "grpc" not in module.name:
            importlib.import_module(module.name)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_error_answers_its_status_metric_and_grpc_code(case: Case) -> None:
    answer = answer_of(case.error)
    assert (answer.status, answer.grpc_code) == (case.status, case.grpc)
    assert (answer.invalid, answer.upstream, answer.refused) == (case.invalid, case.upstream, case.refused)
    assert answer.message == str(case.error) or isinstance(case.error, (StarletteHTTPException, ClientDisconnect))
    assert dict(answer.headers or {}) == (case.headers or {})
    assert answer.grpc_code == grpc_code_of(answer.status) or isinstance(case.error, ClientDisconnect)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_answer_counts_in_the_metric_it_names(case: Case) -> None:
    registry = CollectorRegistry()
    answer_of(case.error).count(AgentMetrics(registry))
    counted = Scrape.of_registry(registry)
    invalid = counted.by_label("icos_invalid_requests_total", "reason")
    upstream = counted.by_label("icos_upstream_errors_total", "reason")
    assert {k: v for k, v in invalid.items() if v} == ({case.invalid: 1.0} if case.invalid else {})
    assert {k: v for k, v in upstream.items() if v} == ({case.upstream: 1.0} if case.upstream else {})
    refused = counted.by_label("icos_connections_refused_total", "reason")
    assert {k: v for k, v in refused.items() if v} == ({case.refused: 1.0} if case.refused else {})


def test_every_client_error_type_of_the_agent_is_in_the_table() -> None:
    """A new error type gets a row above: its status, reason and gRPC code are then checked."""
    _import_agent()
    covered = {type(c.error) for c in CASES}
    for base, _answer in ERROR_TABLE:
        missing = {k for k in (base, *_subclasses(base)) if k.__module__.startswith("agent")} - covered
        assert not missing, f"add a Case for {sorted(k.__qualname__ for k in missing)}"


def test_anything_else_is_an_internal_error_that_keeps_its_message_to_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        answer = answer_of(RuntimeError("password=hunter2 in /etc/secret"))
    assert (answer.status, answer.grpc_code, answer.invalid, answer.upstream) == (500, "INTERNAL", None, None)
    assert answer.message == "internal error: RuntimeError"
    assert "hunter2" in caplog.text  # the traceback goes to the log, not to the client


def test_grpc_codes_of_statuses() -> None:
    assert all(grpc_code_of(status) == code for status, code in GRPC_CODES.items())
    assert (grpc_code_of(418), grpc_code_of(599), grpc_code_of(507)) == ("INVALID_ARGUMENT", "INTERNAL", "INTERNAL")


def test_the_handlers_answer_the_table_over_http() -> None:
    """A route that raises answers ``{"error": message}`` with the table's status and headers, counted
    (a real server on a loopback port)."""
    app = FastAPI()
    registry = CollectorRegistry()
    install_error_handlers(app, AgentMetrics(registry))
    errors: dict[str, BaseException] = {c.id: c.error for c in CASES if not isinstance(c.error, ClientDisconnect)}
    errors["internal"] = KeyError("secret")

    @app.get("/raise/{case_id}")
    async def _raise(case_id: str) -> None:
        raise errors[case_id]

    server = start_server(app)
    try:
        for case in CASES:
            if isinstance(case.error, ClientDisconnect):
                continue
            r = httpx.get(f"{server.url}/raise/{case.id}")
            assert r.status_code == case.status, case.id
            assert r.json() == {"error": answer_of(case.error).message}, case.id
            for name, value in (case.headers or {}).items():
                assert r.headers[name] == value
        internal = httpx.get(f"{server.url}/raise/internal")
        assert internal.status_code == 500 and internal.json() == {"error": "internal error: KeyError"}
    finally:
        server.stop()
    counted = Scrape.of_registry(registry).by_label("icos_invalid_requests_total", "reason")
    assert counted["unknown_model"] == 1 and counted["upstream_rejected"] == 2
