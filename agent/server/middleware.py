"""The request body limit (``server.max_body_bytes``): 413 by ``Content-Length`` or while streaming; and
the server's budget of body bytes in flight (``server.max_inflight_bytes``, :mod:`agent.server.body_budget`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent.errors import Abort
from agent.server.body_budget import BodyBudget, ServerBusy
from agent.server.responses import send_error


class BodyTooLarge(Abort):
    """Raised from the limited ``receive`` once the body passes the limit (caught by the middleware)."""


def declared_length(value: bytes) -> int:
    """A ``Content-Length`` header's value; ``-1`` when it is not a number."""
    try:
        return int(value)
    except ValueError:
        return -1


class BodyLimitMiddleware:
    """Rejects bodies over ``limit`` bytes with 413 (by Content-Length, or while streaming)."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        on_reject: Callable[[], None],
        budget: BodyBudget | None = None,
        on_busy: Callable[[ServerBusy, Send], Awaitable[None]] | None = None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.on_reject = on_reject
        self.budget = budget
        self.on_busy = on_busy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = 0
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                declared = declared_length(value)
                if declared > self.limit:
                    await self._reject(send)
                    return
        received = 0
        taken = 0
        budget = self.budget

        async def limited() -> Message:
            nonlocal received, taken
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge()
                if budget is not None and received > taken:
                    budget.take(received - taken)
                    taken = received
            return message

        try:
            if budget is not None and declared > 0:
                budget.take(declared)
                taken = declared
            await self.app(scope, limited, send)
        except BodyTooLarge:
            await self._reject(send)
        except ServerBusy as exc:
            if self.on_busy is None:
                raise
            await self.on_busy(exc, send)
        finally:
            if budget is not None:
                budget.give(taken)

    async def _reject(self, send: Send) -> None:
        self.on_reject()
        await send_too_large(send, self.limit)


async def send_too_large(send: Send, limit: int) -> None:
    """Answer 413: the request body is over ``limit`` bytes."""
    await send_error(send, 413, f"request body exceeds the limit of {limit} bytes (server.max_body_bytes)")
