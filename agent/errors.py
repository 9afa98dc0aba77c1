"""Errors that are the user's to fix: the CLI prints them as one line, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in arguments, files or configuration, explained in one line."""


def user_error_types() -> tuple[type[BaseException], ...]:
    """Every exception type whose message is meant for the user."""
    from agent.audits.report import AuditError
    from agent.data.files import DataError
    from agent.model.classifier import InvalidInput, ModelLoadError
    from invariants.bundle import BundleError
    from invariants.idi import IdiRuleError
    from invariants.onnx_session import OnnxLoadError

    return (
        UserError,
        AuditError,
        DataError,
        InvalidInput,
        ModelLoadError,
        BundleError,
        IdiRuleError,
        OnnxLoadError,
        FileNotFoundError,
        PermissionError,
        IsADirectoryError,
    )
