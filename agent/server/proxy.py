"""Proxy mode: forward V2 inference requests to an upstream V2 server and judge its answer.

The upstream is called with :mod:`httpx` (one pooled async client) under a bounded timeout.
Failures become :class:`UpstreamError`: unreachable or broken upstream → 502, timeout → 504; a 4xx
from the upstream (the client's mistake) is passed through with the upstream's message.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np

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
) -> tuple[bytes, dict[str, str]]:
    """Judge the upstream's answer to a forwarded request and answer the client: the outputs it asked
    for (the upstream's and the agent's) with the verdicts."""
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
    return v2.encode_response(rt.name, rt.version, rid, out, params)


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
