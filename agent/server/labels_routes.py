"""The delayed-label endpoints of :class:`agent.labels.service.LabelService`: ``POST /v1/labels``,
``GET /v1/labels``, ``GET /v1/labels/requests`` and ``POST /v1/recalibrate`` (admin). What they do is
described there."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from agent.errors import ClientError
from agent.labels.service import LabelService
from agent.server.admin import require_admin
from agent.server.responses import json_response

MAX_LABEL_REQUESTS = 1000  # ids per GET /v1/labels/requests


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
        body = await request.body()
        return json_response(await labels.accept(body))

    @r.get("/v1/labels", summary="Delayed labels: prediction store, calibration in use, last recalibration")
    async def get_labels() -> Response:
        enabled()
        return json_response(await labels.describe())

    @r.get("/v1/labels/requests", summary="The labeling sample: predictions whose true label is wanted, newest first")
    async def label_requests(limit: str = "100") -> Response:
        enabled()
        n = int(limit) if limit.isdigit() and len(limit) <= 6 else 0
        if not 1 <= n <= MAX_LABEL_REQUESTS:
            raise ClientError(
                f"'limit' must be an integer from 1 to {MAX_LABEL_REQUESTS}", status=400, reason="invalid_parameter"
            )
        return json_response(await labels.intake.requests(n))

    @r.post("/v1/recalibrate", summary="Admin: refit the estimator calibration from delayed labels (bearer token)")
    async def recalibrate(request: Request) -> Response:
        require_admin(request)
        enabled()
        return json_response(await labels.recalibrator.recalibrate("manual"))

    return r
