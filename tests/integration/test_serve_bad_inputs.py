"""Malformed and invalid requests: always a 4xx with a JSON error, counted by reason, estimates untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.agents import Agents
from tests.support.inprocess import RunningServer
from tests.support.metrics import scrape
from tests.support.settings import mnist_app

INFER = "/v2/models/mnist/infer"
X1 = np.zeros((1, 1, 28, 28), dtype=np.float32)
GOOD_INPUT = {"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": X1.ravel().tolist()}
BIN = X1.tobytes()


@dataclass
class Case:
    id: str
    reason: str
    status: int = 400
    body: bytes | None = None
    obj: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    path: str = INFER
    method: str = "POST"
    mention: str = ""

    def content(self) -> bytes:
        if self.body is not None:
            return self.body
        return json.dumps(self.obj).encode()


def inp(**kw: Any) -> dict[str, Any]:
    return {"inputs": [{**GOOD_INPUT, **kw}]}


def binary(head: dict[str, Any], payload: bytes, header_len: int | str | None = None) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(head).encode()
    n = len(text) if header_len is None else header_len
    return text + payload, {"Inference-Header-Content-Length": str(n), "Content-Type": "application/octet-stream"}


def bin_input(size: int, **kw: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "input",
                "shape": [1, 1, 28, 28],
                "datatype": "FP32",
                "parameters": {"binary_data_size": size},
                **kw,
            }
        ]
    }


def _binary_cases() -> list[Case]:
    cases = []
    b, h = binary(bin_input(len(BIN)), BIN, "12x")
    cases.append(Case("binary-header-not-int", "binary_header", body=b, headers=h, mention="integer"))
    b, h = binary(bin_input(len(BIN)), BIN, 10**7)
    cases.append(Case("binary-header-too-long", "binary_header", body=b, headers=h))
    b, h = binary(bin_input(len(BIN) - 4), BIN[:-4])
    cases.append(Case("binary-size-vs-shape", "shape_mismatch", body=b, headers=h, mention="3136 bytes"))
    b, h = binary(bin_input(len(BIN)), BIN + b"\0\0\0\0")
    cases.append(Case("binary-trailing-bytes", "binary_data", body=b, headers=h))
    b, h = binary(bin_input(len(BIN)), BIN[:100])
    cases.append(Case("binary-runs-past-end", "binary_data", body=b, headers=h))
    b, h = binary(bin_input(len(BIN)), BIN, 5)
    cases.append(Case("binary-header-mid-json", "malformed_json", body=b, headers=h))
    b, h = binary(bin_input(len(BIN), data=[1.0]), BIN)
    cases.append(Case("binary-and-data", "binary_header", body=b, headers=h))
    b, h = binary(bin_input(-1), BIN)
    cases.append(Case("binary-negative-size", "binary_header", body=b, headers=h))
    nan = np.full_like(X1, np.nan).tobytes()
    b, h = binary(bin_input(len(nan)), nan)
    cases.append(Case("binary-nan", "non_finite", body=b, headers=h, mention="NaN"))
    head = {
        "inputs": [
            {
                "name": "input",
                "shape": [1, 1, 28, 28],
                "datatype": "FP32",
                "parameters": {"binary_data_size": len(BIN)},
            },
            {"name": "form", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 9}},
        ]
    }
    b, h = binary(head, BIN + (20).to_bytes(4, "little") + b"lines")
    cases.append(Case("binary-bytes-element-overrun", "binary_data", body=b, headers=h))
    f64 = X1.astype(np.float64).tobytes()
    b, h = binary(bin_input(len(f64), datatype="FP64"), f64)
    cases.append(Case("binary-fp64-for-fp32", "datatype", body=b, headers=h, mention="send FP32"))
    return cases


CASES: list[Case] = [
    Case("malformed-json", "malformed_json", body=b"{nope", mention="not valid JSON"),
    Case("empty-body", "malformed_json", body=b""),
    Case("not-utf8", "malformed_json", body=b"\xff\xfe{"),
    Case("top-level-array", "malformed_json", obj=[1, 2]),
    Case("no-inputs", "malformed_json", obj={}, mention="inputs"),
    Case("inputs-not-list", "malformed_json", obj={"inputs": 5}),
    Case("inputs-empty", "malformed_json", obj={"inputs": []}),
    Case("input-no-name", "malformed_json", obj={"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}),
    Case("input-no-datatype", "malformed_json", obj={"inputs": [{"name": "input", "shape": [1], "data": [1]}]}),
    Case("input-no-data", "malformed_json", obj={"inputs": [{"name": "input", "shape": [1], "datatype": "FP32"}]}),
    Case("datatype-bf16", "datatype", obj=inp(datatype="BF16"), mention="BF16"),
    Case("datatype-unknown", "datatype", obj=inp(datatype="FLOAT")),
    Case("datatype-bytes-model-input", "datatype", obj=inp(datatype="BYTES", shape=[1], data=["a"])),
    # another numeric datatype than the model's is refused, never converted silently (as Triton does)
    Case("datatype-fp64-for-fp32", "datatype", obj=inp(datatype="FP64"), mention="the model's input is FP32"),
    Case("datatype-int64-for-fp32", "datatype", obj=inp(datatype="INT64", data=[0] * 784), mention="FP32"),
    Case("datatype-fp16-for-fp32", "datatype", obj=inp(datatype="FP16"), mention="FP32"),
    Case("shape-not-list", "shape", obj=inp(shape="1x784")),
    Case("shape-negative", "shape", obj=inp(shape=[-1, 784])),
    Case("shape-data-mismatch", "shape_mismatch", obj=inp(shape=[1, 784], data=[0.0] * 10), mention="784 elements"),
    Case("wrong-sample-size", "shape", obj=inp(shape=[1, 3], data=[1.0, 2.0, 3.0]), mention="784"),
    Case("data-strings", "data", obj=inp(shape=[1, 2], data=["a", "b"])),
    Case("data-ragged", "data", obj=inp(shape=[2, 2], data=[[1.0, 2.0], [3.0]])),
    Case("int8-overflow", "data", obj=inp(datatype="INT8", shape=[1, 1], data=[300])),
    Case("nan", "non_finite", body=json.dumps(inp(data=[float("nan")] * 784)).encode(), mention="NaN"),
    Case("infinity", "non_finite", body=json.dumps(inp(data=[float("inf")] + [0.0] * 783)).encode()),
    Case("beyond-float32", "non_finite", obj=inp(data=[1e300] + [0.0] * 783), mention="float32"),
    Case("empty-batch", "empty", obj=inp(shape=[0, 1, 28, 28], data=[])),
    Case("batch-too-large", "too_large", status=413, obj=inp(shape=[17, 784], data=[0.0] * 17 * 784)),
    Case("unknown-input-name", "unknown_input", obj=inp(name="pixels"), mention="'input'"),
    Case("two-data-inputs", "unknown_input", obj={"inputs": [GOOD_INPUT, {**GOOD_INPUT, "name": "other"}]}),
    Case("duplicate-input", "duplicate_tensor", obj={"inputs": [GOOD_INPUT, GOOD_INPUT]}),
    Case("unknown-output", "unknown_output", obj={**inp(), "outputs": [{"name": "logits"}]}, mention="logits"),
    Case("outputs-not-list", "malformed_json", obj={**inp(), "outputs": "label"}),
    Case("id-not-string", "malformed_json", obj={**inp(), "id": 7}),
    Case("parameters-not-object", "malformed_json", obj={**inp(), "parameters": [1]}),
    Case("id-too-long", "id_too_long", obj={**inp(), "id": "x" * 257}, mention="256"),
    # the bound is in UTF-8 bytes: 129 two-byte characters are 258 bytes
    Case("id-too-long-in-bytes", "id_too_long", obj={**inp(), "id": "é" * 129}, mention="258 bytes"),
    Case(
        "parameters-too-many",
        "parameters_too_large",
        status=413,
        obj={**inp(), "parameters": {f"p{i}": i for i in range(65)}},
        mention="64",
    ),
    Case(
        "parameters-too-large",
        "parameters_too_large",
        status=413,
        obj={**inp(), "parameters": {"form": "x" * 20_000}},
    ),
    Case(
        "tensor-parameters-too-large",
        "parameters_too_large",
        status=413,
        obj=inp(parameters={"note": "x" * 20_000}),
    ),
    Case(
        "metadata-length",
        "metadata",
        obj={"inputs": [GOOD_INPUT, {"name": "form", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]},
        mention="form",
    ),
    Case("metadata-param-list", "metadata", obj={**inp(), "parameters": {"form": ["lines"]}}),
    Case(
        "bytes-not-strings",
        "data",
        obj={"inputs": [GOOD_INPUT, {"name": "form", "shape": [1], "datatype": "BYTES", "data": [3]}]},
    ),
    Case(
        "metadata-value-too-long",
        "metadata_too_large",
        status=413,
        obj={"inputs": [GOOD_INPUT, {"name": "form", "shape": [1], "datatype": "BYTES", "data": ["x" * 1025]}]},
        mention="server.max_metadata_value_bytes",
    ),
    Case(
        "metadata-too-many-values",
        "metadata_too_large",
        status=413,
        obj={"inputs": [GOOD_INPUT, {"name": "form", "shape": [17], "datatype": "BYTES", "data": ["a"] * 17}]},
        mention="server.max_batch",
    ),
    Case("unknown-model", "unknown_model", status=404, obj=inp(), path="/v2/models/resnet/infer", mention="resnet"),
    Case("unknown-version", "unknown_model", status=404, obj=inp(), path="/v2/models/mnist/versions/9/infer"),
    Case("unknown-model-metadata", "unknown_model", status=404, method="GET", path="/v2/models/resnet"),
    Case("get-on-infer", "method_not_allowed", status=405, method="GET"),
    Case("unknown-route", "not_found", status=404, method="GET", path="/v3/nothing"),
    Case("observe-in-serve-mode", "mode", status=404, obj={}, path="/v1/observe"),
    Case("oversized-body", "too_large", status=413, body=b"x" * (300 * 1024)),
    *_binary_cases(),
]


@pytest.fixture(scope="module")
def agent(module_agents: Agents, mnist_bundle_dir: Path) -> RunningServer:
    return module_agents.serve(mnist_app(mnist_bundle_dir, server={"max_body_bytes": 256 * 1024, "max_batch": 16}))


def invalid_counts(url: str) -> dict[str, float]:
    return scrape(url).by_label("icos_invalid_requests_total", "reason")


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_request(agent: RunningServer, case: Case) -> None:
    before = invalid_counts(agent.url)
    judged = httpx.get(f"{agent.url}/v1/estimates").json()["total_judged"]
    if case.method == "GET":
        r = httpx.get(agent.url + case.path)
    else:
        r = httpx.post(agent.url + case.path, content=case.content(), headers=case.headers)
    assert r.status_code == case.status, r.text
    assert 400 <= r.status_code < 500
    err = r.json()["error"]
    assert isinstance(err, str) and err
    if case.mention:
        assert case.mention in err
    after = invalid_counts(agent.url)
    assert after.get(case.reason, 0) - before.get(case.reason, 0) == 1, (case.reason, after)
    assert sum(after.values()) - sum(before.values()) == 1
    assert httpx.get(f"{agent.url}/v1/estimates").json()["total_judged"] == judged
    assert httpx.get(f"{agent.url}/v2/health/live").status_code == 200


def test_oversized_chunked_body(agent: RunningServer) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b"x" * 16384

    before = invalid_counts(agent.url).get("too_large", 0)
    r = httpx.post(agent.url + INFER, content=chunks())
    assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]
    assert invalid_counts(agent.url)["too_large"] == before + 1


def test_valid_request_after_the_bad_ones(agent: RunningServer) -> None:
    r = httpx.post(agent.url + INFER, json=inp())
    assert r.status_code == 200
    b, h = binary(bin_input(len(BIN)), BIN)
    assert httpx.post(agent.url + INFER, content=b, headers=h).status_code == 200
