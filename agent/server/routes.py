"""The agent's HTTP routes: Open Inference Protocol V2 (server, model, inference), ``/v1/observe``,
``/v1/estimates``, ``/v1/reload`` and ``/metrics``.

Serve-mode inference is normally answered by :class:`~agent.server.fast_path.InferFastPath` before
FastAPI routes it; the route declared here documents it in OpenAPI and answers it when FastAPI's own
OpenTelemetry is on. Both call :meth:`AgentService.infer`, so the answers are the same.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent import __version__
from agent.config.settings import path_problem
from agent.errors import ClientError, UserError
from agent.judging.request_io import OUTPUT_LABEL, OUTPUT_PROBABILITIES, OUTPUT_VERDICT
from agent.judging.runtime import Runtime
from agent.protocol import v2
from agent.server.admin import require_admin
from agent.server.observe import (
    REQUEST,
    MetadataBounds,
    ObserveItem,
    decode_observation,
    decode_request_event,
    decode_response_event,
    parse_cloudevent,
    size_of,
)
from agent.server.proxy import proxy_metadata
from agent.server.responses import json_response
from agent.server.service import AgentService

#: The server's name and protocol extensions in V2 server metadata (HTTP and gRPC).
SERVER_NAME = "icos-agent"
SERVER_EXTENSIONS = ("binary_tensor_data", "icos_verdict")
#: A version a reload may set: it becomes a metric label and a log field (what ``model.version`` allows, bounded).
RELOAD_VERSION = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
#: The longest model or bundle path a reload accepts (Linux's PATH_MAX).
MAX_RELOAD_PATH = 4096


def check_model(svc: AgentService, name: str, version: str | None) -> Runtime:
    rt = svc.runtime
    if name != rt.name:
        raise ClientError(f"unknown model {name!r}; this agent serves {rt.name!r}", status=404, reason="unknown_model")
    if version is not None and version != rt.version:
        raise ClientError(
            f"unknown version {version!r} of model {name!r}; serving {rt.version!r}", status=404, reason="unknown_model"
        )
    return rt


def model_metadata_of(rt: Runtime) -> dict[str, Any]:
    k = len(rt.classes)
    inputs = [{"name": rt.input_name or "input", "datatype": "FP32", "shape": [-1, *rt.input_shape]}]
    if rt.classifier is not None:
        inputs[0]["datatype"] = v2.datatype_of(np.zeros(0, dtype=rt.classifier.input.dtype))
    for f in sorted(rt.metadata_fields):
        inputs.append({"name": f, "datatype": "BYTES", "shape": [-1]})
    return {
        "name": rt.name,
        "versions": [rt.version],
        "platform": "onnxruntime_onnx" if rt.classifier is not None else f"icos_{rt.mode}",
        "inputs": inputs,
        "outputs": [
            {"name": OUTPUT_PROBABILITIES, "datatype": "FP32", "shape": [-1, k]},
            {"name": OUTPUT_LABEL, "datatype": "INT64", "shape": [-1]},
            {"name": OUTPUT_VERDICT, "datatype": "BYTES", "shape": [-1]},
        ],
        "parameters": {
            "icos_mode": rt.mode,
            "icos_model_sha256": rt.model_sha256,
            "icos_metadata_fields": ",".join(sorted(rt.metadata_fields)),
            "icos_classes": ",".join(rt.classes),
        },
    }


def build_router(svc: AgentService) -> APIRouter:
    r = APIRouter()

    @r.get("/v2", summary="V2 server metadata")
    async def server_metadata() -> Response:
        return json_response({"name": SERVER_NAME, "version": __version__, "extensions": list(SERVER_EXTENSIONS)})

    @r.get("/v2/health/live", summary="V2 liveness")
    async def live() -> Response:
        return json_response({"live": True})

    @r.get("/v2/health/ready", summary="V2 readiness: model and bundle loaded")
    async def ready() -> Response:
        return json_response({"ready": svc.ready}, 200 if svc.ready else 503)

    async def model_metadata(name: str, version: str | None = None) -> Response:
        own = model_metadata_of(check_model(svc, name, version))
        if svc.upstream is None:
            return json_response(own)
        return json_response(proxy_metadata(own, await svc.upstream_info()))

    async def model_ready(name: str, version: str | None = None) -> Response:
        rt = check_model(svc, name, version)
        return json_response({"name": rt.name, "ready": svc.ready}, 200 if svc.ready else 503)

    async def infer(request: Request, name: str, version: str | None = None) -> Response:
        rt = check_model(svc, name, version)
        body = await request.body()
        content, headers = await svc.answer_infer(rt, body, request.headers.get(v2.HEADER_LENGTH))
        return Response(content, headers=headers)

    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        r.add_api_route(prefix, model_metadata, methods=["GET"], summary="V2 model metadata")
        r.add_api_route(prefix + "/ready", model_ready, methods=["GET"], summary="V2 model readiness")
        r.add_api_route(prefix + "/infer", infer, methods=["POST"], summary="V2 inference (JSON or binary tensors)")

    @r.post("/v1/observe", summary="Observe mode: judge predictions made elsewhere (JSON or CloudEvents)")
    async def observe(request: Request) -> Response:
        if svc.settings.mode != "observe":
            raise ClientError(
                f"/v1/observe is only available in observe mode (this agent: {svc.settings.mode})",
                status=404,
                reason="mode",
            )
        body = await request.body()
        rt = svc.runtime
        headers = {k.lower(): v for k, v in request.headers.items()}
        event = parse_cloudevent(headers, body)
        scores_output = svc.settings.upstream.scores_output
        bounds = MetadataBounds.of(svc.settings)
        if event is None:
            item = await svc.run(decode_observation, rt, body, scores_output, bounds)
            svc.enqueue(item)
            await svc.acknowledge(item.id)
            n = int(item.x.shape[0])
            return json_response({"id": item.id, "accepted": n}, 202)
        svc.metrics.observe_events.labels(event.kind).inc()
        if event.kind == REQUEST:
            value = await svc.run(decode_request_event, rt, event.data, bounds)
        else:
            value = await svc.run(decode_response_event, rt, event.data, scores_output)
        try:
            pair = svc.pairer.add(event.id, event.kind, value, time.time(), size_of(value))
        finally:
            svc.count_unmatched()
        if pair is None:
            return json_response({"id": event.id, "paired": False}, 202)
        (x, meta), probs = pair
        if probs.shape[0] != x.shape[0]:
            raise ClientError(
                f"event {event.id}: {x.shape[0]} inputs but {probs.shape[0]} probability vectors",
                status=400,
                reason="shape_mismatch",
            )
        svc.enqueue(ObserveItem(event.id, x, probs, meta, time.time()))
        await svc.acknowledge(event.id)
        n = int(x.shape[0])
        return json_response({"id": event.id, "paired": True, "accepted": n}, 202)

    @r.get("/v1/estimates", summary="Live accuracy estimates per window with 95% intervals")
    async def estimates() -> Response:
        return json_response(await svc.run(svc.estimates))

    @r.post("/v1/reload", summary="Admin: reload model and bundle atomically (bearer token)")
    async def reload(request: Request) -> Response:
        require_admin(request)
        body = await request.body()
        opts: dict[str, Any] = {}
        if body.strip():
            try:
                opts = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                raise ClientError("reload body must be JSON", status=400, reason="malformed_json") from None
            if not isinstance(opts, dict) or set(opts) - {"model_path", "bundle_path", "version"}:
                raise ClientError(
                    "reload body may hold model_path, bundle_path and version", status=400, reason="malformed_json"
                )
        for key in ("model_path", "bundle_path", "version"):
            value = opts.get(key)
            if value is not None and not isinstance(value, str):
                raise ClientError(f"reload: {key} must be a string", status=400, reason="malformed_json")
            if value is None:
                continue
            if key == "version":
                if not RELOAD_VERSION.fullmatch(value):
                    raise ClientError(
                        f"reload: version must be 1 to 64 characters of A-Z a-z 0-9 . _ - ({len(value)} given)",
                        status=400,
                        reason="reload_request",
                    )
                continue
            if "\0" in value or not value or len(value) > MAX_RELOAD_PATH:
                raise ClientError(
                    f"reload: {key} must be a path of 1 to {MAX_RELOAD_PATH} characters without NUL bytes",
                    status=400,
                    reason="reload_request",
                )
            problem = path_problem(value, svc.settings.security.allowed_roots)
            if problem:
                raise ClientError(
                    f"reload refused, still serving the previous model: {problem}", status=403, reason="forbidden_path"
                )
        try:
            rt = await svc.reload(opts.get("model_path"), opts.get("bundle_path"), opts.get("version"))
        except UserError as exc:
            raise ClientError(
                f"reload failed, still serving the previous model: {exc}", status=400, reason="reload"
            ) from None
        return json_response({"reloaded": True, "model": rt.describe()})

    @r.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        data = await svc.run(generate_latest, svc.registry)
        return Response(data, media_type=CONTENT_TYPE_LATEST)

    return r
