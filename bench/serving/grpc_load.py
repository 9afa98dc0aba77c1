"""The serving benchmark's gRPC load generator: Open Inference Protocol ``ModelInfer`` requests with raw
contents (what Triton's clients send), built with ``tritonclient.grpc``'s messages and sent with
``grpc.aio`` by ``concurrency`` callers, each on its own channel (as the HTTP load generator gives each
caller its own keep-alive connection)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np


def grpc_request(x: np.ndarray, model: str, outputs: tuple[str, ...] | None = None) -> Any:
    """A ``ModelInferRequest`` of ``x`` (FP32, raw contents) asking for ``outputs`` (all when ``None``)."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    req.raw_input_contents.append(np.ascontiguousarray(x, dtype=np.float32).tobytes())
    for name in outputs or ():
        req.outputs.add(name=name)
    return req


async def drive_grpc(port: int, req: Any, concurrency: int, seconds: float) -> tuple[list[float], list[int], float]:
    """Send ``req`` again and again for ``seconds``; latencies (s), failed calls' status codes and the
    elapsed time, like the HTTP load generator."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    latencies: list[float] = []
    errors: list[int] = []
    t0 = time.perf_counter()
    stop_at = t0 + seconds

    async def caller() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            infer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                try:
                    await infer(req, timeout=30)
                except grpc.aio.AioRpcError as exc:
                    errors.append(exc.code().value[0])
                latencies.append(time.perf_counter() - t)

    await asyncio.gather(*[caller() for _ in range(concurrency)])
    return latencies, errors, time.perf_counter() - t0
