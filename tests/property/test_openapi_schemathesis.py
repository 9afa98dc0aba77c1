"""Schemathesis against the running agent's own OpenAPI document (``/openapi.json``).

Every operation the document declares is called with generated path parameters, query strings and
bodies (a bounded number of examples each): the agent never answers 5xx, and every 4xx is a JSON
``{"error": "..."}``. Admin operations stay closed (no ``ICOS_AGENT_ADMIN_TOKEN``): they answer 404.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import RunningServer, start_server
from prometheus_client import CollectorRegistry

from agent.config.settings import load_settings
from agent.model.classifier import default_model_path
from agent.server.app import create_app

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install schemathesis)")
from hypothesis import HealthCheck, given, settings  # noqa: E402

EXAMPLES = int(os.environ.get("ICOS_SCHEMATHESIS_EXAMPLES", "20"))


@pytest.fixture(scope="module")
def agent(mnist_bundle_dir: Path) -> Iterator[RunningServer]:
    old = os.environ.pop("ICOS_AGENT_ADMIN_TOKEN", None)
    s = load_settings(
        None,
        model={"name": "mnist", "path": str(default_model_path())},
        bundle={"path": str(mnist_bundle_dir)},
        server={"max_body_bytes": 256 * 1024, "max_batch": 16},
    )
    srv = start_server(create_app(s, CollectorRegistry()))
    yield srv
    srv.stop()
    if old is not None:
        os.environ["ICOS_AGENT_ADMIN_TOKEN"] = old


def _operations(url: str) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def test_every_operation_without_server_errors(agent: RunningServer) -> None:
    operations = _operations(agent.url)
    assert len(operations) >= 10, [f"{op.method} {op.path}" for op in operations]
    called: list[str] = []
    for op in operations:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=bool(os.environ.get("CI")),
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy())
        def run(case: Any) -> None:
            response = case.call(base_url=agent.url, timeout=30)
            where = f"{case.method} {case.formatted_path}"
            assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:300]}"
            if response.status_code >= 400:
                assert isinstance(response.json().get("error"), str), f"{where}: {response.text[:300]}"
            called.append(where)

        run()
    assert len(called) >= len(operations)
