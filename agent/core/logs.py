"""JSON structured logs: one JSON object per line on stderr (also for uvicorn's loggers).

Every line passes :func:`exporters.redaction.redact_text`, so a credential in a URI (a tracking URI, an
upstream, a database URL) never reaches the logs, whichever code logged it. No terminal escape reaches
them either: uvicorn's ``color_message`` (its message with ANSI colours) is dropped, and escape
sequences in any other value (a client's path, a file name) are removed, so a log line is plain text
for every log collector and terminal.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

from exporters.redaction import redact_text

#: Record attributes that are not fields of the line; ``color_message``: uvicorn's message with ANSI colours.
_RESERVED = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "color_message"}
#: ANSI/VT escape sequences (CSI such as colours, and two-character escapes), then any ESC left.
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])?")


def _plain(text: str) -> str:
    """``text`` without terminal escape sequences, credentials redacted."""
    return redact_text(_ESCAPES.sub("", text) if "\x1b" in text else text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _plain(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                if isinstance(value, int | float | bool | type(None)):
                    out[key] = value
                else:
                    out[key] = _plain(str(value))
        if record.exc_info:
            out["exc"] = _plain(self.formatException(record.exc_info))
        return json.dumps(out)


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for uvicorn and ``icos_agent`` loggers, all in JSON."""
    lvl = level.upper()
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "agent.core.logs.JsonFormatter"}},
        "handlers": {"default": handler},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": lvl, "propagate": False},
            "uvicorn.error": {"handlers": ["default"], "level": lvl, "propagate": False},
            "uvicorn.access": {"handlers": ["default"], "level": lvl, "propagate": False},
            "icos_agent": {"handlers": ["default"], "level": lvl, "propagate": False},
        },
    }


def setup(level: str = "info") -> None:
    """Configure the ``icos_agent`` logger for JSON output (used outside uvicorn too)."""
    logger = logging.getLogger("icos_agent")
    if not any(isinstance(h.formatter, JsonFormatter) for h in logger.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(JsonFormatter())
        logger.addHandler(h)
    logger.setLevel(level.upper())
    logger.propagate = False


def get(name: str = "") -> logging.Logger:
    return logging.getLogger("icos_agent" + (f".{name}" if name else ""))
