"""Credentials never leave the process: URIs are redacted in what the agent shows and in every log line."""

from __future__ import annotations

import json
import logging

import pytest

from agent.core.logs import JsonFormatter
from exporters.redaction import redact_text, redact_uri


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("http://user:password@mlflow:5000", "http://***@mlflow:5000"),
        ("https://ghp_t0ken@example.org/x", "https://***@example.org/x"),
        ("postgresql://app:s3cr%40t@db:5432/icos?sslmode=require", "postgresql://***@db:5432/icos?sslmode=require"),
        (
            "postgresql://db/icos?user=app&password=pw&sslmode=require",
            "postgresql://db/icos?user=app&password=***&sslmode=require",
        ),
        ("https://h/x?X-Amz-Signature=abc&X-Amz-Credential=k", "https://h/x?X-Amz-Signature=***&X-Amz-Credential=***"),
        ("http://mlflow:5000", "http://mlflow:5000"),
        ("sqlite:////var/lib/icos-agent/mlflow.db", "sqlite:////var/lib/icos-agent/mlflow.db"),
        ("models:/mnist@prod", "models:/mnist@prod"),
    ],
)
def test_redact_uri(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown
    assert "password" not in (redact_uri(uri) or "").replace("password=***", "")


def test_redact_text_finds_uris_inside_messages() -> None:
    text = "MLflow at http://u:p4ss@mlflow:5000 unreachable; upstream https://k@m/v2 too"
    assert redact_text(text) == "MLflow at http://***@mlflow:5000 unreachable; upstream https://***@m/v2 too"
    assert redact_uri(None) is None


def test_log_lines_never_carry_credentials() -> None:
    record = logging.makeLogRecord(
        {"name": "icos_agent", "levelname": "WARNING", "msg": "cannot reach %s", "args": ("http://u:pw@mlflow:5000",)}
    )
    record.tracking_uri = "http://u:pw@mlflow:5000"
    try:
        raise ConnectionError("http://u:pw@mlflow:5000 refused")
    except ConnectionError:
        import sys

        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "pw@" not in line and ":pw" not in line
    out = json.loads(line)
    assert out["msg"] == "cannot reach http://***@mlflow:5000"
    assert out["tracking_uri"] == "http://***@mlflow:5000"


def test_json_lines_carry_no_terminal_escapes() -> None:
    """uvicorn's ``color_message`` is dropped; escapes in the message or a field are removed."""
    record = logging.makeLogRecord(
        {
            "name": "uvicorn.error",
            "levelno": logging.INFO,
            "levelname": "INFO",
            "msg": "Started server process [%d] \x1b[1mbold\x1b[0m",
            "args": (42,),
            "color_message": "Started server process [\x1b[36m%d\x1b[0m]",
            "path": "/v2/models/\x1b[31mred\x1b]0;title\x07",
        }
    )
    line = JsonFormatter().format(record)
    assert "\x1b" not in line and "\\u001b" not in line
    out = json.loads(line)
    assert "color_message" not in out
    assert out["msg"] == "Started server process [42] bold"
    assert out["path"].startswith("/v2/models/red")
