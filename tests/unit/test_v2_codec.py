"""The V2 codec: JSON and binary tensors round-trip; malformed bodies raise ProtocolError with a reason."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent.protocol import v2
from agent.protocol.v2 import DATATYPES, ProtocolError


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BYTES"])
@pytest.mark.parametrize("binary", [False, True])
def test_numeric_roundtrip(datatype: str, binary: bool) -> None:
    rng = np.random.default_rng(0)
    dt = DATATYPES[datatype]
    arr = (rng.integers(0, 2, (3, 4)) if datatype == "BOOL" else rng.integers(0, 100, (3, 4))).astype(dt)
    body, headers = v2.encode_request([v2.tensor("x", arr)], binary=binary, request_id="r1")
    assert (v2.HEADER_LENGTH.lower() in headers) == binary
    req = v2.decode_request(body, headers.get(v2.HEADER_LENGTH.lower()))
    t = req.input("x")
    assert t is not None and t.datatype == datatype and t.shape == [3, 4] and t.binary == binary
    np.testing.assert_array_equal(t.data, arr)
    assert t.data.dtype == dt
    assert req.id == "r1" and req.used_binary == binary


@pytest.mark.parametrize("binary", [False, True])
def test_bytes_roundtrip_and_response(binary: bool) -> None:
    verdicts = np.array([b"pass", b"fail:tdi", b""], dtype=object)
    probs = np.array([[0.1, 0.9], [0.5, 0.5], [1.0, 0.0]], dtype=np.float32)
    body, headers = v2.encode_response(
        "m", "1", "id-1", [(v2.tensor("icos_verdict", verdicts), binary), (v2.tensor("p", probs), binary)], {"k": "v"}
    )
    resp = v2.decode_response(body, headers.get(v2.HEADER_LENGTH.lower()))
    assert resp.model_name == "m" and resp.model_version == "1" and resp.id == "id-1"
    assert resp.parameters == {"k": "v"}
    out = resp.output("icos_verdict")
    assert out is not None and out.datatype == "BYTES"
    assert [v if isinstance(v, bytes) else v.encode() for v in out.data.tolist()] == verdicts.tolist()
    p = resp.output("p")
    assert p is not None
    np.testing.assert_array_equal(p.data, probs)


def test_json_accepts_nested_and_flat_data() -> None:
    nested = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]}]}
    flat = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    a = v2.decode_request(json.dumps(nested).encode()).inputs[0].data
    b = v2.decode_request(json.dumps(flat).encode()).inputs[0].data
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_values_beyond_fp32_become_infinite_without_warning() -> None:
    body = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1e300, -1e300]}]}
    data = v2.decode_request(json.dumps(body).encode()).inputs[0].data
    assert data.dtype == np.float32 and np.isposinf(data[0]) and np.isneginf(data[1])


def test_requested_outputs_and_binary_default() -> None:
    body = {
        "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}],
        "outputs": [{"name": "a", "parameters": {"binary_data": True}}, {"name": "b"}],
    }
    req = v2.decode_request(json.dumps(body).encode())
    assert [(o.name, o.binary) for o in req.outputs or []] == [("a", True), ("b", False)]
    body2 = {"inputs": body["inputs"], "parameters": {"binary_data_output": True}}
    req2 = v2.decode_request(json.dumps(body2).encode())
    assert req2.outputs is None and req2.binary_output


def test_binary_mixed_with_json_tensors() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    head = {
        "inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}},
            {"name": "form", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]},
        ]
    }
    text = json.dumps(head).encode()
    req = v2.decode_request(text + x.tobytes(), str(len(text)))
    np.testing.assert_array_equal(req.inputs[0].data, x)
    assert req.inputs[1].data.tolist() == [b"a", b"b"]


@pytest.mark.parametrize(
    ("body", "header", "reason"),
    [
        (b"{", None, "malformed_json"),
        (b"", None, "malformed_json"),
        (b"[]", None, "malformed_json"),
        (b'{"inputs": 1}', None, "malformed_json"),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "X", "data": [1]}]}', None, "datatype"),
        (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}]}', None, "shape_mismatch"),
        (b'{"inputs": [{"name": "x", "shape": [1.5], "datatype": "FP32", "data": [1]}]}', None, "shape"),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "UINT8", "data": [-1]}]}', None, "data"),
        (b'{"inputs": []}', "abc", "binary_header"),
        (b'{"inputs": []}', "-1", "binary_header"),
    ],
)
def test_malformed(body: bytes, header: str | None, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        v2.decode_request(body, header)
    assert info.value.reason == reason
    assert info.value.status == 400


def test_binary_size_checks() -> None:
    x = np.zeros((2, 2), dtype=np.float32)
    head = {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "parameters": {"binary_data_size": 12}}]}
    text = json.dumps(head).encode()
    with pytest.raises(ProtocolError) as info:
        v2.decode_request(text + x.tobytes()[:12], str(len(text)))
    assert info.value.reason == "shape_mismatch"
    head["inputs"][0]["parameters"]["binary_data_size"] = 16  # type: ignore[index]
    text = json.dumps(head).encode()
    with pytest.raises(ProtocolError) as info:
        v2.decode_request(text + x.tobytes() + b"\0", str(len(text)))
    assert info.value.reason == "binary_data"


def test_datatype_of() -> None:
    assert v2.datatype_of(np.zeros(1, np.float32)) == "FP32"
    assert v2.datatype_of(np.zeros(1, np.int64)) == "INT64"
    assert v2.datatype_of(np.array(["a"])) == "BYTES"
    assert json.loads(v2.error_body("boom")) == {"error": "boom"}


X = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}


@pytest.mark.parametrize(
    "body",
    [
        {"id": "\ud800", "inputs": [X]},
        {"inputs": [{**X, "name": "x\udfff"}]},
        {"inputs": [X], "parameters": {"site": "\udc00"}},
        {"inputs": [{"name": "m", "datatype": "BYTES", "shape": [1], "data": ["\ud801"]}]},
    ],
    ids=["id", "tensor-name", "parameter", "bytes-value"],
)
def test_lone_surrogates_are_refused_wherever_they_sit(body: dict[str, object]) -> None:
    """A string no UTF-8 encoder accepts is refused at the boundary, not when the store writes it."""
    text = json.dumps(body).encode()  # ensure_ascii: the surrogate travels as a \\udXXX escape
    assert b"\\ud" in text
    with pytest.raises(ProtocolError) as info:
        v2.decode_request(text)
    assert info.value.reason == "malformed_json" and "not valid Unicode" in str(info.value)
    with pytest.raises(ProtocolError):
        v2.decode_response(json.dumps({"id": "\ud800", "outputs": [X]}).encode())


def test_surrogate_pairs_are_ordinary_text() -> None:
    assert v2.decode_request(json.dumps({"id": "\U0001f600", "inputs": [X]}).encode()).id == "\U0001f600"


@pytest.mark.parametrize("shape", [[0, 10**30], [10**30, 0], [0, 2**31], [1] * 33])
def test_absurd_shapes_are_client_errors(shape: list[int]) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": []}]}
    with pytest.raises(ProtocolError) as info:
        v2.decode_request(json.dumps(body).encode())
    assert info.value.reason == "shape" and info.value.status == 400
    assert len(str(info.value)) < 320
    head = json.dumps({"inputs": [{**body["inputs"][0], "parameters": {"binary_data_size": 0}}]}).encode()  # type: ignore[index]
    head = head.replace(b', "data": []', b"")
    with pytest.raises(ProtocolError) as info:
        v2.decode_request(head, str(len(head)))
    assert info.value.reason == "shape"
    with pytest.raises(ProtocolError):
        v2.decode_response(json.dumps({"outputs": body["inputs"]}).encode())


def test_an_output_is_requested_once() -> None:
    """600 copies of one output would multiply the response (124 MB for a 1,024-row request)."""
    body = {"inputs": [X], "outputs": [{"name": "probabilities"}] * 600}
    with pytest.raises(ProtocolError) as info:
        v2.decode_request(json.dumps(body).encode())
    assert info.value.reason == "duplicate_tensor" and "requested twice" in str(info.value)


@pytest.mark.parametrize("n", [0, 1, 3, 16, 17, 64])
def test_coded_bytes_wire_is_the_length_prefixed_elements(n: int) -> None:
    """A few codes are joined per element, many go through the table: both give the plain serialisation."""
    from agent.protocol.inference import SMALL_CODES, Vocabulary, encode_bytes_elements

    vocabulary = Vocabulary((b"pass", b"fail:idi", b"", "é".encode()))
    codes = np.random.default_rng(n).integers(0, 4, n).astype(np.int8)
    assert vocabulary.wire(codes) == encode_bytes_elements(vocabulary.elements(codes))
    assert (n <= SMALL_CODES) == (n in (0, 1, 3, 16))


@pytest.mark.parametrize(
    "params",
    [
        {"a": "x" * 8000, "b": "y" * 8000, "c": 1},  # just within, flat
        {"a": "x" * 16370, "bb": 1, "c": None},  # past the bound by its other keys and values
        {"a": ["x" * 8000], "b": {"c": "y" * 8000}},  # nested
        {"a": ["x" * 16390]},  # nested, past
    ],
)
def test_parameters_bound_counts_keys_strings_and_values(params: dict[str, object]) -> None:
    """Flat parameters are bounded as the nested walk bounds them: keys and strings by length, other values 8."""
    from agent.protocol.inference import MAX_PARAMETER_BYTES, check_parameters, json_nodes

    size = sum(len(i) if isinstance(i, str) else 0 if isinstance(i, dict | list) else 8 for i in json_nodes(params))
    if size > MAX_PARAMETER_BYTES:
        with pytest.raises(ProtocolError) as err:
            check_parameters(params)
        assert err.value.reason == "parameters_too_large" and err.value.status == 413
    else:
        assert check_parameters(params) is params
