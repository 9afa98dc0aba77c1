"""Benchmark: the latency cost of ``labels.durability: commit`` (acknowledge after commit) against
``batched`` (commit every flush interval, after the answer), measured in the same run.

The agent runs as a subprocess (``serve`` mode, the shipped MNIST CNN, a bundle fitted for it, its
prediction store in SQLite in a temporary state directory — ``synchronous=FULL`` in commit mode), one
agent per mode, measured one after the other and interleaved ``--rounds`` times. Load: this process
runs ``--concurrency`` keep-alive connections, each sending one request (one image, outputs
``label``) after the other for ``--seconds``. With many requests in flight, one commit serves all the
requests that arrived while the previous one ran (group commit).

Prints, per mode: requests/s, p50 and p99 latency per request, then the ratios commit ÷ batched.

    python -m bench.bench_durability [--seconds 4] [--rounds 2] [--concurrency 16] [--bundle DIR]
    python -m bench durability
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.http_exchange import exchange

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fit_bundle_for_shipped_model(workdir: Path) -> Path:
    """A bundle for the shipped CNN with the paper's defaults (what ``icos-agent fit`` writes)."""
    from agent.data.datasets import mnist_splits
    from agent.data.files import Dataset
    from agent.model.classifier import OnnxClassifier, default_model_path
    from agent.offline.fit import fit_bundle

    s = mnist_splits()
    model = OnnxClassifier.load(default_model_path())
    report = fit_bundle(model, Dataset(s.train.x, s.train.y), Dataset(s.val.x, s.val.y))
    out = workdir / "bundle"
    report.bundle.save(out)
    return out


def start_agent(
    workdir: Path, bundle: Path, labels: dict[str, Any], env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], int]:
    """``icos-agent serve`` with these ``labels`` settings, ready to answer."""
    import httpx
    import yaml

    from agent.model.classifier import default_model_path

    port = free_port()
    cfg = workdir / f"agent-{port}.yaml"
    state = workdir / f"state-{port}"
    cfg.write_text(
        yaml.safe_dump(
            {
                "mode": "serve",
                "model": {"name": "mnist", "path": str(default_model_path())},
                "bundle": {"path": str(bundle)},
                "server": {"host": "127.0.0.1", "port": port},
                "state_dir": str(state),
                "labels": labels,
                "audits": {"reservoir": {"size": 0}},
                "log_level": "warning",
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "serve", "--config", str(cfg)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"agent exited: {proc.stderr.read().decode(errors='replace')[-2000:]}")  # type: ignore[union-attr]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("agent did not become ready")


def request_bytes(port: int, x: np.ndarray) -> bytes:
    body = json.dumps(
        {
            "inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
            "outputs": [{"name": "label"}],
        }
    ).encode()
    head = (
        f"POST /v2/models/mnist/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


async def _load(port: int, request: bytes, concurrency: int, seconds: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    failures = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal failures
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                status = await exchange(reader, writer, request)
                if status == 200:
                    latencies.append(time.perf_counter() - t0)
                else:
                    failures += 1
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies, failures


def measure(port: int, request: bytes, concurrency: int, seconds: float) -> dict[str, float]:
    asyncio.run(_load(port, request, concurrency, min(1.0, seconds)))  # warm-up
    lat, failures = asyncio.run(_load(port, request, concurrency, seconds))
    a = np.asarray(lat) * 1000
    return {
        "requests_per_s": len(a) / seconds,
        "p50_ms": float(np.percentile(a, 50)) if len(a) else float("nan"),
        "p99_ms": float(np.percentile(a, 99)) if len(a) else float("nan"),
        "failures": float(failures),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="measuring time per mode and round")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (medians reported)")
    ap.add_argument("--concurrency", type=int, default=16, help="connections sending requests at once")
    ap.add_argument("--bundle", help="bundle directory (default: fit one for the shipped CNN)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from agent.data.datasets import mnist_splits

    env = {k: v for k, v in os.environ.items() if not k.startswith("ICOS_AGENT_")}
    env["ICOS_AGENT_ORT_THREADS"] = "1"
    x = np.ascontiguousarray(mnist_splits().test.x[:1], dtype=np.float32)
    modes = ("batched", "commit")
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bundle = Path(args.bundle) if args.bundle else fit_bundle_for_shipped_model(work)
        agents = {m: start_agent(work, bundle, {"durability": m}, env) for m in modes}
        try:
            for _ in range(max(1, args.rounds)):
                for m in modes:
                    _, port = agents[m]
                    runs[m].append(measure(port, request_bytes(port, x), args.concurrency, args.seconds))
        finally:
            for proc, _ in agents.values():
                proc.terminate()
                proc.wait(timeout=60)
    med = {m: {k: float(np.median([r[k] for r in runs[m]])) for k in runs[m][0]} for m in modes}
    ratio = {k: med["commit"][k] / med["batched"][k] for k in ("p50_ms", "p99_ms", "requests_per_s")}
    if args.json:
        print(json.dumps({"modes": med, "commit_over_batched": ratio}, indent=2))
        return 0
    print(f"labels.durability, serve mode, SQLite store, concurrency {args.concurrency}, 1 image per request")
    print(f"{'mode':<8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'failed':>7}")
    for m in modes:
        r = med[m]
        print(f"{m:<8} {r['requests_per_s']:>8.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['failures']:>7.0f}")
    print(
        f"commit / batched: p50 {ratio['p50_ms']:.2f}x, p99 {ratio['p99_ms']:.2f}x, "
        f"throughput {ratio['requests_per_s']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
