"""The agent's error types that carry a message for a person.

* :class:`UserError` — a mistake in arguments, files or configuration: the CLI prints it as one
  line (exit 2), never a traceback.
* :class:`ClientError` — a request the client must fix: it also carries the HTTP ``status`` to answer
  and the bounded ``reason`` counted in ``icos_invalid_requests_total``. Subclasses declare theirs as
  class attributes (e.g. :class:`agent.protocol.v2.ProtocolError`); an instance may override them.

This module sits at the bottom of the agent's layers: it imports only the ``invariants`` library, so
that :func:`user_error_types` needs no lazy import.
"""

from __future__ import annotations

from collections.abc import Mapping

from invariants.bundle import BundleError
from invariants.idi import IdiRuleError
from invariants.onnx_session import OnnxLoadError


class UserError(Exception):
    """A mistake in arguments, files or configuration, explained in one line."""


class ClientError(UserError):
    """A request the client must fix: answered with ``status`` and counted under ``reason``."""

    status: int = 400
    reason: str = "invalid"
    #: Extra response headers, e.g. ``Retry-After`` of a 429.
    headers: Mapping[str, str] | None = None

    def __init__(
        self,
        message: str = "",
        *,
        status: int | None = None,
        reason: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        if reason is not None:
            self.reason = reason
        if headers is not None:
            self.headers = headers


def user_error_types() -> tuple[type[BaseException], ...]:
    """Every exception type whose message is meant for the user (the agent's own derive from
    :class:`UserError`; the ``invariants`` library and the OS have theirs)."""
    return (
        UserError,
        BundleError,
        IdiRuleError,
        OnnxLoadError,
        FileNotFoundError,
        PermissionError,
        IsADirectoryError,
    )
