"""The serving benchmark's bare model server: onnxruntime behind the Open Inference Protocol (V2),
over HTTP (uvicorn, binary tensors) and, with ``grpc_port``, over gRPC (``grpc.aio`` in the same event
loop, raw contents). It decodes the request, runs the model in a worker thread, applies softmax and
answers probabilities and label: no validation, no judging. It answers the server and model metadata
a V2 server does, so a proxy in front of it speaks binary to it.

Both protocols take requests as large as the agent does with its defaults (``server.max_body_bytes``,
32 MiB): gRPC's own receive limit (4 MB by default) would refuse a batch of 32 images of 3×224×224
(19 MB) that the agent serves.

    python -m bench.serving.bare_server --port 8000 [--grpc-port 8001] --model agent/shipped_models/mnist_cnn.onnx
        [--scores-kind logits|probabilities]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import numpy as np


class BareModel:
    """The model and its softmax (of logits; ``probabilities=True``: the scores are taken as they are);
    ``predict`` returns the probabilities and labels as raw bytes. The scores are the graph's first
    floating-point output (a LightGBM model's first output is its INT64 label)."""

    def __init__(self, model_path: str, probabilities: bool = False) -> None:
        from invariants.onnx_session import OnnxSession

        self.session = OnnxSession(model_path)
        self.probabilities = probabilities
        self.in_name = self.session.inputs[0].name
        scores = next(o for o in self.session.outputs if o.dtype.kind == "f")
        self.out_name = scores.name
        self.in_shape = [-1 if d is None else d for d in self.session.inputs[0].shape]
        self.k = scores.shape[-1] or -1

    def predict(self, x: np.ndarray) -> tuple[bytes, bytes]:
        (scores,) = self.session.run({self.in_name: x}, [self.out_name])
        if self.probabilities:
            probs = np.asarray(scores, dtype=np.float32)
        else:
            z = scores - scores.max(axis=1, keepdims=True)
            e = np.exp(z)
            probs = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
        return probs.tobytes(), probs.argmax(axis=1).astype(np.int64).tobytes()


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        m = await receive()
        chunks.append(m.get("body", b""))
        if not m.get("more_body"):
            return b"".join(chunks)


def _model_metadata(model: BareModel, name: str) -> bytes:
    """The model metadata a V2 server answers (what a proxy reads to speak binary to it)."""
    inputs = [{"name": model.in_name, "datatype": "FP32", "shape": model.in_shape}]
    outputs = [
        {"name": "probabilities", "datatype": "FP32", "shape": [-1, model.k]},
        {"name": "label", "datatype": "INT64", "shape": [-1]},
    ]
    return json.dumps({"name": name, "platform": "onnxruntime", "inputs": inputs, "outputs": outputs}).encode()


def _binary_answer(model_name: str, rows: int, p: bytes, label: bytes) -> tuple[bytes, bytes]:
    """The binary-tensor answer to an infer request: its JSON header and the whole payload."""
    k = len(p) // 4 // rows
    out = {
        "model_name": model_name,
        "outputs": [
            {
                "name": "probabilities",
                "datatype": "FP32",
                "shape": [rows, k],
                "parameters": {"binary_data_size": len(p)},
            },
            {"name": "label", "datatype": "INT64", "shape": [rows], "parameters": {"binary_data_size": len(label)}},
        ],
    }
    text = json.dumps(out).encode()
    return text, text + p + label


async def _infer(model: BareModel, scope: Any, receive: Any, send: Any) -> None:
    from starlette.concurrency import run_in_threadpool

    body = await _read_body(receive)
    n = int(dict(scope["headers"])[b"inference-header-content-length"])
    inp = json.loads(body[:n])["inputs"][0]
    x = np.frombuffer(body[n:], dtype=np.float32).reshape(inp["shape"])
    p, label = await run_in_threadpool(model.predict, x)
    text, payload = _binary_answer(scope["path"].split("/")[3], x.shape[0], p, label)
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"inference-header-content-length", str(len(text)).encode()),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def bare_app(model: BareModel, grpc_port: int | None = None) -> Any:
    """A minimal V2 endpoint: binary-tensor infer, metadata and readiness; with ``grpc_port``, its
    lifespan also runs :func:`bare_grpc_server` on that port."""
    grpc_server: Any = None
    server_metadata = json.dumps({"name": "bare", "version": "1", "extensions": ["binary_tensor_data"]}).encode()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal grpc_server
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                if m["type"] == "lifespan.startup":
                    if grpc_port is not None:
                        grpc_server = await bare_grpc_server(model, grpc_port)
                    await send({"type": "lifespan.startup.complete"})
                elif m["type"] == "lifespan.shutdown":
                    if grpc_server is not None:
                        await grpc_server.stop(1)
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        if path.endswith("/infer"):
            await _infer(model, scope, receive, send)
            return
        await _read_body(receive)
        parts = path.strip("/").split("/")
        if parts == ["v2"]:
            answer = server_metadata
        elif len(parts) in (3, 5) and parts[:2] == ["v2", "models"] and parts[3:4] in ([], ["versions"]):
            answer = _model_metadata(model, parts[2])
        else:  # readiness and liveness
            answer = b'{"ready": true, "live": true}'

        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer})

    return app


def max_message_bytes() -> int:
    """The largest request the agent serves with its defaults (``server.max_body_bytes``)."""
    from agent.config.server import ServerConfig

    return int(ServerConfig.model_fields["max_body_bytes"].default)


async def bare_grpc_server(model: BareModel, port: int) -> Any:
    """The gRPC service on ``port``: ModelInfer (raw contents in and out) and the readiness calls."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    class Bare(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
        async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - the protocol's names
            return service_pb2.ServerLiveResponse(live=True)

        async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
            return service_pb2.ServerReadyResponse(ready=True)

        async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
            return service_pb2.ModelReadyResponse(ready=True)

        async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
            shape = tuple(request.inputs[0].shape)
            x = np.frombuffer(request.raw_input_contents[0], dtype=np.float32).reshape(shape)
            p, label = await asyncio.to_thread(model.predict, x)
            resp = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
            resp.outputs.add(name="probabilities", datatype="FP32", shape=[shape[0], len(p) // 4 // shape[0]])
            resp.outputs.add(name="label", datatype="INT64", shape=[shape[0]])
            resp.raw_output_contents.extend((p, label))
            return resp

    limit = max_message_bytes()
    options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", -1)]
    server = grpc.aio.server(options=options)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Bare(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


def run_bare(port: int, model_path: str, grpc_port: int | None = None, probabilities: bool = False) -> None:
    import uvicorn

    app = bare_app(BareModel(model_path, probabilities), grpc_port)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int)
    ap.add_argument("--model", required=True, help="the ONNX model file")
    ap.add_argument(
        "--scores-kind",
        choices=("logits", "probabilities"),
        default="logits",
        help="what the model's scores are: softmax applies to logits only",
    )
    args = ap.parse_args(argv)
    run_bare(args.port, args.model, args.grpc_port, args.scores_kind == "probabilities")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
