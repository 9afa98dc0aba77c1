"""The Open Inference Protocol's gRPC service: the agent as a real process with ``server.grpc_port``,
driven by ``tritonclient.grpc`` (and its generated stub for typed contents), answers as over HTTP.

This process loads tritonclient's ``inference.*`` messages; the agent's own copy lives in the agent
process only (both register the same names in protobuf's default pool).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from tests.support.agent_process import AgentProcess
from tests.support.agents import Agents
from tests.support.inprocess import RunningServer
from tests.support.ports import free_port
from tests.support.settings import upstream_app
from tests.support.waiting import wait_until

OUTPUTS = ("probabilities", "label", "icos_verdict")
#: Small enough that 21 MNIST images (3,136 bytes each) pass it.
MAX_BODY = 64 * 1024


def _config(bundle: Path, grpc_port: int, **extra: Any) -> dict[str, Any]:
    return {
        "mode": "serve",
        "model": {"name": "mnist", "version": "3", "path": str(default_model_path())},
        "bundle": {"path": str(bundle)},
        "server": {"grpc_port": grpc_port, "max_body_bytes": MAX_BODY},
        **extra,
    }


@pytest.fixture(scope="module")
def agent(module_agents: Agents, mnist_bundle_dir: Path) -> tuple[AgentProcess, int]:
    """Stopped with SIGTERM after the module: it must exit with 0."""
    port = free_port()
    return module_agents.process(_config(mnist_bundle_dir, port), name="grpc", graceful=True), port


@pytest.fixture(scope="module")
def client(agent: tuple[AgentProcess, int]) -> Iterator[tg.InferenceServerClient]:
    c = tg.InferenceServerClient(f"127.0.0.1:{agent[1]}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(agent: tuple[AgentProcess, int]) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{agent[1]}")
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _grpc_infer(c: tg.InferenceServerClient, x: np.ndarray, model: str = "mnist", **kw: Any) -> Any:
    inp = tg.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return c.infer(model, [inp], outputs=[tg.InferRequestedOutput(n) for n in OUTPUTS], **kw)


def _raw_request(x: np.ndarray, datatype: str = "FP32", shape: list[int] | None = None) -> Any:
    req = service_pb2.ModelInferRequest(model_name="mnist")
    req.inputs.add(name="input", datatype=datatype, shape=shape if shape is not None else list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req


def _refused(stub: Any, req: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req, timeout=30)
    return info.value


def test_health_and_metadata(client: tg.InferenceServerClient, stub: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mnist") and client.is_model_ready("mnist", "3")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "icos-agent" and "icos_verdict" in meta["extensions"]
    model = client.get_model_metadata("mnist", as_json=True)
    assert model["versions"] == ["3"] and model["platform"] == "onnxruntime_onnx"
    assert model["inputs"][0]["name"] == "input" and model["inputs"][0]["shape"] == ["-1", "1", "28", "28"]
    assert [o["name"] for o in model["outputs"]] == list(OUTPUTS)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="cifar"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and "unknown model 'cifar'" in str(info.value.details())


def test_infer_raw_contents_answers_as_http(
    agent: tuple[AgentProcess, int], client: tg.InferenceServerClient, mnist_splits: Splits
) -> None:
    proc = agent[0]
    x = mnist_splits.test.x[:12]
    before = proc.metrics()
    res = _grpc_infer(client, x, request_id="g-1")
    http = th.InferenceServerClient(f"127.0.0.1:{proc.port}")
    inp = th.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    ref = http.infer("mnist", [inp], outputs=[th.InferRequestedOutput(n) for n in OUTPUTS])
    np.testing.assert_allclose(res.as_numpy("probabilities"), ref.as_numpy("probabilities"), rtol=1e-6)
    np.testing.assert_array_equal(res.as_numpy("label"), ref.as_numpy("label"))
    assert res.as_numpy("icos_verdict").tolist() == ref.as_numpy("icos_verdict").tolist()
    response = res.get_response()
    assert response.id == "g-1" and response.model_name == "mnist" and response.model_version == "3"
    assert response.parameters["icos_prediction_count"].int64_param == 12
    key = "icos_predictions_total{model=mnist,version=3}"
    # 12 over gRPC, 12 over HTTP, recorded right after the answers
    assert wait_until(lambda: proc.metrics()[key] - before.get(key, 0) == 24)
    after = proc.metrics()
    hist = "icos_inference_duration_seconds_count{model=mnist,version=3}"
    assert after[hist] - before.get(hist, 0) == 2


def test_infer_typed_contents(
    agent: tuple[AgentProcess, int], stub: Any, client: tg.InferenceServerClient, mnist_splits: Splits
) -> None:
    before = agent[0].metrics()
    x = mnist_splits.test.x[12:20]
    req = service_pb2.ModelInferRequest(model_name="mnist", id="typed")
    t = req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    t.contents.fp32_contents.extend(x.reshape(-1).tolist())
    for name in OUTPUTS:
        req.outputs.add(name=name)
    resp = stub.ModelInfer(req, timeout=30)
    assert not resp.raw_output_contents  # typed in, typed out
    out = {o.name: o for o in resp.outputs}
    ref = _grpc_infer(client, x)
    probs = np.array(out["probabilities"].contents.fp32_contents, dtype=np.float32).reshape(8, 10)
    np.testing.assert_allclose(probs, ref.as_numpy("probabilities"), rtol=1e-6)
    assert list(out["label"].contents.int64_contents) == ref.as_numpy("label").tolist()
    assert list(out["icos_verdict"].contents.bytes_contents) == ref.as_numpy("icos_verdict").tolist()
    assert list(out["probabilities"].shape) == [8, 10] and resp.id == "typed"
    # both requests recorded (the next test reads the counts as they stand: none of these may be pending)
    key = "icos_predictions_total{model=mnist,version=3}"
    assert wait_until(lambda: agent[0].metrics()[key] - before.get(key, 0) == 16)


def test_bad_requests_are_refused_named_and_counted(
    agent: tuple[AgentProcess, int], stub: Any, client: tg.InferenceServerClient
) -> None:
    proc = agent[0]
    before = proc.metrics()
    x = np.zeros((2, 1, 28, 28), np.float32)

    # wrong shape: the model takes [N, 1, 28, 28] (or [N, 784])
    err = _refused(stub, _raw_request(np.zeros((1, 3), np.float32)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "input" in err.details() and "shape" in err.details()
    # raw contents that do not match the declared shape
    err = _refused(stub, _raw_request(x, shape=[3, 1, 28, 28]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents[0] holds 6272" in err.details()
    # wrong datatype: BYTES data for a numeric model, and a datatype that does not exist
    err = _refused(stub, _raw_request(np.zeros(0, np.uint8), datatype="BYTES", shape=[0]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "BYTES" in err.details()
    err = _refused(stub, _raw_request(x, datatype="FP128"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "'FP128' is not supported" in err.details()
    # another numeric datatype than the model's FP32 is refused as over HTTP, never converted silently
    for datatype, dtype in (("FP64", np.float64), ("INT64", np.int64), ("FP16", np.float16)):
        err = _refused(stub, _raw_request(x.astype(dtype), datatype=datatype))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "the model's input is FP32" in err.details()
    # typed contents of the wrong length
    req = service_pb2.ModelInferRequest(model_name="mnist")
    req.inputs.add(name="input", datatype="FP32", shape=[1, 1, 28, 28]).contents.fp32_contents.extend([1.0] * 5)
    err = _refused(stub, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "fp32_contents holds 5" in err.details()
    # a request id over 256 bytes
    req = _raw_request(x)
    req.id = "i" * 257
    err = _refused(stub, req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "257 bytes" in err.details()
    # unknown model
    with pytest.raises(InferenceServerException) as info:
        _grpc_infer(client, x, model="cifar")
    assert info.value.status() == "StatusCode.NOT_FOUND" and "unknown model 'cifar'" in info.value.message()
    # a message over server.max_body_bytes
    big = np.zeros((24, 1, 28, 28), np.float32)  # 75 KB > 64 KiB
    err = _refused(stub, _raw_request(big))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "server.max_body_bytes" in err.details() and str(MAX_BODY) in err.details()

    after = proc.metrics()

    def grew(reason: str) -> float:
        key = f"icos_invalid_requests_total{{reason={reason}}}"
        return after.get(key, 0) - before.get(key, 0)

    assert grew("shape") + grew("shape_mismatch") == 3  # wrong shape (model check), raw and typed lengths
    assert grew("datatype") == 5
    assert grew("unknown_model") == 1
    assert grew("too_large") == 1
    assert grew("id_too_long") == 1
    assert client.is_server_ready()  # nothing of this hurt the service


def test_proxy_mode_over_grpc(
    tmp_path: Path, run_server: Callable[..., RunningServer], mnist_bundle_dir: Path, mnist_splits: Splits
) -> None:
    """gRPC → agent (proxy mode) → upstream over HTTP V2; verdicts as the upstream's own."""
    up = run_server(upstream_app(mnist_bundle_dir))
    port = free_port()
    cfg = _config(mnist_bundle_dir, port, mode="proxy", upstream={"url": up.url, "model_name": "mnist-upstream"})
    proxy = AgentProcess(tmp_path, cfg).start()
    try:
        c = tg.InferenceServerClient(f"127.0.0.1:{port}")
        assert c.is_server_ready() and c.get_model_metadata("mnist", as_json=True)["platform"] == "icos_proxy"
        x = mnist_splits.test.x[:10]
        res = _grpc_infer(c, x)
        direct = th.InferenceServerClient(up.hostport)
        inp = th.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        ref = direct.infer("mnist-upstream", [inp], outputs=[th.InferRequestedOutput(n) for n in OUTPUTS])
        np.testing.assert_allclose(res.as_numpy("probabilities"), ref.as_numpy("probabilities"), rtol=1e-6)
        assert res.as_numpy("icos_verdict").tolist() == ref.as_numpy("icos_verdict").tolist()
        # recorded right after the answer, with other requests' predictions
        assert wait_until(lambda: proxy.metrics().get("icos_predictions_total{model=mnist,version=3}") == 10)
        up.stop()  # the upstream is gone: UNAVAILABLE, counted as an upstream error
        with pytest.raises(InferenceServerException) as info:
            _grpc_infer(c, x)
        assert info.value.status() == "StatusCode.UNAVAILABLE" and "unreachable" in info.value.message()
        assert proxy.metrics()["icos_upstream_errors_total{reason=unreachable}"] == 1
        c.close()
    finally:
        assert proxy.terminate() == 0
