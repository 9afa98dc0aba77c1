"""Credentials out of every URI the agent shows or logs.

Users put secrets in URIs: ``http://user:password@mlflow:5000``, ``postgresql://app:pw@db/icos``,
``https://host/x?token=…``. Whatever leaves the process (an HTTP response, a log line, an MLflow tag, a
metric label) passes through :func:`redact_uri` or :func:`redact_text` first: the user-info part and the
values of credential-like query parameters become ``***``; everything else stays readable.
"""

from __future__ import annotations

import logging
import re

__all__ = ["REDACTED", "RedactingFilter", "redact_text", "redact_uri"]

REDACTED = "***"

#: ``scheme://userinfo@``: the user-info part of a URI (RFC 3986 §3.2.1), wherever it stands in a text
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#@\s\"'<>]+)@")
#: ``?password=…`` / ``&token=…`` and other query parameters that name a credential
_SECRET_PARAM = re.compile(
    r"(?P<key>[?&;](?:[A-Za-z0-9_\-]*?)(?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|"
    r"signature|sig|credential|auth)[A-Za-z0-9_\-]*=)(?P<value>[^&;#\s\"'<>]*)",
    re.IGNORECASE,
)


def redact_text(text: str) -> str:
    """``text`` with the credentials of every URI in it replaced by ``***``."""
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    return _SECRET_PARAM.sub(lambda m: f"{m.group('key')}{REDACTED}" if m.group("value") else m.group(0), text)


def redact_uri(uri: str | None) -> str | None:
    """One URI with its credentials replaced by ``***`` (``None`` stays ``None``)."""
    return None if uri is None else redact_text(uri)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the formatted message of every record passing a logger it is on
    (for loggers whose records may reach handlers other than the agent's JSON one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True
