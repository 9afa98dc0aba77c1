"""Triton's protocol extensions that Triton clients call on any V2 server.

``tritonclient`` and ``perf_analyzer`` ask for the model repository index, a model's configuration and
its statistics. The repository index is cheap to answer (the agent serves one model). The configuration
(Triton's ``config.pbtxt``) and the statistics extension have no meaning here: they are answered 404 with
an error that says so, and are *not* counted in ``icos_invalid_requests_total``: a client probing for an
extension is not sending bad input, and must not trip the ``IcosInvalidRequestsHigh`` alert.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from agent.dataplane.runtimes import RuntimeHolder
from agent.server.responses import error_response, json_response

#: What a client learns when it asks for a Triton-only extension.
NOT_SERVED = "the Triton {what} extension is not served by icos-agent (it speaks the core Open Inference Protocol V2)"


def triton_router(runtimes: RuntimeHolder) -> APIRouter:
    """Routes for the repository index (served) and the configuration and statistics (404, uncounted)."""
    r = APIRouter(tags=["triton extensions"])

    @r.post("/v2/repository/index", summary="Triton repository extension: the one model this agent serves")
    async def repository_index() -> Response:
        rt = runtimes.current
        return json_response([{"name": rt.name, "version": rt.version, "state": "READY", "reason": ""}])

    async def config() -> Response:
        return error_response(404, NOT_SERVED.format(what="model configuration"))

    async def statistics() -> Response:
        return error_response(404, NOT_SERVED.format(what="statistics"))

    for path in ("/v2/models/{name}/config", "/v2/models/{name}/versions/{version}/config"):
        r.add_api_route(path, config, methods=["GET"], include_in_schema=False)
    for path in ("/v2/models/stats", "/v2/models/{name}/stats", "/v2/models/{name}/versions/{version}/stats"):
        r.add_api_route(path, statistics, methods=["GET"], include_in_schema=False)
    return r
