"""The agent's HTTP routes: Open Inference Protocol V2 (server, model, inference), ``/v1/observe``,
``/v1/estimates``, ``/v1/reload`` and ``/metrics``. Each handler reads its request and hands it to
the part that does the work.

Inference is normally answered by :class:`~agent.server.fast_path.InferFastPath` before FastAPI routes
it; the route declared here documents it in OpenAPI and answers it when FastAPI's own OpenTelemetry is
on. Both call :func:`agent.server.http_infer.answer_http`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent.dataplane.metadata import server_metadata
from agent.dataplane.reload import parse_reload
from agent.errors import ClientError
from agent.protocol import v2
from agent.server.admin import require_admin
from agent.server.composition import Agent
from agent.server.http_infer import answer_http
from agent.server.responses import json_response

ESTIMATES_DOC = """Per window (`windows`: the time windows such as `5m`, `1h`, and the count window `last<N>`):

* `n`: predictions judged in the window; `fails`, `fails_by_family`: those the oracle failed, by invariant;
  `n_labels`: labeled predictions of the labeling sample among them (time windows).
* `headline`: the estimate to read first (`estimator` names which: the bundle's headline, `shift_aware` unless
  it says otherwise), with `value`, `lower`, `upper` (a 95% interval, widened where the flag is raised) and
  `flag_raised` (the flag "this number may be wrong"); where raised, `may_be_wrong` (why, in one sentence)
  and `own_interval` (the interval before widening). `calibrated` (not `flag_raised`) is deprecated and
  removed in 0.2.0.
* `estimates`: every estimator's `value`, `lower`, `upper` and `n`; an estimate marked `unreliable` (with the
  reason: an interval wider than 0.5, or an oracle that separates right from wrong predictions poorly) says
  too little to be read as a number. `with_labels` appears once sampled predictions have labels (`n_labels`),
  with `weighted` (each label weighted by the inverse of its draw probability, under active sampling) and
  `predictor`: `calibrated` (the bundle's per-prediction probability of being correct) or `confidence` (the
  top-class probability: bundles fitted before the calibrated predictor, or unweighted labels).
* `flag`: is the number right. `raised`: the flag "this number may be wrong" is raised; `reasons`: the
  evidence, largest first (`outside_calibrated_range`, `confidence_shifted`, `oracle_verdicts_shifted`,
  `inputs_unlike_reference`, `estimators_disagree`, `estimated_drop_large`, `small_window`; and, the flag
  down or not, `class_mix_changed`: a change of class mix alone, where confidence-based estimates hold, and
  `few_calibration_errors`); `probability`: that the headline is off by more than `tolerance`; `class_mix`:
  the class-adjusted test (`changed`, `only`, `class_z`, `residual_z`); and how far the window lies from the
  data `shift_aware` was calibrated on: `distance` (above 1 outside them), `in_calibrated_range`, `drift` and
  `weight` (the share of `shift_aware`'s learnt correction used). `basis` is `flag`, or `trust_distance` for
  bundles fitted before the flag (`raised` is then the distance alone, and `note` says so).
* `trust` (deprecated, removed in 0.2.0): the `flag` section under its former name, with `calibrated` (not
  `raised`) for `raised`.
* `classes.estimated`: label-free precision, recall and F1 per class (CBPE: the expected figures if the
  model's probabilities are calibrated), macro and weighted.
* `realized`: from delayed labels, the accuracy of the labeled predictions of the window and how far each
  estimator was from it; `none_of_the_classes`: the labels `__none__` among them (counted as wrong).
"""


def build_router(agent: Agent) -> APIRouter:
    r = APIRouter()
    plane, runtimes = agent.plane, agent.runtimes

    @r.get("/v2", summary="V2 server metadata")
    async def v2_server_metadata() -> Response:
        return json_response(server_metadata())

    @r.get("/v2/health/live", summary="V2 liveness")
    async def live() -> Response:
        return json_response({"live": True})

    @r.get("/v2/health/ready", summary="V2 readiness: started, and (proxy mode) the upstream's model ready")
    async def ready() -> Response:
        return _readiness(agent, {})

    async def model_metadata(name: str, version: str | None = None) -> Response:
        return json_response(await plane.model_metadata(name, version))

    async def model_ready(name: str, version: str | None = None) -> Response:
        rt = runtimes.resolve(name, version)
        return _readiness(agent, {"name": rt.name})

    async def infer(request: Request, name: str, version: str | None = None) -> Response:
        body = await request.body()
        content, headers = await answer_http(plane, body, request.headers.get(v2.HEADER_LENGTH), name, version)
        return Response(content, headers=headers)

    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        r.add_api_route(prefix, model_metadata, methods=["GET"], summary="V2 model metadata")
        r.add_api_route(prefix + "/ready", model_ready, methods=["GET"], summary="V2 model readiness")
        r.add_api_route(prefix + "/infer", infer, methods=["POST"], summary="V2 inference (JSON or binary tensors)")

    @r.post("/v1/observe", summary="Observe mode: judge predictions made elsewhere (JSON or CloudEvents)")
    async def observe(request: Request) -> Response:
        if agent.observe is None:
            raise ClientError(
                f"/v1/observe is only available in observe mode (this agent: {agent.settings.mode})",
                status=404,
                reason="mode",
            )
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        return json_response(await agent.observe.observe(headers, body), 202)

    @r.get("/v1/estimates", summary="Live accuracy estimates per window with 95% intervals", description=ESTIMATES_DOC)
    async def estimates() -> Response:
        return json_response(await agent.run(agent.estimates))

    @r.post("/v1/reload", summary="Admin: reload model and bundle atomically (bearer token)")
    async def reload(request: Request) -> Response:
        require_admin(request)
        req = parse_reload(await request.body(), agent.settings.security.allowed_roots)
        rt = await runtimes.reload(req.model_path, req.bundle_path, req.version)
        return json_response({"reloaded": True, "model": rt.describe()})

    @r.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        data = await agent.run(generate_latest, agent.registry)
        return Response(data, media_type=CONTENT_TYPE_LATEST)

    return r


def _readiness(agent: Agent, doc: dict[str, object]) -> Response:
    """200 ``{"ready": true}`` when the agent can answer inference, else 503 with the reason."""
    reason = agent.not_ready()
    if reason is None:
        return json_response({**doc, "ready": True})
    return json_response({**doc, "ready": False, "reason": reason}, 503)
