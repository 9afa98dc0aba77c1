"""Benchmark: the sidecar in ``serve`` mode against a bare onnxruntime + uvicorn V2 endpoint.

Both servers run the same model (the shipped MNIST CNN, and a ResNet-style CNN: ``--model``) as
subprocesses with the same uvicorn defaults (one worker, uvloop + httptools, no access log) and one
onnxruntime thread per session (``ICOS_AGENT_ORT_THREADS=1`` for both); requests use binary tensors
over HTTP and raw contents over gRPC (``--protocol``: both by default, each against the bare server
over the same protocol), and the agent is asked for the same outputs as the bare server returns
(probabilities and label), plus a second agent measurement with every output including
``icos_verdict``. The bare server (:mod:`bench.serving.bare_server`) decodes the request, runs the model in a
worker thread, applies softmax and answers: no validation, no judging.

Load: this process (separate from both servers) runs a small asyncio HTTP client (keep-alive
connections, pre-encoded requests) or a ``grpc.aio`` client (:mod:`bench.serving.grpc_load`) at concurrency
1 and 16 with batches of 1 and 32; the servers
are measured one after the other, interleaved, ``--rounds`` times, and the medians are reported.
On a 2-core machine the client needs about as much CPU as a server, so throughput is bounded by
the client too; the server's own CPU time per request (from ``/proc``, every thread of the server
process) is reported as well: it does not depend on the client or on other load on the machine.

Prints, per setting: throughput (requests/s), p50/p99 latency, server CPU ms per request and the
throughput ratio agent / bare; the server CPU per request split by thread (the event loop, the
agent's named threads ``icos-worker``/``icos-judge``/``icos-store``, see :mod:`agent.core.os_threads`,
and the others); the headline, server CPU per request agent ÷ bare against its targets (≤ 1.10, and
≤ 1.30 with verdicts), with the extra CPU by thread for every target missed; the gRPC ÷ HTTP CPU
ratios; proxy mode's added p50 (target ≤ 1 ms); then the agent's resident memory after start
(target ≤ 300 MB) and its time from process start to ready (target ≤ 3 s), and whether mlflow was
imported on the serve path (it must not be).

``--challenger-share S`` (with ``--model mnist``) measures instead what a challenger on a share ``S`` of the
requests costs the champion (its serving CPU per request and p50 latency, target: within 5%) and itself, per
prediction (:mod:`bench.serving.challenger`); ``--out`` then writes docs/challenger.md's block.

    .venv/bin/python -m bench.serving [--seconds 4] [--rounds 3] [--bundle DIR] [--json] [--out DOC]
        [--model mnist|resnet|resnet224|lightgbm|all] [--protocol http|grpc|both] [--no-proxy]
        [--server-cpus 0-7 --client-cpus 8-15] [--challenger-share 0.1 [--challenger-bundle DIR]]
    .venv/bin/python -m bench serving
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.generated_docs import provenance, write_block
from bench.http_exchange import exchange
from bench.serving.challenger import fit_challenger_bundle, measure_challenger
from bench.serving.challenger import report as challenger_report
from bench.serving.grpc_load import drive_grpc, grpc_request
from bench.serving.report import THREAD_GROUPS, markdown, print_results
from bench.serving.subjects import MODELS, BenchModel, agent_config, fit_model_bundle, measure_proxy

ROOT = Path(__file__).resolve().parents[2]

#: The block of docs/serving.md this benchmark rewrites (``--out docs/serving.md``).
DOC_BEGIN = "<!-- BEGIN GENERATED: python -m bench.serving --out docs/serving.md -->"
MODEL_TITLES = {
    "mnist": "MNIST CNN",
    "resnet": "ResNet (3×32×32)",
    "resnet224": "ResNet (3×224×224)",
    "lightgbm": "LightGBM (20 features)",
}

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
    port: int, req: Any, concurrency: int, seconds: float, batch: int, pid: int | None = None
) -> dict[str, float]:
    drive = _drive if isinstance(req, bytes) else drive_grpc  # a gRPC request is a ModelInferRequest
    asyncio.run(drive(port, req, concurrency, min(1.0, seconds / 4)))  # warm-up
    cpu0 = cpu_seconds(pid) if pid is not None else 0.0
    threads0 = thread_cpu_seconds(pid) if pid is not None else {}
    lat, errors, elapsed = asyncio.run(drive(port, req, concurrency, seconds))
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


def log_tail(proc: subprocess.Popen[bytes]) -> str:
    """The last lines a server wrote to its log file (``proc.log``), or a note that it wrote none."""
    path = getattr(proc, "log", None)
    text = path.read_text(errors="replace")[-2000:].strip() if path is not None and path.is_file() else ""
    return text or "(it wrote nothing)"


def exited(proc: subprocess.Popen[bytes]) -> str:
    """How a server process ended: its status (a signal by name: SIGKILL is often the kernel's OOM killer)."""
    code = proc.returncode
    how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited with {code}"
    return f"{how}: {log_tail(proc)}"


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> float:
    import http.client

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server {exited(proc)}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/v2/health/ready")
            if c.getresponse().status == 200:
                return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"server not ready within {timeout:g} s: {log_tail(proc)}")


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
    ap.add_argument(
        "--protocol",
        choices=("http", "grpc", "both"),
        default="both",
        help="the Open Inference Protocol's transport to measure (default: both, HTTP binary tensors and gRPC raw "
        "contents, each agent against the bare server over the same transport)",
    )
    ap.add_argument(
        "--model", choices=(*MODELS, "all"), default="all", help="the model to serve (default: all, one after another)"
    )
    ap.add_argument("--resnet-bundle", help="bundle directory for the ResNet (default: fit one)")
    ap.add_argument("--resnet224-bundle", help="bundle directory for the 224×224 ResNet (default: fit one)")
    ap.add_argument("--lightgbm-bundle", help="bundle directory for the LightGBM model (default: fit one)")
    ap.add_argument("--no-proxy", action="store_true", help="skip the proxy-mode measurement")
    ap.add_argument(
        "--challenger-share",
        type=float,
        metavar="S",
        help="with --model mnist: measure the champion's cost with a challenger on this share of its requests "
        "(and the challenger's own) instead",
    )
    ap.add_argument("--challenger-bundle", help="the challenger's bundle, fitted with --champion (default: fit one)")
    ap.add_argument(
        "--out",
        type=Path,
        metavar="DOC",
        help="also write the figures into DOC's generated block (docs/serving.md's 'Performance')",
    )
    args = ap.parse_args(argv)
    available = os.sched_getaffinity(0)
    for flag, cpus in (("--server-cpus", args.server_cpus), ("--client-cpus", args.client_cpus)):
        if cpus is not None and not cpus <= available:
            ap.error(f"{flag}: CPUs {sorted(cpus - available)} are not available here ({sorted(available)})")
    if args.client_cpus is not None:
        os.sched_setaffinity(0, args.client_cpus)
    pin = None if args.server_cpus is None else (lambda: os.sched_setaffinity(0, args.server_cpus))

    env = {k: v for k, v in os.environ.items() if not k.startswith("ICOS_AGENT_")}
    env["ICOS_AGENT_ORT_THREADS"] = "1"
    if args.challenger_share is not None:
        return run_challenger(args, argv, env, pin)
    names = list(MODELS) if args.model == "all" else [args.model]
    bundles = {
        "mnist": args.bundle,
        "resnet": args.resnet_bundle,
        "resnet224": args.resnet224_bundle,
        "lightgbm": args.lightgbm_bundle,
    }
    everything = {name: run_model(args, MODELS[name], bundles[name], env, pin) for name in names}
    if args.out is not None:
        command = "python -m bench.serving " + " ".join(argv if argv is not None else sys.argv[1:])
        generated = provenance(command, ROOT) + "\n\n" + markdown(everything, MODEL_TITLES)
        write_block(args.out, DOC_BEGIN, generated)
    if args.json:
        print(json.dumps(everything, indent=2))
        return 1 if any(r["errors"] for r in everything.values()) else 0
    for name, results in everything.items():
        print(f"== model {name} ({MODELS[name].file_name}) ==")
        print_results(results)
    failed = [f"{name}: {e['setting']}" for name, r in everything.items() for e in r["errors"]]
    if failed:
        print(f"{len(failed)} setting(s) failed (their causes above): {'; '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


#: The block of docs/challenger.md the challenger setting rewrites (``--challenger-share 0.1 --out ...``).
CHALLENGER_DOC_BEGIN = (
    "<!-- BEGIN GENERATED: python -m bench.serving --model mnist --challenger-share 0.1 --out docs/challenger.md -->"
)


def run_challenger(args: argparse.Namespace, argv: list[str] | None, env: dict[str, str], pin: Any) -> int:
    """The challenger setting (:mod:`bench.serving.challenger`)."""
    if args.model != "mnist" or not 0 < args.challenger_share <= 1:
        print("error: --challenger-share in (0, 1] applies to --model mnist", file=sys.stderr)
        return 2
    bm = MODELS["mnist"]
    with tempfile.TemporaryDirectory() as tmp:
        bundle = ensure_bundle(args.bundle, Path(tmp))
        if args.challenger_bundle:
            challenger = Path(args.challenger_bundle)
        else:
            challenger = fit_challenger_bundle(Path(tmp) / "challenger", bm.path)
        results = measure_challenger(
            lambda cfg, name: start_agent(cfg, Path(tmp) / name, env, pin),
            stop_process,
            _drive,
            cpu_seconds,
            request_bytes,
            lambda port: agent_config("serve", bm, bundle, port, None),
            (free_port(), free_port()),
            challenger,
            bm.data().test.x,
            share=args.challenger_share,
            seconds=args.seconds,
            rounds=args.rounds,
        )
    text = challenger_report(results)
    if args.out is not None:
        command = "python -m bench.serving " + " ".join(argv if argv is not None else sys.argv[1:])
        write_block(args.out, CHALLENGER_DOC_BEGIN, provenance(command, ROOT) + "\n\n" + text)
    print(json.dumps(results, indent=2) if args.json else text)
    return 0


def failure(exc: BaseException) -> str:
    """An exception as one line naming its type and cause (a bare ``TimeoutError()`` says nothing alone)."""
    text = str(exc).strip() or repr(exc)
    return f"{type(exc).__name__}: {text}"


def run_model(
    args: argparse.Namespace, bm: BenchModel, bundle_arg: str | None, env: dict[str, str], pin: Any
) -> dict[str, Any]:
    """Every setting for one model: the agent in serve mode (with and without verdicts) against the
    bare server, then the agent in proxy mode in front of the bare server. A setting that fails is
    recorded in ``errors`` (the setting and its cause) and the others still run."""
    results: dict[str, Any] = {"model": bm.name, "settings": [], "rounds": max(1, args.rounds), "seconds": args.seconds}
    results["errors"] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            x_all = bm.data().test.x
            bundle = Path(bundle_arg) if bundle_arg else fit_model_bundle(bm, Path(tmp) / "bundle")
        except Exception as exc:
            results["errors"].append({"setting": "the model, its data and its bundle", "error": failure(exc)})
            return results
        try:
            serve_mode(args, bm, bundle, x_all, Path(tmp), env, pin, results)
        except Exception as exc:
            results["errors"].append({"setting": "serve mode: the agent or the bare server", "error": failure(exc)})
        if not args.no_proxy:
            try:
                proxy_bundle = bundle
                if bm.proxy_features is not None:  # the served bundle reads the model's own layers
                    proxy_bundle = fit_model_bundle(bm, Path(tmp) / "proxy-bundle", bm.proxy_features)
                results["proxy"] = proxy_mode(args, bm, proxy_bundle, x_all, Path(tmp), env, pin)
            except Exception as exc:
                results["errors"].append({"setting": "proxy mode", "error": failure(exc)})
    results["serve_path_imports"] = serve_path_modules()
    results["server_cpus"] = sorted(args.server_cpus) if args.server_cpus else None
    results["client_cpus"] = sorted(args.client_cpus) if args.client_cpus else None
    return results


def popen_logged(cmd: list[str], log: Path, env: dict[str, str], pin: Any) -> subprocess.Popen[bytes]:
    """Start a server whose output goes to ``log`` (a pipe nobody reads under load would fill and stall it)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, preexec_fn=pin, stdout=out, stderr=subprocess.STDOUT)
    proc.log = log  # type: ignore[attr-defined]  # read by log_tail
    return proc


def start_bare(bm: BenchModel, env: dict[str, str], pin: Any, port: int, grpc_port: int | None, log: Path) -> Any:
    """The bare server of ``bm`` on ``port`` (and ``grpc_port``), ready; its output in ``log``."""
    cmd = [sys.executable, "-m", "bench.serving.bare_server", "--port", str(port), "--model", str(bm.path)]
    cmd += ["--scores-kind", bm.scores_kind]
    if grpc_port is not None:
        cmd += ["--grpc-port", str(grpc_port)]
    bare = popen_logged(cmd, log, env, pin)
    try:
        wait_ready(port, bare)
    except BaseException:
        stop_process(bare)
        raise
    return bare


def serve_mode(
    args: argparse.Namespace,
    bm: BenchModel,
    bundle: Path,
    x_all: np.ndarray,
    tmp: Path,
    env: dict[str, str],
    pin: Any,
    results: dict[str, Any],
) -> None:
    """The agent in serve mode against the bare server, every setting of every protocol, into ``results``."""
    agent_port, bare_port = free_port(), free_port()
    protocols = ("http", "grpc") if args.protocol == "both" else (args.protocol,)
    grpc_ports = (free_port(), free_port()) if "grpc" in protocols else (None, None)
    agent_cfg = agent_config("serve", bm, bundle, agent_port, None)
    agent_cfg["server"]["grpc_port"] = grpc_ports[0]
    t0 = time.perf_counter()
    agent = start_agent(agent_cfg, tmp / "agent.yaml", env, pin)
    try:
        results["agent_start_to_ready_s"] = time.perf_counter() - t0
        time.sleep(0.2)
        results["agent_rss_after_start_mb"] = rss_mb(agent.pid)
        bare = start_bare(bm, env, pin, bare_port, grpc_ports[1], tmp / "bare.log")
        try:
            for protocol in protocols:
                ports = (agent_port, bare_port) if protocol == "http" else grpc_ports
                results["settings"] += serve_settings(
                    args, bm.name, x_all, protocol, ports, (agent.pid, bare.pid), results["errors"]
                )
            if agent.poll() is not None:
                raise RuntimeError(f"agent {exited(agent)}")
            results["agent_rss_after_load_mb"] = rss_mb(agent.pid)
            agent.terminate()
            results["agent_exit_code_on_sigterm"] = agent.wait(timeout=60)
        finally:
            stop_process(bare)
    finally:
        stop_process(agent)


def proxy_mode(
    args: argparse.Namespace,
    bm: BenchModel,
    bundle: Path,
    x_all: np.ndarray,
    tmp: Path,
    env: dict[str, str],
    pin: Any,
) -> list[dict[str, Any]]:
    """The agent in proxy mode in front of the bare server (:func:`bench.serving.subjects.measure_proxy`)."""
    bare_port = free_port()
    bare = start_bare(bm, env, pin, bare_port, None, tmp / "bare-proxy.log")
    try:
        return measure_proxy(
            lambda c: start_agent(c, tmp / "proxy.yaml", env, pin),
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


def serve_settings(
    args: argparse.Namespace,
    model: str,
    x_all: np.ndarray,
    protocol: str,
    ports: tuple[int | None, int | None],
    pids: tuple[int, int],
    errors: list[dict[str, str]],
) -> list[dict[str, Any]]:
    """Concurrency 1 and 16, batches 1 and 32, over one protocol: the agent asked for the bare server's
    outputs, the agent asked for every output (verdicts too), and the bare server, interleaved. A setting
    that fails goes to ``errors`` and the next one runs."""
    agent_port, bare_port = ports
    assert agent_port is not None and bare_port is not None
    out = []
    for concurrency in (1, 16):
        for batch in (1, 32):
            x = np.ascontiguousarray(x_all[:batch], dtype=np.float32)
            if protocol == "http":
                same = request_bytes(agent_port, model, x, ("probabilities", "label"))
                every, plain = request_bytes(agent_port, model, x), request_bytes(bare_port, model, x)
            else:
                same = grpc_request(x, model, ("probabilities", "label"))
                every, plain = grpc_request(x, model), grpc_request(x, model)
            runs: tuple[list[dict[str, float]], ...] = ([], [], [])
            where = f"serve mode, {protocol}, concurrency {concurrency}, batch {batch}"
            try:
                for _ in range(max(1, args.rounds)):
                    for server, (port, req, pid) in enumerate(
                        ((agent_port, same, pids[0]), (agent_port, every, pids[0]), (bare_port, plain, pids[1]))
                    ):
                        who = ("agent", "agent asked for verdicts", "bare server")[server]
                        try:
                            runs[server].append(measure(port, req, concurrency, args.seconds, batch, pid))
                        except Exception as exc:
                            raise RuntimeError(f"{who}: {failure(exc)}") from exc
            except RuntimeError as exc:  # named the server and the cause above
                errors.append({"setting": where, "error": str(exc)})
                continue
            a, v, b = (median_of(r) for r in runs)
            out.append(
                {
                    "protocol": protocol,
                    "concurrency": concurrency,
                    "batch": batch,
                    "agent": a,
                    "agent_with_verdict": v,
                    "bare": b,
                    "throughput_ratio": a["requests_per_s"] / b["requests_per_s"],
                    "throughput_ratio_with_verdict": v["requests_per_s"] / b["requests_per_s"],
                    "cpu_ratio": a["server_cpu_ms_per_request"] / b["server_cpu_ms_per_request"],
                    "cpu_ratio_with_verdict": v["server_cpu_ms_per_request"] / b["server_cpu_ms_per_request"],
                }
            )
    return out


def start_agent(cfg: dict[str, Any], path: Path, env: dict[str, str], pin: Any) -> subprocess.Popen[bytes]:
    """Start ``icos-agent serve`` with ``cfg`` (written to ``path``) and wait until it is ready."""
    import yaml

    path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "agent", "serve", "--config", str(path)]
    proc = popen_logged(cmd, path.with_suffix(".log"), env, pin)
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
