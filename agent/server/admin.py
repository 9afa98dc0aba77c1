"""The admin check of the agent's write endpoints (reload, audits, recalibration, dropping labels): a
bearer token (:mod:`agent.server.access`), and, with ``server.admin_port`` set, the port the request
arrived on; and the labelers' check of the labeling endpoints.

With an admin port the admin API answers only there (404 on ``server.port``) and the admin port
answers only the admin API and the health checks (:func:`admin_port_refusal`), so a NetworkPolicy
can admit the admin API's callers alone, and inference traffic never reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fastapi import Request

from agent.errors import ClientError

if TYPE_CHECKING:
    from agent.server.composition import Agent

#: Paths the admin port answers besides the admin API: the probes, so a kubelet can check it too.
HEALTH_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
#: The admin API: exact paths and path prefixes (``POST /v1/audits/{kind}``).
ADMIN_PATHS = frozenset({"/v1/reload", "/v1/recalibrate"})
ADMIN_PREFIXES = ("/v1/audits/",)
#: Admin routes on a path that is not the admin API's otherwise (``DELETE /v1/labels``).
ADMIN_METHODS = frozenset({("DELETE", "/v1/labels")})


def arrival_port(scope: Mapping[str, Any]) -> int | None:
    """The local port a request arrived on (``scope["server"]``), or ``None`` when unknown."""
    server = scope.get("server")
    if isinstance(server, tuple | list) and len(server) == 2 and isinstance(server[1], int):
        return server[1]
    return None


def is_admin_path(path: str, method: str = "POST") -> bool:
    return path in ADMIN_PATHS or path.startswith(ADMIN_PREFIXES) or (method, path) in ADMIN_METHODS


def admin_port_refusal(scope: Mapping[str, Any], admin_port: int | None) -> str | None:
    """Why a request that arrived on the admin port is not answered there; ``None`` to answer it."""
    if admin_port is None or scope.get("type") != "http" or arrival_port(scope) != admin_port:
        return None
    path = scope.get("path", "")
    if is_admin_path(path, scope.get("method", "")) or path in HEALTH_PATHS:
        return None
    return "server.admin_port answers only the admin API and the health checks; use server.port"


def require_admin(request: Request) -> None:
    """FastAPI dependency: a valid ``Authorization: Bearer <ICOS_AGENT_ADMIN_TOKEN>`` header, on the
    admin port when ``server.admin_port`` is set."""
    svc: Agent = request.app.state.agent
    admin_port = svc.settings.server.admin_port
    if admin_port is not None and arrival_port(request.scope) != admin_port:
        raise ClientError(
            f"the admin API is served on its own port (server.admin_port {admin_port})",
            status=404,
            reason="admin_port",
        )
    if not svc.admin_gate.enabled:
        raise ClientError(
            "admin endpoints are disabled: set ICOS_AGENT_ADMIN_TOKEN to enable", status=404, reason="admin_disabled"
        )
    svc.admin_gate.check(request.headers.get("authorization", ""), client_of(request))


def client_of(request: Request) -> str:
    """The address a request came from (what the token throttle counts failures by)."""
    return request.client.host if request.client is not None else "unknown"


def require_labeler(request: Request) -> str:
    """The source of a request to the labeling endpoints: the token it carries (``labels`` or
    ``admin``) when ``ICOS_AGENT_LABELS_TOKEN`` is set (401/403/429 otherwise); without that token the
    endpoints are open and the source is the client's address."""
    svc: Agent = request.app.state.agent
    client = client_of(request)
    if not svc.labels_gate.enabled:
        return f"client:{client}"
    return svc.labels_gate.check(request.headers.get("authorization", ""), client)
