"""The delayed-label endpoints of :class:`agent.labels.service.LabelService`: ``POST /v1/labels``,
``GET /v1/labels``, ``GET /v1/labels/requests`` and ``POST /v1/recalibrate`` (admin). What they do is
described there."""

from __future__ import annotations

import math

from fastapi import APIRouter, Request
from fastapi.responses import Response

from agent.errors import ClientError
from agent.labels.service import LabelService
from agent.server.admin import require_admin, require_labeler
from agent.server.responses import json_response

MAX_LABEL_REQUESTS = 1000  # ids per GET /v1/labels/requests
MAX_SOURCE_LENGTH = 300  # a label source: a token's name or a client's address


def _seconds(name: str, value: str | None) -> float | None:
    """A time query parameter (Unix seconds), or the 400 naming it."""
    if value is None:
        return None
    try:
        t = float(value) if len(value) <= 32 else math.nan
    except ValueError:
        t = math.nan
    if not math.isfinite(t):
        raise ClientError(f"'{name}' must be a time in Unix seconds", status=400, reason="invalid_parameter")
    return t


def labels_router(labels: LabelService) -> APIRouter:
    """The routes of ``labels``; a refused recalibration (409) and an unavailable store (503) are
    answered from :mod:`agent.server.errors`."""
    r = APIRouter()

    def enabled() -> None:
        if not labels.started:
            raise ClientError(
                "delayed labels are disabled (labels.enabled: false)", status=404, reason="labels_disabled"
            )

    @r.post("/v1/labels", summary="Delayed labels: true classes for earlier predictions, by prediction id")
    async def post_labels(request: Request) -> Response:
        enabled()
        source = require_labeler(request)  # an authorized labeler (a token is set) may correct labels
        body = await request.body()
        return json_response(await labels.accept(body, source, correct=request.app.state.agent.labels_gate.enabled))

    @r.delete("/v1/labels", summary="Admin: drop the labels of one source and/or time range (bearer token)")
    async def drop_labels(
        request: Request, source: str | None = None, since: str | None = None, until: str | None = None
    ) -> Response:
        require_admin(request)
        enabled()
        if source is None and since is None and until is None:
            raise ClientError(
                "name what to drop: 'source', and/or the label times 'since' and 'until' (Unix seconds)",
                status=400,
                reason="invalid_parameter",
            )
        if source is not None and not 1 <= len(source) <= MAX_SOURCE_LENGTH:
            raise ClientError(
                f"'source' must have 1 to {MAX_SOURCE_LENGTH} characters", status=400, reason="invalid_parameter"
            )
        return json_response(await labels.drop(source, _seconds("since", since), _seconds("until", until)))

    @r.get("/v1/labels", summary="Delayed labels: prediction store, calibration in use, last recalibration")
    async def get_labels() -> Response:
        enabled()
        return json_response(await labels.describe())

    @r.get(
        "/v1/labels/requests",
        summary="The labeling sample: predictions whose true label is wanted, newest or most worth first",
    )
    async def label_requests(request: Request, limit: str = "100", inputs: str = "false") -> Response:
        enabled()
        require_labeler(request)
        n = int(limit) if limit.isdigit() and len(limit) <= 6 else 0
        if not 1 <= n <= MAX_LABEL_REQUESTS:
            raise ClientError(
                f"'limit' must be an integer from 1 to {MAX_LABEL_REQUESTS}", status=400, reason="invalid_parameter"
            )
        if inputs not in ("true", "false"):
            raise ClientError("'inputs' must be true or false", status=400, reason="invalid_parameter")
        return json_response(await labels.intake.requests(n, inputs=inputs == "true"))

    @r.post("/v1/recalibrate", summary="Admin: refit the estimator calibration from delayed labels (bearer token)")
    async def recalibrate(request: Request) -> Response:
        require_admin(request)
        enabled()
        return json_response(await labels.recalibrator.recalibrate("manual"))

    return r
