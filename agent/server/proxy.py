"""Proxy mode: forward V2 inference requests to an upstream V2 server and judge its answer.

The upstream is called with :mod:`httpx` (one pooled async client) under a bounded timeout.
Failures become :class:`UpstreamError`: unreachable or broken upstream → 502, timeout → 504; a 4xx
from the upstream (the client's mistake) is passed through with the upstream's message.
"""

from __future__ import annotations

import json

import httpx

from agent.protocol import v2


class UpstreamError(Exception):
    """The upstream could not answer. ``reason`` is a bounded label for metrics."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class UpstreamClient:
    def __init__(self, base_url: str, timeout_seconds: float, max_connections: int = 64) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_seconds),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def infer(self, model_name: str, body: bytes, headers: dict[str, str]) -> tuple[bytes, str | None]:
        """POST a V2 request; returns the response body and its ``Inference-Header-Content-Length``."""
        url = f"{self.base_url}/v2/models/{model_name}/infer"
        try:
            resp = await self._client.post(url, content=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise UpstreamError(
                504, "timeout", f"upstream {self.base_url} did not answer within {self.timeout_seconds:g} s"
            ) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(
                502, "unreachable", f"upstream {self.base_url} is unreachable: {type(exc).__name__}: {exc}"
            ) from exc
        if resp.status_code >= 400:
            message = _error_text(resp.content)
            if 400 <= resp.status_code < 500:
                raise UpstreamError(resp.status_code, "client_error", f"upstream rejected the request: {message}")
            raise UpstreamError(502, "bad_status", f"upstream answered {resp.status_code}: {message}")
        return resp.content, resp.headers.get(v2.HEADER_LENGTH)

    async def aclose(self) -> None:
        await self._client.aclose()


def _error_text(body: bytes) -> str:
    try:
        obj = json.loads(body)
        if isinstance(obj, dict) and "error" in obj:
            return str(obj["error"])[:500]
    except (ValueError, UnicodeDecodeError):
        pass
    return body[:200].decode("utf-8", "replace")
