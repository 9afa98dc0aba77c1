"""Schemathesis against the running agent's own OpenAPI document (``/openapi.json``).

Every operation the document declares is called with generated path parameters, query strings and
bodies (a bounded number of examples each; the bodies follow the declared schemas of
``agent/server/openapi_bodies.py``, then a hook makes some hostile: lone surrogates in strings, huge
or negative dimensions, repeated list items): the agent never answers 5xx, and every 4xx is a JSON
``{"error": "..."}``. Admin operations stay closed (no ``ICOS_AGENT_ADMIN_TOKEN``): they answer 404.
The same runs against an observe-mode agent, whose ``/v1/observe`` decoder the serve agent refuses.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.agents import Agents
from tests.support.inprocess import RunningServer
from tests.support.settings import mnist_app

EXAMPLES = int(os.environ.get("ICOS_SCHEMATHESIS_EXAMPLES", "20"))
HOSTILE = ["as generated", "lone surrogates", "huge dimensions", "repeated items"]
HUGE_DIMENSIONS = [[10**30, 1], [2**63], [2**31, 2**31], [-1, 784], [1] * 40]


@pytest.fixture(scope="module", params=["serve", "observe"])
def agent(request: pytest.FixtureRequest, module_agents: Agents, mnist_bundle_dir: Path) -> Iterator[RunningServer]:
    old = os.environ.pop("ICOS_AGENT_ADMIN_TOKEN", None)  # read when the app is made
    try:
        yield module_agents.serve(
            mnist_app(mnist_bundle_dir, request.param, server={"max_body_bytes": 256 * 1024, "max_batch": 16})
        )
    finally:
        if old is not None:
            os.environ["ICOS_AGENT_ADMIN_TOKEN"] = old


def make_hostile(body: Any, how: str) -> Any:
    """``body`` with every string given a lone surrogate, every ``shape`` made huge, or every list's
    items repeated (duplicate outputs, inputs, labels)."""
    if how == "as generated":
        return body
    out = copy.deepcopy(body)

    def walk(node: Any, depth: int = 0) -> Any:
        if depth > 20:
            return node
        if isinstance(node, str):
            return node + "\ud800" if how == "lone surrogates" else node
        if isinstance(node, list):
            items = [walk(v, depth + 1) for v in node]
            return items * 3 if how == "repeated items" and items else items
        if isinstance(node, dict):
            result = {k: walk(v, depth + 1) for k, v in node.items()}
            if how == "huge dimensions" and "shape" in result:
                result["shape"] = HUGE_DIMENSIONS[len(str(result)) % len(HUGE_DIMENSIONS)]
            return result
        return node

    return walk(out)


def _operations(url: str) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")

    @schema.hook("flatmap_body")
    def hostile_body(context: Any, body: Any) -> Any:
        return st.sampled_from(HOSTILE).map(lambda how: make_hostile(body, how))

    return [result.ok() for result in schema.get_all_operations()]


def test_hostile_bodies_are_what_they_claim() -> None:
    body = {"id": "r", "inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [0.0]}]}
    assert make_hostile(body, "lone surrogates")["inputs"][0]["name"] == "input\ud800"
    assert make_hostile(body, "huge dimensions")["inputs"][0]["shape"] in HUGE_DIMENSIONS
    assert len(make_hostile(body, "repeated items")["inputs"]) == 3
    assert make_hostile(body, "as generated") == body


def test_every_operation_without_server_errors(agent: RunningServer) -> None:
    operations = _operations(agent.url)
    assert len(operations) >= 10, [f"{op.method} {op.path}" for op in operations]
    with_bodies = [f"{op.method.upper()} {op.path}" for op in operations if op.body]
    assert {"POST /v2/models/{name}/infer", "POST /v1/observe", "POST /v1/labels"} <= set(with_bodies), with_bodies
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
