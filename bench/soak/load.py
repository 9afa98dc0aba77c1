"""The soak's load generator, run as its own process: keep-alive HTTP/1.1 connections on loopback
sending a seeded mix of valid (binary and JSON) and invalid V2 requests, bounded in count and time.

Prints one JSON object: status counts, latency percentiles, throughput and the wall-clock time at
which the warm-up share of the requests was done (the orchestrator takes its memory baseline then).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from typing import Any

import numpy as np

from bench.http_exchange import exchange


def _http(port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (head + "\r\n").encode() + body


def request_mix(port: int, x: np.ndarray) -> list[tuple[str, bytes]]:
    """``(kind, raw request)``: about 70 % valid, 30 % invalid of several kinds."""
    infer = "/v2/models/mnist/infer"
    one = x[:1]
    binary_head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "label", "parameters": {"binary_data": True}}, {"name": "icos_verdict"}],
        }
    ).encode()
    json_body = json.dumps(
        {"inputs": [{"name": "input", "shape": list(one.shape), "datatype": "FP32", "data": one.ravel().tolist()}]}
    ).encode()
    ctype = {"Content-Type": "application/json"}
    valid = [
        (
            "valid_binary",
            _http(port, infer, binary_head + x.tobytes(), {"Inference-Header-Content-Length": str(len(binary_head))}),
        ),
        ("valid_json", _http(port, infer, json_body, ctype)),
    ]
    bad_shape = json.dumps({"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})
    nan = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [float("nan")] * 784}]}
    )
    invalid = [
        ("invalid_json", _http(port, infer, b"{not json", ctype)),
        ("invalid_shape", _http(port, infer, bad_shape.encode(), ctype)),
        ("invalid_nan", _http(port, infer, nan.encode(), ctype)),
        ("invalid_model", _http(port, "/v2/models/nope/infer", json_body, ctype)),
        ("invalid_binary", _http(port, infer, binary_head + b"\0" * 10, {"Inference-Header-Content-Length": "7x"})),
    ]
    return valid * 7 + invalid + invalid[:1]  # 14 valid : 6 invalid


async def _connection(
    port: int, mix: list[tuple[str, bytes]], rng: random.Random, state: dict[str, Any], stop_at: float
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while state["sent"] < state["total"] and time.monotonic() < stop_at:
            state["sent"] += 1
            kind, req = mix[rng.randrange(len(mix))]
            t0 = time.perf_counter()
            status = await exchange(reader, writer, req)
            state["latencies"].append(time.perf_counter() - t0)
            state["status"][f"{kind}:{status}"] += 1
            state["done"] += 1
            if state["warm_at"] is None and state["done"] >= state["warmup"]:
                state["warm_at"] = time.time()
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        state["errors"][type(exc).__name__] += 1
    finally:
        writer.close()


async def drive(port: int, total: int, concurrency: int, seconds: float, warmup: float, seed: int) -> dict[str, Any]:
    from agent.data.datasets import mnist_splits

    x = np.ascontiguousarray(mnist_splits().test.x[:8], dtype=np.float32)
    mix = request_mix(port, x)
    state: dict[str, Any] = {
        "sent": 0,
        "done": 0,
        "total": total,
        "warmup": int(total * warmup),
        "warm_at": None,
        "latencies": [],
        "status": Counter(),
        "errors": Counter(),
    }
    t0 = time.monotonic()
    stop_at = t0 + seconds
    rngs = [random.Random(seed + i) for i in range(concurrency)]
    await asyncio.gather(*[_connection(port, mix, rngs[i], state, stop_at) for i in range(concurrency)])
    elapsed = time.monotonic() - t0
    lat = np.asarray(state["latencies"]) * 1000 if state["latencies"] else np.zeros(1)
    statuses: Counter[str] = state["status"]
    return {
        "requests": state["done"],
        "seconds": elapsed,
        "throughput": state["done"] / elapsed if elapsed else 0.0,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "max_ms": float(lat.max()),
        "status": dict(sorted(statuses.items())),
        "server_errors": sum(v for k, v in statuses.items() if k.rsplit(":", 1)[1].startswith("5")),
        "valid_not_200": sum(v for k, v in statuses.items() if k.startswith("valid") and not k.endswith(":200")),
        "invalid_not_4xx": sum(
            v for k, v in statuses.items() if k.startswith("invalid") and not k.rsplit(":", 1)[1].startswith("4")
        ),
        "connection_errors": dict(state["errors"]),
        "warm_at": state["warm_at"],
        "stopped_by_time": state["done"] < total,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--warmup", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out = asyncio.run(drive(a.port, a.requests, a.concurrency, a.seconds, a.warmup, a.seed))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
