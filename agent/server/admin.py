"""The admin check of the agent's write endpoints (reload, audits, recalibration): a bearer token."""

from __future__ import annotations

import hmac

from fastapi import Request

from agent.errors import ClientError
from agent.server.service import AgentService


def require_admin(request: Request) -> None:
    """FastAPI dependency: a valid ``Authorization: Bearer <ICOS_AGENT_ADMIN_TOKEN>`` header."""
    svc: AgentService = request.app.state.agent
    if svc.admin_token is None:
        raise ClientError(
            "admin endpoints are disabled: set ICOS_AGENT_ADMIN_TOKEN to enable", status=404, reason="admin_disabled"
        )
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise ClientError("missing bearer token (Authorization: Bearer <token>)", status=401, reason="unauthorized")
    if not hmac.compare_digest(token.strip().encode(), svc.admin_token.encode()):
        raise ClientError("invalid bearer token", status=403, reason="forbidden")
