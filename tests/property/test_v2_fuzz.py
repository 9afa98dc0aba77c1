"""Property-based fuzzing of the request decoders against a running agent (real uvicorn, loopback).

Whatever the body — JSON or binary V2 inference requests, observe bodies and CloudEvents, delayed
labels — the agent answers below 500; a rejection is a 4xx JSON ``{"error": "..."}`` counted once in
``icos_invalid_requests_total{reason}``, and nothing rejected reaches the estimators.

Hypothesis runs derandomized in CI (``CI`` set) so a run is reproducible; locally it explores anew.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.server.composition import Agent
from tests.support import v2
from tests.support.inprocess import RunningServer, start_server
from tests.support.metrics import Scrape
from tests.support.settings import mnist_app
from tests.support.v2 import REQUEST_TYPE, RESPONSE_TYPE, ce_headers
from tests.support.waiting import await_on_loop

FUZZ = settings(
    max_examples=int(os.environ.get("ICOS_FUZZ_EXAMPLES", "120")),
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
INFER = "/v2/models/mnist/infer"
DATATYPES = ["BOOL", "UINT8", "INT8", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64", "BYTES"]
NAMES = ["input", "form", "x", "probabilities", ""]

# -- strategies -------------------------------------------------------------------------------------
#: text that no UTF-8 encoder takes (lone surrogates) beside ordinary and astral characters
odd_text = st.lists(st.sampled_from(["\ud800", "\udfff", "\udc00a", "a", "\U0001f600", "\x00"]), max_size=4).map(
    "".join
)
scalars = st.one_of(
    odd_text,
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e300, -1e300, 255.0, 0.5]),
    st.text(max_size=8),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.sampled_from(["a", "form", "name", "data"]), inner, max_size=4)
    ),
    max_leaves=20,
)
dims = st.integers(min_value=-2, max_value=40) | st.sampled_from([784, 10**6, 2**31, 2**40, 2**63, 10**30])
shapes = st.one_of(
    st.lists(dims, max_size=4),
    st.sampled_from([[1, 1, 28, 28], [1, 784], [2, 784], [784], [0, 784], [0, 10**30], [10**30, 0], [1] * 40]),
    json_values,
)


@st.composite
def tensor_data(draw: st.DrawFn, shape: Any) -> Any:
    """Data that fits the shape often (so decoding goes deep), random otherwise."""
    if isinstance(shape, list) and all(isinstance(d, int) and 0 <= d <= 2000 for d in shape):
        n = int(np.prod(shape)) if shape else 1
        if n <= 2000 and draw(st.booleans()):
            kind = draw(st.sampled_from(["zeros", "pixels", "strings", "nested", "bad"]))
            if kind == "zeros":
                return [0.0] * n
            if kind == "pixels":
                return draw(st.lists(st.floats(0, 255, width=32), min_size=n, max_size=n))
            if kind == "strings":
                return draw(st.lists(st.text(max_size=3), min_size=n, max_size=n))
            if kind == "nested":
                return np.zeros(shape).tolist()
            return [0.0] * n + [draw(scalars)]
    return draw(json_values)


@st.composite
def v2_tensor(draw: st.DrawFn) -> dict[str, Any]:
    t: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        t["name"] = draw(st.sampled_from(NAMES) | st.text(max_size=5) | odd_text)
    if draw(st.integers(0, 9)):
        t["datatype"] = draw(st.sampled_from(DATATYPES) | st.text(max_size=5))
    shape = draw(shapes)
    if draw(st.integers(0, 9)):
        t["shape"] = shape
    if draw(st.integers(0, 9)):
        t["data"] = draw(tensor_data(shape))
    if draw(st.integers(0, 4)) == 0:
        t["parameters"] = draw(json_values)
    return t


@st.composite
def v2_request(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 19)) == 0:
        return draw(json_values)
    body: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        body["inputs"] = draw(st.lists(v2_tensor(), max_size=3) | json_values)
    if draw(st.booleans()):
        body["outputs"] = draw(
            st.lists(
                st.fixed_dictionaries({"name": st.sampled_from(["label", "icos_verdict", "probabilities", "logits"])}),
                max_size=6,  # repeated names: each output is answered once, or the request is refused
            )
            | json_values
        )
    if draw(st.booleans()):
        body["parameters"] = draw(
            st.dictionaries(st.sampled_from(["form", "binary_data_output", "x"]), json_values, max_size=3) | json_values
        )
    if draw(st.integers(0, 4)) == 0:
        body["id"] = draw(json_values | odd_text)
    return body


@st.composite
def binary_request(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body: JSON header with ``binary_data_size`` tensors, then payload bytes."""
    tensors = []
    payload = b""
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(["input", "form", "other"]))
        dtype = draw(st.sampled_from(DATATYPES))
        shape = draw(
            st.sampled_from([[1, 1, 28, 28], [1, 784], [1], [2], [10**10], [3, 0]]) | st.lists(dims, max_size=3)
        )
        if dtype == "BYTES":
            items = draw(st.lists(st.binary(max_size=6), max_size=3))
            chunk = b"".join(struct.pack("<I", len(i)) + i for i in items)
        elif draw(st.booleans()) and shape in ([1, 1, 28, 28], [1, 784]):
            chunk = np.zeros(784, dtype=np.float32).tobytes()
        else:
            chunk = draw(st.binary(max_size=64))
        size = draw(st.sampled_from([len(chunk), len(chunk) + 1, max(0, len(chunk) - 1), -1]) | st.integers(0, 10**9))
        tensors.append({"name": name, "datatype": dtype, "shape": shape, "parameters": {"binary_data_size": size}})
        payload += chunk
    head = json.dumps({"inputs": tensors}).encode()
    if draw(st.booleans()):
        payload += draw(st.binary(max_size=8))
    length: Any = draw(st.sampled_from([len(head), len(head) - 3, len(head) + 2, 0, -5, "12x", 10**12]))
    return head + payload, {"Inference-Header-Content-Length": str(length), "Content-Type": "application/octet-stream"}


@st.composite
def observation(draw: st.DrawFn) -> Any:
    body: dict[str, Any] = {}
    n = draw(st.integers(0, 3))
    if draw(st.integers(0, 9)):
        body["inputs"] = draw(
            st.sampled_from([np.zeros((n, 784)).tolist(), np.zeros((n, 1, 28, 28)).tolist(), [[0.0] * 5]])
            | st.lists(v2_tensor(), max_size=2)
            | json_values
        )
    if draw(st.integers(0, 9)):
        p = np.full((n, 10), 0.1).tolist()
        body["probabilities"] = draw(st.sampled_from([p, [[1.0] * 10] * n, [[0.5, 0.5]]]) | json_values)
    if draw(st.integers(0, 3)) == 0:
        body["outputs"] = draw(st.lists(v2_tensor(), max_size=2) | json_values)
    if draw(st.booleans()):
        body["metadata"] = draw(st.dictionaries(st.sampled_from(["form", "x"]), json_values, max_size=2) | json_values)
    if draw(st.integers(0, 4)) == 0:
        body["id"] = draw(json_values | odd_text)
    return body


# -- fixtures -----------------------------------------------------------------------------------------
def _app(bundle: Path, mode: str) -> Any:
    return mnist_app(
        bundle,
        mode,
        server={"max_body_bytes": 256 * 1024, "max_batch": 16, "max_tensor_elements": 100_000},
        observe={"event_ttl_seconds": 600},
    )


@pytest.fixture(scope="module")
def serve_agent(mnist_bundle_dir: Path) -> Iterator[RunningServer]:
    srv = start_server(_app(mnist_bundle_dir, "serve"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def observe_agent(mnist_bundle_dir: Path) -> Iterator[RunningServer]:
    srv = start_server(_app(mnist_bundle_dir, "observe"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(serve_agent: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def observe_http(observe_agent: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as c:
        yield c


def invalid_total(srv: RunningServer) -> dict[str, float]:
    svc: Agent = srv.app.state.agent
    return Scrape.of_registry(svc.registry).by_label("icos_invalid_requests_total", "reason")


def judged(srv: RunningServer) -> int:
    svc: Agent = srv.app.state.agent
    svc.judge_queue.flush()
    return int(svc.windows.total)


def observe_settled(srv: RunningServer) -> int:
    """Predictions the observe-mode agent has judged, once everything it accepted is judged: its
    queue joined (a worker marks an item done after recording it)."""
    svc: Agent = srv.app.state.agent
    assert svc.loop is not None and svc.observe is not None
    await_on_loop(svc.loop, svc.observe.queue.join())
    return int(svc.windows.total)


def check_answer(srv: RunningServer, r: httpx.Response, before: dict[str, float], judged_before: int) -> None:
    """The contract of every answer: < 500; a 4xx is a counted JSON error and leaves the estimators alone."""
    assert r.status_code < 500, r.text[:500]
    after = invalid_total(srv)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err, str) and err
        grew = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        assert list(grew.values()) == [1], (r.status_code, err, grew)
        assert judged(srv) == judged_before, err
    else:
        assert after == before


# -- properties ---------------------------------------------------------------------------------------
@FUZZ
@given(body=v2_request())
def test_json_infer_bodies(serve_agent: RunningServer, http: httpx.Client, body: Any) -> None:
    before, n = invalid_total(serve_agent), judged(serve_agent)
    r = http.post(
        serve_agent.url + INFER, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    check_answer(serve_agent, r, before, n)


@FUZZ
@given(raw=st.binary(max_size=300) | st.sampled_from([b"[" * 50_000, b'{"inputs": ' + b"[" * 5000]))
def test_raw_bytes_infer_bodies(serve_agent: RunningServer, http: httpx.Client, raw: bytes) -> None:
    before, n = invalid_total(serve_agent), judged(serve_agent)
    check_answer(serve_agent, http.post(serve_agent.url + INFER, content=raw), before, n)


@FUZZ
@given(req=binary_request())
def test_binary_infer_bodies(serve_agent: RunningServer, http: httpx.Client, req: tuple[bytes, dict[str, str]]) -> None:
    before, n = invalid_total(serve_agent), judged(serve_agent)
    body, headers = req
    check_answer(serve_agent, http.post(serve_agent.url + INFER, content=body, headers=headers), before, n)


def test_known_decoder_traps(serve_agent: RunningServer, http: httpx.Client) -> None:
    """Cases that once reached a 5xx: huge declared BYTES counts, deep nesting, huge shapes."""
    head = {"inputs": [{"name": "form", "datatype": "BYTES", "shape": [10**4], "parameters": {"binary_data_size": 0}}]}
    text = json.dumps(head).encode()
    bodies = [
        (text, {"Inference-Header-Content-Length": str(len(text))}, "binary_data"),
        (b"[" * 300_000, {}, "too_large"),  # over max_body_bytes
        (b"[" * 50_000, {}, "malformed_json"),
        (
            json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [2**40], "data": [0]}]}).encode(),
            {},
            "too_large",
        ),
    ]
    for body, headers, reason in bodies:
        before, n = invalid_total(serve_agent), judged(serve_agent)
        r = http.post(serve_agent.url + INFER, content=body, headers=headers)
        check_answer(serve_agent, r, before, n)
        assert invalid_total(serve_agent)[reason] == before.get(reason, 0) + 1, r.text


@FUZZ
@given(
    body=observation(),
    ce=st.sampled_from(["none", "request", "response", "structured", "bad"]),
    ce_id=st.integers(0, 3),
)
def test_observe_bodies(
    observe_agent: RunningServer, observe_http: httpx.Client, body: Any, ce: str, ce_id: int
) -> None:
    headers = {"Content-Type": "application/json"}
    content = json.dumps(body).encode()
    if ce in ("request", "response", "bad"):
        kind = {"request": REQUEST_TYPE, "response": RESPONSE_TYPE}
        headers.update({"ce-id": str(ce_id), "ce-type": kind.get(ce, "something.else"), "ce-specversion": "1.0"})
    elif ce == "structured":
        headers["Content-Type"] = "application/cloudevents+json"
        content = json.dumps({"id": str(ce_id), "type": REQUEST_TYPE, "data": body}).encode()
    before, judged_before = invalid_total(observe_agent), observe_settled(observe_agent)
    r = observe_http.post(observe_agent.url + "/v1/observe", content=content, headers=headers)
    assert r.status_code < 500, r.text[:500]
    accepted = 0
    if r.status_code >= 400:
        assert isinstance(r.json()["error"], str)
        after = invalid_total(observe_agent)
        assert sum(after.values()) - sum(before.values()) == 1
    else:
        accepted = int(r.json().get("accepted", 0))
    # exactly the predictions this answer accepted are judged (none of a refused body)
    assert observe_settled(observe_agent) == judged_before + accepted


def test_observe_judged_only_what_was_accepted(observe_agent: RunningServer, observe_http: httpx.Client) -> None:
    """The windows grow by exactly the predictions the answers accepted: a refused body adds none, an
    event waiting for its pair none until the pair arrives."""
    before = observe_settled(observe_agent)
    url = observe_agent.url + "/v1/observe"
    x, p = np.zeros((3, 784), np.float32), np.full((3, 10), 0.1, np.float32)
    answers = [
        observe_http.post(url, json={"inputs": x.tolist(), "probabilities": p.tolist()}),
        observe_http.post(url, json={"inputs": x[:2].tolist(), "probabilities": p.tolist()}),  # 2 inputs, 3 vectors
        observe_http.post(url, content=v2.v2_request(x[:2]), headers=ce_headers("order-1", REQUEST_TYPE)),
        observe_http.post(url, content=v2.v2_request(x[:1]), headers=ce_headers("order-2", REQUEST_TYPE)),  # unpaired
        observe_http.post(url, content=v2.v2_response(np.log(p[:2])), headers=ce_headers("order-1", RESPONSE_TYPE)),
    ]
    assert [r.status_code for r in answers] == [202, 400, 202, 202, 202], [r.text for r in answers]
    accepted = sum(int(r.json().get("accepted", 0)) for r in answers if r.status_code == 202)
    assert accepted == 3 + 2
    assert observe_settled(observe_agent) == before + accepted


@FUZZ
@given(
    body=json_values
    | st.fixed_dictionaries({"labels": json_values})
    | st.fixed_dictionaries({"prediction_id": json_values, "label": json_values})
)
def test_label_bodies(serve_agent: RunningServer, http: httpx.Client, body: Any) -> None:
    paths = http.get(serve_agent.url + "/openapi.json").json()["paths"]
    label_paths = sorted(p for p, ops in paths.items() if p.startswith("/v1/labels") and "post" in ops and "{" not in p)
    assert label_paths, "the agent has a POST /v1/labels endpoint"
    before, n = invalid_total(serve_agent), judged(serve_agent)
    for path in label_paths:
        r = http.post(
            serve_agent.url + path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        assert r.status_code < 500, (path, r.text[:500])
        if r.status_code >= 400:
            assert isinstance(r.json()["error"], str)
    assert judged(serve_agent) == n  # labels never change the label-free estimators
    del before
