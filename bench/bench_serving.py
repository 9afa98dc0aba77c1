"""Benchmark: the sidecar in ``serve`` mode against a bare onnxruntime + uvicorn V2 endpoint.

Both servers run the same model (the shipped MNIST CNN) as subprocesses with the same uvicorn
defaults (one worker, uvloop + httptools, no access log) and one onnxruntime thread per session
(``ICOS_AGENT_ORT_THREADS=1`` for both); requests use binary tensors, and the agent is asked for the
same outputs as the bare server returns (probabilities and label), plus a second agent measurement
with every output including ``icos_verdict``. The bare server decodes the binary request, runs the
model in Starlette's thread pool, applies softmax and answers: no validation, no judging.

Load: this process (separate from both servers) runs a small asyncio HTTP client (keep-alive
connections, pre-encoded requests) at concurrency 1 and 16 with batches of 1 and 32; the servers
are measured one after the other, interleaved, ``--rounds`` times, and the medians are reported.
On a 2-core machine the client needs about as much CPU as a server, so throughput is bounded by
the client too; the server's own CPU time per request (from ``/proc``, every thread of the server
process) is reported as well: it does not depend on the client or on other load on the machine.

Prints, per setting: throughput (requests/s), p50/p99 latency, server CPU ms per request, and the
ratio agent / bare (target ≥ 0.9 on throughput); the server CPU per request split by thread (the
event loop, the agent's named threads ``icos-worker``/``icos-judge``/``icos-store``, see
:mod:`agent.core.os_threads`, and the others); then the agent's resident memory after start
(target ≤ 300 MB) and its time from process start to ready (target ≤ 3 s), and whether mlflow was
imported on the serve path (it must not be).

    .venv/bin/python bench/bench_serving.py [--seconds 4] [--rounds 3] [--bundle DIR] [--json]
        [--server-cpus 0-7 --client-cpus 8-15]
    .venv/bin/python -m bench serving
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.http_exchange import exchange  # noqa: E402 - run as a script too
from bench.serving_models import MODELS, BenchModel, agent_config, fit_model_bundle, measure_proxy  # noqa: E402

# -- the bare server --------------------------------------------------------------------------------


def bare_app(model_path: str) -> Any:
    """A minimal V2 endpoint: binary-tensor infer + readiness, no validation beyond the essentials."""
    from starlette.concurrency import run_in_threadpool

    from invariants.onnx_session import OnnxSession

    session = OnnxSession(model_path)
    in_name = session.inputs[0].name
    out_name = session.outputs[0].name

    def predict(x: np.ndarray) -> tuple[bytes, bytes]:
        (scores,) = session.run({in_name: x}, [out_name])
        z = scores - scores.max(axis=1, keepdims=True)
        e = np.exp(z)
        probs = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
        return probs.tobytes(), probs.argmax(axis=1).astype(np.int64).tobytes()

    async def read_body(receive: Any) -> bytes:
        chunks = []
        while True:
            m = await receive()
            chunks.append(m.get("body", b""))
            if not m.get("more_body"):
                return b"".join(chunks)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                if m["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif m["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        if path.endswith("/infer"):
            body = await read_body(receive)
            headers = dict(scope["headers"])
            n = int(headers[b"inference-header-content-length"])
            head = json.loads(body[:n])
            inp = head["inputs"][0]
            x = np.frombuffer(body[n:], dtype=np.float32).reshape(inp["shape"])
            p, label = await run_in_threadpool(predict, x)
            k = len(p) // 4 // x.shape[0]
            out = {
                "model_name": "mnist",
                "outputs": [
                    {
                        "name": "probabilities",
                        "datatype": "FP32",
                        "shape": [x.shape[0], k],
                        "parameters": {"binary_data_size": len(p)},
                    },
                    {
                        "name": "label",
                        "datatype": "INT64",
                        "shape": [x.shape[0]],
                        "parameters": {"binary_data_size": len(label)},
                    },
                ],
            }
            text = json.dumps(out).encode()
            payload = text + p + label
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/octet-stream"),
                        (b"inference-header-content-length", str(len(text)).encode()),
                        (b"content-length", str(len(payload)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": payload})
            return
        await read_body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"ready": true}'})

    return app


def run_bare(port: int, model_path: str) -> None:
    import uvicorn

    uvicorn.run(bare_app(model_path), host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- load generation --------------------------------------------------------------------------------


def request_bytes(port: int, model: str, x: np.ndarray, outputs: tuple[str, ...] | None = None) -> bytes:
    head: dict[str, Any] = {
        "inputs": [
            {"name": "input", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
        ],
        "parameters": {"binary_data_output": True},
    }
    if outputs:
        head["outputs"] = [{"name": o, "parameters": {"binary_data": True}} for o in outputs]
    text = json.dumps(head).encode()
    body = text + x.tobytes()
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(text)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _one_connection(port: int, req: bytes, stop_at: float, latencies: list[float], errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            status = await exchange(reader, writer, req)
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                errors.append(status)
    finally:
        writer.close()


async def _drive(port: int, req: bytes, concurrency: int, seconds: float) -> tuple[list[float], list[int], float]:
    latencies: list[float] = []
    errors: list[int] = []
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    await asyncio.gather(*[_one_connection(port, req, stop_at, latencies, errors) for _ in range(concurrency)])
    return latencies, errors, time.perf_counter() - t0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of every thread of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: Thread groups of :func:`thread_cpu_seconds`, in report order.
THREAD_GROUPS: tuple[str, ...] = ("loop", "icos-worker", "icos-judge", "icos-store", "other")


def thread_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """Every live thread of ``pid``: its group (:data:`THREAD_GROUPS`: the main thread is the event
    loop, the agent's named threads (:mod:`agent.core.os_threads`) by name, the rest ``other``, e.g. the
    bare server's unnamed workers) and its CPU seconds so far, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        group = "loop" if task.name == str(pid) else comm if comm in THREAD_GROUPS else "other"
        out[int(task.name)] = (group, (int(fields[11]) + int(fields[12])) / tick)
    return out


def thread_cpu_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per group between two :func:`thread_cpu_seconds` snapshots, over the threads alive
    at the second one (a worker thread that ended in between is missing from both sums)."""
    out = dict.fromkeys(THREAD_GROUPS, 0.0)
    for tid, (group, seconds) in after.items():
        out[group] += seconds - before.get(tid, (group, 0.0))[1]
    return out


def measure(
    port: int, req: bytes, concurrency: int, seconds: float, batch: int, pid: int | None = None
) -> dict[str, float]:
    asyncio.run(_drive(port, req, concurrency, min(1.0, seconds / 4)))  # warm-up
    cpu0 = cpu_seconds(pid) if pid is not None else 0.0
    threads0 = thread_cpu_seconds(pid) if pid is not None else {}
    lat, errors, elapsed = asyncio.run(_drive(port, req, concurrency, seconds))
    cpu = cpu_seconds(pid) - cpu0 if pid is not None else float("nan")
    threads = thread_cpu_delta(threads0, thread_cpu_seconds(pid)) if pid is not None else {}
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, e.g. status {errors[0]}")
    lat_ms = np.asarray(lat) * 1000
    return {
        "requests_per_s": len(lat) / elapsed,
        "samples_per_s": len(lat) * batch / elapsed,
        "p50_ms": float(np.percentile(lat_ms, 50)),
        "p99_ms": float(np.percentile(lat_ms, 99)),
        "server_cpu_ms_per_request": 1000 * cpu / max(1, len(lat)),
        **{f"cpu_ms_per_request_{k}": 1000 * v / max(1, len(lat)) for k, v in threads.items()},
    }


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per-key median over rounds."""
    return {k: float(statistics.median(r[k] for r in runs)) for k in runs[0]}


# -- process management -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> float:
    import http.client

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}"
            )
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/v2/health/ready")
            if c.getresponse().status == 200:
                return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.01)
    raise TimeoutError("server not ready")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def ensure_bundle(path: str | None, workdir: Path) -> Path:
    if path:
        return Path(path)
    from agent.data.datasets import mnist_splits
    from agent.data.files import Dataset
    from agent.model.classifier import OnnxClassifier, default_model_path
    from agent.offline.fit import fit_bundle

    s = mnist_splits()
    model = OnnxClassifier.load(default_model_path())
    report = fit_bundle(model, Dataset(s.train.x, s.train.y), Dataset(s.val.x, s.val.y))  # paper defaults
    out = workdir / "bundle"
    report.bundle.save(out)
    return out


def serve_path_modules() -> dict[str, bool]:
    """Heavy modules imported when the serve command builds its app (mlflow must be absent)."""
    code = (
        "import sys, json\n"
        "from agent.commands import serve\n"
        "from agent.server.app import create_app\n"
        "print(json.dumps({m: m in sys.modules for m in ('mlflow', 'sklearn', 'torch', 'apscheduler', 'matplotlib')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return dict(json.loads(out.stdout))


def cpu_list(text: str) -> set[int]:
    """``0-3,6`` → {0, 1, 2, 3, 6} (the ``taskset -c`` syntax)."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, dash, hi = part.strip().partition("-")
            cpus.update(range(int(lo), int(hi if dash else lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a CPU list like 0-3 or 0,2") from None
    if not cpus or min(cpus) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a CPU list like 0-3 or 0,2")
    return cpus


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="measuring time per setting and server")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds per setting (medians reported)")
    ap.add_argument("--bundle", help="bundle directory for the MNIST CNN (default: fit one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--server-cpus",
        type=cpu_list,
        metavar="LIST",
        help="pin both servers to these CPUs, e.g. 0-3 or 0,2 (default: not pinned); with --client-cpus, the load "
        "generator and the servers no longer share cores and throughput compares fairly too",
    )
    ap.add_argument("--client-cpus", type=cpu_list, metavar="LIST", help="pin the load generator to these CPUs")
    ap.add_argument("--bare-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument(
        "--model", choices=(*MODELS, "all"), default="all", help="the model to serve (default: all, one after another)"
    )
    ap.add_argument("--resnet-bundle", help="bundle directory for the ResNet (default: fit one)")
    ap.add_argument("--no-proxy", action="store_true", help="skip the proxy-mode measurement")
    ap.add_argument("--bare-model", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from agent.model.classifier import default_model_path

    available = os.sched_getaffinity(0)
    for flag, cpus in (("--server-cpus", args.server_cpus), ("--client-cpus", args.client_cpus)):
        if cpus is not None and not cpus <= available:
            ap.error(f"{flag}: CPUs {sorted(cpus - available)} are not available here ({sorted(available)})")
    if args.client_cpus is not None:
        os.sched_setaffinity(0, args.client_cpus)
    pin = None if args.server_cpus is None else (lambda: os.sched_setaffinity(0, args.server_cpus))

    if args.bare_server:
        run_bare(args.bare_server, args.bare_model or str(default_model_path()))
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICOS_AGENT_")}
    env["ICOS_AGENT_ORT_THREADS"] = "1"
    names = list(MODELS) if args.model == "all" else [args.model]
    bundles = {"mnist": args.bundle, "resnet": args.resnet_bundle}
    everything = {name: run_model(args, MODELS[name], bundles[name], env, pin) for name in names}
    if args.json:
        print(json.dumps(everything, indent=2))
        return 0
    for name, results in everything.items():
        print(f"== model {name} ({MODELS[name].file_name}) ==")
        print_results(results)
    return 0


def run_model(
    args: argparse.Namespace, bm: BenchModel, bundle_arg: str | None, env: dict[str, str], pin: Any
) -> dict[str, Any]:
    """Every setting for one model: the agent in serve mode (with and without verdicts) against the
    bare server, then the agent in proxy mode in front of the bare server."""
    import yaml

    model = str(bm.path)
    x_all = bm.data().test.x
    results: dict[str, Any] = {"model": bm.name, "settings": [], "rounds": max(1, args.rounds), "seconds": args.seconds}
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(bundle_arg) if bundle_arg else fit_model_bundle(bm, Path(tmp) / "bundle")
        agent_port, bare_port = free_port(), free_port()
        cfg = Path(tmp) / "agent.yaml"
        cfg.write_text(yaml.safe_dump(agent_config("serve", bm, bundle, agent_port, None)))
        agent = subprocess.Popen(
            [sys.executable, "-m", "agent", "serve", "--config", str(cfg)],
            cwd=ROOT,
            env=env,
            preexec_fn=pin,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            results["agent_start_to_ready_s"] = wait_ready(agent_port, agent)
            time.sleep(0.2)
            results["agent_rss_after_start_mb"] = rss_mb(agent.pid)
            bare = subprocess.Popen(
                [sys.executable, str(Path(__file__)), "--bare-server", str(bare_port), "--bare-model", model],
                cwd=ROOT,
                env=env,
                preexec_fn=pin,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            try:
                wait_ready(bare_port, bare)
                for concurrency in (1, 16):
                    for batch in (1, 32):
                        x = np.ascontiguousarray(x_all[:batch], dtype=np.float32)
                        same = request_bytes(agent_port, bm.name, x, ("probabilities", "label"))
                        every = request_bytes(agent_port, bm.name, x)
                        plain = request_bytes(bare_port, bm.name, x)
                        runs: tuple[list[dict[str, float]], ...] = ([], [], [])
                        for _ in range(max(1, args.rounds)):
                            runs[0].append(measure(agent_port, same, concurrency, args.seconds, batch, agent.pid))
                            runs[1].append(measure(agent_port, every, concurrency, args.seconds, batch, agent.pid))
                            runs[2].append(measure(bare_port, plain, concurrency, args.seconds, batch, bare.pid))
                        a, v, b = (median_of(r) for r in runs)
                        results["settings"].append(
                            {
                                "concurrency": concurrency,
                                "batch": batch,
                                "agent": a,
                                "agent_with_verdict": v,
                                "bare": b,
                                "throughput_ratio": a["requests_per_s"] / b["requests_per_s"],
                                "throughput_ratio_with_verdict": v["requests_per_s"] / b["requests_per_s"],
                                "cpu_ratio": a["server_cpu_ms_per_request"] / b["server_cpu_ms_per_request"],
                                "cpu_ratio_with_verdict": v["server_cpu_ms_per_request"]
                                / b["server_cpu_ms_per_request"],
                            }
                        )
                results["agent_rss_after_load_mb"] = rss_mb(agent.pid)
                agent.terminate()
                results["agent_exit_code_on_sigterm"] = agent.wait(timeout=60)
                if not args.no_proxy:
                    results["proxy"] = measure_proxy(
                        lambda c: start_agent(c, Path(tmp) / "proxy.yaml", env, pin),
                        stop_process,
                        measure,
                        request_bytes,
                        bm,
                        bundle,
                        (free_port(), bare_port),
                        bare.pid,
                        x_all,
                        args.seconds,
                        args.rounds,
                    )
            finally:
                stop_process(bare)
        finally:
            stop_process(agent)
    results["serve_path_imports"] = serve_path_modules()
    results["server_cpus"] = sorted(args.server_cpus) if args.server_cpus else None
    results["client_cpus"] = sorted(args.client_cpus) if args.client_cpus else None
    return results


def print_results(results: dict[str, Any]) -> None:
    """The tables, the headline ratios and the targets of one model."""
    print("agent: same outputs as bare (probabilities, label; judged off the request path);")
    print("agent+v: all outputs incl. icos_verdict (judged in the request path)")
    rounds, seconds = results["rounds"], results["seconds"]
    print(f"medians of {rounds} interleaved round(s) of {seconds:g} s; cpu = server CPU ms/request")
    head = f"{'req/s':>7} {'p50 ms':>6} {'p99 ms':>6} {'cpu':>5}"
    print(f"{'conc':>4} {'batch':>5} | agent {head} | agent+v {head} | bare {head} | {'ratio':>5} {'ratio+v':>7}")
    for s in results["settings"]:
        a, v, b = s["agent"], s["agent_with_verdict"], s["bare"]
        cells = [
            f"{r['requests_per_s']:>7.0f} {r['p50_ms']:>6.2f} {r['p99_ms']:>6.2f} "
            f"{r['server_cpu_ms_per_request']:>5.2f}"
            for r in (a, v, b)
        ]
        print(
            f"{s['concurrency']:>4} {s['batch']:>5} | agent {cells[0]} | agent+v {cells[1]} | bare {cells[2]} | "
            f"{s['throughput_ratio']:>5.2f} {s['throughput_ratio_with_verdict']:>7.2f}"
        )
    print("server CPU ms/request by thread (loop = event loop; other = unnamed threads, e.g. bare's workers):")
    for s in results["settings"]:
        for label, r in (("agent", s["agent"]), ("agent+v", s["agent_with_verdict"]), ("bare", s["bare"])):
            split = " ".join(f"{k} {r.get(f'cpu_ms_per_request_{k}', float('nan')):.3f}" for k in THREAD_GROUPS)
            print(f"{s['concurrency']:>4} {s['batch']:>5} | {label:<7} | {split}")
    print("server CPU per request, agent / bare (the headline: it does not depend on the load generator):")
    for s in results["settings"]:
        print(
            f"{s['concurrency']:>4} {s['batch']:>5} | agent {s['cpu_ratio']:.2f} (target <= 1.10) | "
            f"agent+v {s['cpu_ratio_with_verdict']:.2f} (target <= 1.30)"
        )
    worst, worst_v = (
        max(s["cpu_ratio"] for s in results["settings"]),
        max(s["cpu_ratio_with_verdict"] for s in results["settings"]),
    )
    print(
        f"CPU ratio, worst setting: agent {worst:.2f} {'met' if worst <= 1.10 else 'MISSED'}; "
        f"agent+v {worst_v:.2f} {'met' if worst_v <= 1.30 else 'MISSED'}"
    )
    pinned = results["server_cpus"] is not None and results["client_cpus"] is not None
    print(
        f"pinned: servers on {results['server_cpus']}, load generator on {results['client_cpus']}"
        if pinned
        else "not pinned (--server-cpus/--client-cpus): throughput ratios share cores with the load generator"
    )
    ratios = [s["throughput_ratio"] for s in results["settings"]]
    print(f"throughput ratio agent/bare: min {min(ratios):.2f}, median {statistics.median(ratios):.2f} (target >= 0.9)")
    print(
        f"agent RSS after start: {results['agent_rss_after_start_mb']:.0f} MB (target <= 300 MB); "
        f"after load: {results['agent_rss_after_load_mb']:.0f} MB"
    )
    print(f"agent start to ready: {results['agent_start_to_ready_s']:.2f} s (target <= 3 s)")
    print(f"imported on the serve path: {results['serve_path_imports']}")
    print(f"agent exit code after SIGTERM: {results['agent_exit_code_on_sigterm']}")
    print_proxy_and_misses(results)


def print_proxy_and_misses(results: dict[str, Any]) -> None:
    """Proxy-mode figures, and for each CPU-ratio target missed, where the agent's extra CPU goes."""
    for s in results["settings"]:
        for key, label, target in (("cpu_ratio", "agent", 1.10), ("cpu_ratio_with_verdict", "agent+v", 1.30)):
            if s[key] > target:
                r = s["agent" if label == "agent" else "agent_with_verdict"]
                b = s["bare"]
                extra = {k: r.get(f"cpu_ms_per_request_{k}", 0.0) for k in THREAD_GROUPS}
                extra["loop"] -= b.get("cpu_ms_per_request_loop", 0.0)
                extra["model threads"] = -b.get("cpu_ms_per_request_other", 0.0) + extra.pop("icos-worker")
                split = ", ".join(f"{k} {v:+.3f}" for k, v in extra.items())
                print(
                    f"  missed {label} {s[key]:.2f} > {target:.2f} at conc {s['concurrency']} batch {s['batch']}: "
                    f"extra CPU ms/request vs bare by thread: {split}"
                )
    for p in results.get("proxy", []):
        print(
            f"proxy mode, conc 1 batch {p['batch']:>2}: p50 {p['proxy']['p50_ms']:.2f} ms "
            f"vs bare {p['bare']['p50_ms']:.2f} ms "
            f"(added {p['added_p50_ms']:+.2f} ms, target <= 1 ms: {'met' if p['added_p50_ms'] <= 1.0 else 'MISSED'}); "
            f"p99 {p['proxy']['p99_ms']:.2f} vs {p['bare']['p99_ms']:.2f} ms; server CPU (agent + bare) / bare "
            f"{p['cpu_ratio']:.2f} (agent {p['agent_cpu_ms_per_request']:.2f} ms/request)"
        )


def start_agent(cfg: dict[str, Any], path: Path, env: dict[str, str], pin: Any) -> subprocess.Popen[bytes]:
    """Start ``icos-agent serve`` with ``cfg`` (written to ``path``) and wait until it is ready."""
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "serve", "--config", str(path)],
        cwd=ROOT,
        env=env,
        preexec_fn=pin,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_ready(int(cfg["server"]["port"]), proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
