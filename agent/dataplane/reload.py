"""``POST /v1/reload``'s body: what to load instead of the running model and bundle, validated before
anything is loaded (a pydantic model for its shape, then the bounds on its values)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from agent.config.settings import path_problem
from agent.errors import ClientError

#: A version a reload may set: it becomes a metric label and a log field (what ``model.version`` allows, bounded).
RELOAD_VERSION = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
#: The longest model or bundle path a reload accepts (Linux's PATH_MAX).
MAX_RELOAD_PATH = 4096


class ReloadRequest(BaseModel):
    """What to reload: each field falls back to the configured model, bundle and version."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model_path: str | None = None
    bundle_path: str | None = None
    version: str | None = None


def parse_reload(body: bytes, allowed_roots: list[Path]) -> ReloadRequest:
    """The reload a body asks for; raises :class:`ClientError` (400 for a malformed body or value, 403 for
    a path outside ``security.allowed_roots``)."""
    if not body.strip():
        return ReloadRequest()
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ClientError("reload body must be JSON", status=400, reason="malformed_json") from None
    if not isinstance(obj, dict) or set(obj) - set(ReloadRequest.model_fields):
        raise ClientError(
            "reload body may hold model_path, bundle_path and version", status=400, reason="malformed_json"
        )
    try:
        req = ReloadRequest.model_validate(obj)
    except ValidationError as exc:
        key = str(exc.errors()[0]["loc"][0])
        raise ClientError(f"reload: {key} must be a string", status=400, reason="malformed_json") from None
    if req.version is not None and not RELOAD_VERSION.fullmatch(req.version):
        raise ClientError(
            f"reload: version must be 1 to 64 characters of A-Z a-z 0-9 . _ - ({len(req.version)} given)",
            status=400,
            reason="reload_request",
        )
    for key, value in (("model_path", req.model_path), ("bundle_path", req.bundle_path)):
        if value is None:
            continue
        if "\0" in value or not value or len(value) > MAX_RELOAD_PATH:
            raise ClientError(
                f"reload: {key} must be a path of 1 to {MAX_RELOAD_PATH} characters without NUL bytes",
                status=400,
                reason="reload_request",
            )
        problem = path_problem(value, allowed_roots)
        if problem:
            raise ClientError(
                f"reload refused, still serving the previous model: {problem}", status=403, reason="forbidden_path"
            )
    return req
