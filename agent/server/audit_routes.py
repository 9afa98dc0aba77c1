"""The audit endpoints of :class:`agent.server.audit_jobs.AuditJobs`: ``GET /v1/audits`` and
``POST /v1/audits/{kind}`` (admin; ``?wait=true`` answers with the finished result)."""

from __future__ import annotations

import uuid

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import Response

from agent.audits.config import AUDIT_KINDS
from agent.errors import ClientError
from agent.server.admin import require_admin
from agent.server.audit_jobs import AuditJobs
from agent.server.responses import json_response


def audit_router(audits: AuditJobs) -> APIRouter:
    """The routes of ``audits``."""
    r = APIRouter()

    @r.get("/v1/audits", summary="Audits: schedule, last results, history")
    async def list_audits(request: Request) -> Response:
        details = request.query_params.get("details", "true").lower() not in ("0", "false", "no")
        return json_response(audits.describe(details=details))

    @r.post("/v1/audits/{kind}", summary="Admin: run an audit now (bearer token); ?wait=true waits")
    async def run_now(kind: str, request: Request) -> Response:
        require_admin(request)
        if kind not in AUDIT_KINDS:
            raise ClientError(
                f"unknown audit {kind!r}; choose {', '.join(AUDIT_KINDS)}", status=404, reason="unknown_audit"
            )
        if audits.is_running(kind):
            raise ClientError(
                f"a {kind} audit is already running (id {audits.running_id(kind)})", status=409, reason="audit_running"
            )
        wait = request.query_params.get("wait", "false").lower() in ("1", "true", "yes")
        run_id = uuid.uuid4().hex
        if wait:
            outcome = await anyio.to_thread.run_sync(lambda: audits.run_once(kind, "manual", run_id))
            if outcome is None:
                raise ClientError(f"a {kind} audit is already running", status=409, reason="audit_running")
            return json_response(outcome.to_dict(), 200)
        if not audits.submit(kind, run_id):
            raise ClientError("the agent is not running audits (starting or stopping)", status=503, reason="not_ready")
        return json_response({"id": run_id, "kind": kind, "status": "accepted"}, 202)

    return r
