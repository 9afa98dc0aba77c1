"""Proxy mode: forward V2 inference requests to an upstream V2 server and judge its answer.

The upstream is called with :mod:`httpx` (one pooled async client). Each call has ONE deadline,
``upstream.timeout_seconds``, over the whole exchange: waiting for a pooled connection, connecting,
sending, and reading the whole answer; an upstream that dribbles its answer cannot hold a request (or
a pooled connection) past it. The answer is streamed under ``upstream.max_response_bytes`` (its
declared length is checked first), so a huge answer is refused without being buffered.

Failures become :class:`UpstreamError`: unreachable or broken upstream → 502, timeout → 504, too
large → 502. A 4xx from the upstream (the client's mistake) is passed through with the upstream's
message (the first line of its JSON ``error``, sanitised and bounded). A 5xx answer's body is never
passed on (it may be a traceback): the client is told the status, the log gets a bounded excerpt.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import numpy as np

from agent.core import logs
from agent.judging.pipeline import Pipeline
from agent.judging.request_io import (
    OUTPUT_LABEL,
    OUTPUT_PROBABILITIES,
    OUTPUT_VERDICT,
    VERDICT_BYTES,
    attach_metadata,
    new_request_id,
    prediction_ids,
    resolve_outputs,
    split_inputs,
)
from agent.judging.runtime import Runtime
from agent.protocol import v2
from agent.protocol.v2 import ProtocolError
from agent.server.observe import output_probabilities

log = logs.get("proxy")

#: Bytes of an upstream error answer read (for the log, and a 4xx's message); the rest is dropped.
ERROR_BODY_BYTES = 4096
#: Characters of an upstream 4xx message passed to the client.
CLIENT_MESSAGE_CHARS = 200
#: Characters of an upstream error answer written to the log.
LOG_BODY_CHARS = 500
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


class UpstreamError(Exception):
    """The upstream could not answer. ``reason`` is a bounded label for metrics."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class UpstreamClient:
    """One pooled HTTP client for the upstream; :meth:`infer` is bounded in time and memory."""

    def __init__(
        self,
        base_url: str,
        timeout_seconds: float,
        max_connections: int = 64,
        max_response_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.max_response_bytes = max_response_bytes
        # httpx's own timeouts are per operation (each read may take the whole timeout); they stay
        # as a backstop, the deadline over the whole call is the ``asyncio.timeout`` in :meth:`infer`.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_seconds),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def infer(self, model_name: str, body: bytes, headers: dict[str, str]) -> tuple[bytes, str | None]:
        """POST a V2 request; returns the response body and its ``Inference-Header-Content-Length``."""
        url = f"{self.base_url}/v2/models/{model_name}/infer"
        try:
            async with asyncio.timeout(self.timeout_seconds):
                return await self._exchange(url, body, headers)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise UpstreamError(
                504, "timeout", f"upstream {self.base_url} did not answer within {self.timeout_seconds:g} s"
            ) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(
                502, "unreachable", f"upstream {self.base_url} is unreachable: {type(exc).__name__}: {exc}"
            ) from exc

    async def _exchange(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[bytes, str | None]:
        # identity: a compressed answer could expand far past the bytes counted on the wire
        headers = {**headers, "Accept-Encoding": "identity"}
        async with self._client.stream("POST", url, content=body, headers=headers) as resp:
            if resp.status_code >= 400:
                raise _status_error(resp.status_code, await _read_capped(resp, ERROR_BODY_BYTES, truncate=True))
            declared = _declared_length(resp)
            if declared is not None and declared > self.max_response_bytes:
                raise self._too_large(f"it declares {declared} bytes")
            content = await _read_capped(resp, self.max_response_bytes, truncate=False)
            if content is None:
                raise self._too_large("it streamed more")
            return content, resp.headers.get(v2.HEADER_LENGTH)

    def _too_large(self, what: str) -> UpstreamError:
        return UpstreamError(
            502,
            "too_large",
            f"upstream answer is larger than upstream.max_response_bytes ({self.max_response_bytes} bytes): {what}",
        )

    async def aclose(self) -> None:
        await self._client.aclose()


def _declared_length(resp: httpx.Response) -> int | None:
    value = resp.headers.get("content-length")
    if value is None or not value.strip().isdigit():
        return None  # absent or malformed: the streamed count still bounds it
    return int(value)


async def _read_capped(resp: httpx.Response, cap: int, *, truncate: bool) -> bytes | None:
    """At most ``cap`` bytes of the answer, read chunk by chunk: ``None`` past the cap, or (``truncate``)
    the first ``cap`` bytes with the rest left unread."""
    buf = bytearray()
    async for chunk in resp.aiter_bytes():
        if len(buf) + len(chunk) > cap:
            if not truncate:
                return None
            buf += chunk[: cap - len(buf)]
            break
        buf += chunk
    return bytes(buf)


def _status_error(status: int, body: bytes | None) -> UpstreamError:
    """A 4xx passes the upstream's JSON ``error`` (first line, sanitised); a 5xx only its status, the
    body (possibly a traceback) goes to the log, bounded."""
    text = (body or b"").decode("utf-8", "replace")
    if 400 <= status < 500:
        message = _client_message(text)
        detail = f": {message}" if message else ""
        return UpstreamError(status, "client_error", f"upstream rejected the request ({status}){detail}")
    log.warning(
        "upstream answered an error",
        extra={"status": status, "body": _UNPRINTABLE.sub(" ", text[:LOG_BODY_CHARS])},
    )
    return UpstreamError(502, "bad_status", f"upstream answered {status}")


def _client_message(text: str) -> str:
    """The first line of a JSON ``{"error": "..."}``, printable ASCII, bounded; '' for anything else."""
    try:
        obj = json.loads(text)
    except ValueError:
        return ""
    if not isinstance(obj, dict) or not isinstance(obj.get("error"), str):
        return ""
    lines = obj["error"].strip().splitlines()
    first = lines[0] if lines else ""
    if first.startswith("Traceback"):
        return ""
    return _UNPRINTABLE.sub("?", first)[:CLIENT_MESSAGE_CHARS]


def proxy_judge(
    pipeline: Pipeline,
    scores_output: str | None,
    rt: Runtime,
    req: v2.InferRequest,
    split_meta: dict[str, Any] | None,
    x: np.ndarray,
    body: bytes,
    header_length: str | None,
    seconds: float,
) -> tuple[bytes, dict[str, str], str]:
    """Judge the upstream's answer to a forwarded request and answer the client: the outputs it asked
    for (the upstream's and the agent's) with the verdicts; also the request id the answer carries."""
    try:
        resp = v2.decode_response(body, header_length)
    except ProtocolError as exc:
        raise UpstreamError(502, "bad_response", f"upstream answered an unreadable response: {exc}") from None
    try:
        probs = output_probabilities(rt, resp.outputs, scores_output, "upstream response")
    except ProtocolError as exc:
        raise UpstreamError(502, "bad_response", str(exc)) from None
    n = x.shape[0]
    if probs.shape[0] != n:
        raise UpstreamError(502, "bad_response", f"upstream returned {probs.shape[0]} predictions for {n} inputs")
    labels = probs.argmax(axis=1).astype(np.int64)
    rid = req.id or resp.id or new_request_id()
    verdicts = pipeline.judge(rt, rt.features(x), probs, labels, split_meta, seconds, rid)
    upstream_outputs = {t.name: t for t in resp.outputs if t.name != OUTPUT_VERDICT}
    computed = {
        OUTPUT_PROBABILITIES: lambda: v2.tensor(OUTPUT_PROBABILITIES, probs, "FP32"),
        OUTPUT_LABEL: lambda: v2.tensor(OUTPUT_LABEL, labels, "INT64"),
    }
    available = [*upstream_outputs, *[k for k in computed if k not in upstream_outputs], OUTPUT_VERDICT]
    if req.outputs is None:
        wanted = [(name, req.binary_output) for name in [*upstream_outputs, OUTPUT_VERDICT]]
    else:
        wanted = resolve_outputs(req.outputs, available, req.binary_output)
    out = []
    for name, binary in wanted:
        if name == OUTPUT_VERDICT:
            out.append((v2.tensor(OUTPUT_VERDICT, VERDICT_BYTES[verdicts], "BYTES"), binary))
        elif name in upstream_outputs:
            t = upstream_outputs[name]
            out.append((v2.Tensor(t.name, t.datatype, t.shape, t.data), binary))
        else:
            out.append((computed[name](), binary))
    params = {k: v for k, v in resp.parameters.items() if isinstance(v, str | int | float | bool)}
    params["icos_prediction_ids"] = prediction_ids(rid, n)
    content, headers = v2.encode_response(rt.name, rt.version, rid, out, params)
    return content, headers, rid


def proxy_prepare(rt: Runtime, body: bytes, header_length: str | None) -> tuple[Any, ...]:
    """Decode the client's request: ``(request, metadata, model input, body to forward, its headers)``.
    Only the model input is forwarded, in the client's encoding; every output is asked for."""
    req = v2.decode_request(body, header_length, max_elements=rt.max_elements)
    split = split_inputs(rt, req.inputs, req.parameters)
    x = rt.prepare(split.data.data)
    meta = attach_metadata(split, x.shape[0])
    # Forward only the model input, in the client's encoding; ask for every output.
    params = {k: v for k, v in req.parameters.items() if k not in rt.metadata_fields and k != "binary_data_output"}
    if req.used_binary:
        params["binary_data_output"] = True
    fwd_body, fwd_headers = v2.encode_request(
        [split.data], binary=req.used_binary, request_id=req.id, parameters=params
    )
    return req, meta, x, fwd_body, fwd_headers
