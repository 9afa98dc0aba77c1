"""The agent's HTTP response bodies: the one JSON helper every route answers with, and V2 errors.

:func:`json_response` writes compact JSON and refuses NaN and infinities (``allow_nan=False``): they
are not JSON, and a client's parser would reject the whole body. Errors are always the V2 error object
``{"error": "..."}``, also when written straight to an ASGI ``send`` (:func:`send_error`, used by the
fast inference path and the body-limit middleware, which run outside FastAPI).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi.responses import Response
from starlette.types import Send

from agent.protocol import v2

JSON = "application/json"


def json_response(obj: Any, status: int = 200) -> Response:
    """``obj`` as compact JSON (no NaN or infinity) with ``status``."""
    return Response(json.dumps(obj, separators=(",", ":"), allow_nan=False), status_code=status, media_type=JSON)


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """The V2 error object with ``status`` (and extra ``headers``, e.g. ``Allow`` of a 405)."""
    return Response(
        v2.error_body(message), status_code=status, media_type=JSON, headers=dict(headers) if headers else None
    )


async def send_error(send: Send, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
    """Answer the V2 error object on a raw ASGI ``send`` (with extra ``headers``, e.g. ``Retry-After``)."""
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send_body(send, status, [(b"content-type", JSON.encode()), *extra], v2.error_body(message))


async def send_body(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """Answer ``body`` with ``headers`` (``content-length`` added) on a raw ASGI ``send``."""
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
