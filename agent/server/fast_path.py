"""``POST /v2/models/{name}[/versions/{v}]/infer`` answered as plain ASGI, in every mode.

:class:`~agent.server.app.AgentApp` calls :class:`InferFastPath` ahead of FastAPI's middleware stack:
routing, dependency, exception and telemetry layers cost more than a small model's inference (serve
mode) and about a third of the agent's CPU per forwarded request at batch 1 (proxy mode). The work itself is
:func:`agent.server.http_infer.answer_http` (the dataplane, which answers in the agent's mode: observe
mode refuses), which the FastAPI route (kept for the OpenAPI document and for requests under FastAPI's
native OpenTelemetry, so that traced requests keep their spans) calls too. What this path does itself
is what FastAPI would otherwise do around it: the body limit (as
:class:`~agent.server.middleware.BodyLimitMiddleware`), reading the body, and the error answers (from
:func:`agent.server.errors.answer_of`, the table the exception handlers read).
"""

from __future__ import annotations

import re

from starlette.types import Receive, Scope, Send

from agent.dataplane.plane import DataPlane
from agent.protocol import v2
from agent.server.body_budget import BodyBudget
from agent.server.errors import answer_of
from agent.server.http_infer import answer_http
from agent.server.middleware import declared_length, send_too_large
from agent.server.responses import JSON, send_body
from exporters.prometheus import AgentMetrics

_JSON_TYPE = (b"content-type", JSON.encode())
_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")


class InferFastPath:
    """Inference without FastAPI (see the module docstring)."""

    def __init__(self, plane: DataPlane, metrics: AgentMetrics, limit: int, budget: BodyBudget) -> None:
        self.plane = plane
        self.metrics = metrics
        self.limit = limit
        self.budget = budget

    def match(self, scope: Scope) -> re.Match[str] | None:
        if scope["type"] == "http" and scope["method"] == "POST":
            return _INFER_PATH.match(scope["path"])
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send, m: re.Match[str]) -> None:
        header_length = None
        declared = 0
        for k, v in scope["headers"]:
            if k == b"inference-header-content-length":
                header_length = v.decode("latin-1")
            elif k == b"content-length":
                declared = declared_length(v)
                if declared > self.limit:
                    await self._reject(send)
                    return
        taken = 0  # bytes of the server's budget this body holds (server.max_inflight_bytes)
        try:
            try:
                if declared > 0:
                    self.budget.take(declared)
                    taken = declared
                whole: bytearray | None = None  # the body when it comes in pieces (see _body_of)
                chunks: list[bytes] = []
                received = 0
                more = True
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    chunk = message.get("body", b"")
                    end = received + len(chunk)
                    if end > self.limit:
                        await self._reject(send)
                        return
                    if end > taken:  # a chunked body, or one longer than declared
                        self.budget.take(end - taken)
                        taken = end
                    more = message.get("more_body", False)
                    if whole is None and more and not chunks and 0 < end <= declared:
                        whole = bytearray(declared)
                    if whole is not None and end <= declared:
                        whole[received:end] = chunk
                    else:
                        if whole is not None:  # longer than declared: pieces from here on
                            chunks, whole = [bytes(whole[:received])], None
                        chunks.append(chunk)
                    received = end
                body = _body_of(whole, chunks, received)
                del chunks, whole
                content, out_headers = await answer_http(self.plane, body, header_length, m.group(1), m.group(2))
                del body
                status = 200
                headers = [(k.encode(), v.encode()) for k, v in out_headers.items()]
            except Exception as exc:
                answer = answer_of(exc)
                answer.count(self.metrics)
                status, content = answer.status, v2.error_body(answer.message)
                headers = [
                    _JSON_TYPE,
                    *((k.encode(), v.encode()) for k, v in (answer.headers or {}).items()),
                ]  # e.g. Retry-After
            await send_body(send, status, headers, content)
        finally:
            self.budget.give(taken)

    async def _reject(self, send: Send) -> None:
        self.metrics.invalid("too_large")
        await send_too_large(send, self.limit)


def _body_of(whole: bytearray | None, chunks: list[bytes], received: int) -> bytes | bytearray:
    """The body read. One that comes in pieces is copied as it comes into one buffer of its declared length
    (``whole``, ``received`` bytes of it filled): pieces joined at the end would hold it twice; one piece
    is the body as it came; a body without a declared length is its pieces joined."""
    if whole is not None:
        return whole if received == len(whole) else bytes(whole[:received])
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
