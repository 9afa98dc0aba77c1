"""Soak: ``python -m bench.soak [--requests 200000 --concurrency 32 --seconds 600] [--quick] [--json]``.

Starts the agent (``python -m agent serve``, serve mode, state directory, loopback only) and a
separate load process (:mod:`bench.soak.load`) that sends a seeded mix of valid and invalid V2
requests, bounded in count and in time. While it runs, the agent's resident memory, open file
descriptors and threads are sampled from ``/proc``. Reports: requests, 5xx count, status mix,
p50/p99 latency, throughput, resident memory growth after warm-up (target ≤ 10 %), descriptor
growth (target 0 beyond a small slack) and the agent's exit status after SIGTERM.

``--quick`` (a few thousand requests at concurrency 8) is what the test suite runs.
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.serving.__main__ import ensure_bundle, free_port, rss_mb, wait_ready

RSS_GROWTH_TARGET = 0.10
FD_SLACK = 4


def _proc_counts(pid: int) -> tuple[float, int, int]:
    threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss_mb(pid), len(os.listdir(f"/proc/{pid}/fd")), threads


def _agent_config(bundle_dir: Path, port: int, work: Path) -> dict[str, Any]:
    """The served agent's configuration: the shipped CNN, MLflow off, state flushed every 2 s."""
    from agent.model.classifier import default_model_path

    return {
        "model": {"name": "mnist", "path": str(default_model_path())},
        "bundle": {"path": str(bundle_dir)},
        "server": {"host": "127.0.0.1", "port": port, "max_batch": 64},
        "state_dir": str(work / "state"),
        "state": {"flush_interval_seconds": 2.0},
        "windows": {"time": ["5m", "1h"], "count": 10000},
        "audits": {"mlflow": {"enabled": False}},
        "log_level": "warning",
    }


def _with_growth(
    result: dict[str, Any], samples: list[tuple[float, float, int, int]], concurrency: int
) -> dict[str, Any]:
    """``result`` with the agent's memory, descriptors and threads after the warm-up and at the end, and
    the targets met."""
    warm_at = result.get("warm_at") or samples[0][0]
    base = next((s for s in samples if s[0] >= warm_at), samples[-1])
    final = samples[-1]
    result.update(
        {
            "concurrency": concurrency,
            "rss_mb_after_warmup": round(base[1], 1),
            "rss_mb_final": round(final[1], 1),
            "rss_mb_peak": round(max(s[1] for s in samples), 1),
            "rss_growth": (final[1] - base[1]) / base[1] if base[1] else 0.0,
            "fds_after_warmup": base[2],
            "fds_final": final[2],
            "threads_after_warmup": base[3],
            "threads_final": final[3],
        }
    )
    result["targets"] = {
        "no_5xx": result["server_errors"] == 0,
        "valid_all_200": result["valid_not_200"] == 0,
        "invalid_all_4xx": result["invalid_not_4xx"] == 0,
        "rss_growth_le_10pct": result["rss_growth"] <= RSS_GROWTH_TARGET,
        "no_fd_growth": result["fds_final"] <= result["fds_after_warmup"] + FD_SLACK,
        "clean_exit": result["agent_exit"] == 0,
    }
    return result


def run_soak(requests: int, concurrency: int, seconds: float, bundle: str | None, warmup: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="icos-soak-") as tmp:
        work = Path(tmp)
        bundle_dir = ensure_bundle(bundle, work)
        port = free_port()
        cfg = _agent_config(bundle_dir, port, work)
        (work / "agent.yaml").write_text(yaml.safe_dump(cfg))
        env = {k: v for k, v in os.environ.items() if not k.startswith("ICOS_AGENT_")}
        log = (work / "agent.log").open("wb")
        agent = subprocess.Popen(
            [sys.executable, "-m", "agent", "serve", "--config", str(work / "agent.yaml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        samples: list[tuple[float, float, int, int]] = []
        stop = threading.Event()
        try:
            wait_ready(port, agent)

            def sample() -> None:
                while not stop.is_set():
                    try:
                        samples.append((time.time(), *_proc_counts(agent.pid)))
                    except OSError:
                        return
                    stop.wait(0.5)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            load = subprocess.run(
                [sys.executable, "-m", "bench.soak.load", "--port", str(port), "--requests", str(requests)]
                + ["--concurrency", str(concurrency), "--seconds", str(seconds), "--warmup", str(warmup)],
                capture_output=True,
                text=True,
                timeout=seconds + 120,
                env=env,
            )
            time.sleep(1.0)  # let the last connections close
            samples.append((time.time(), *_proc_counts(agent.pid)))
            stop.set()
            sampler.join(timeout=5)
            if load.returncode != 0:
                raise RuntimeError(f"load generator failed: {load.stderr[-2000:]}")
            result: dict[str, Any] = json.loads(load.stdout.strip().splitlines()[-1])
            agent.send_signal(signal.SIGTERM)
            result["agent_exit"] = agent.wait(timeout=60)
        finally:
            stop.set()
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            log.close()
        return _with_growth(result, samples, concurrency)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=float, default=600.0, help="upper bound on the load phase")
    p.add_argument("--warmup", type=float, default=0.1, help="share of the requests before the memory baseline")
    p.add_argument("--bundle", help="bundle directory (default: fitted now for the shipped MNIST CNN)")
    p.add_argument("--quick", action="store_true", help="3,000 requests at concurrency 8 (smoke test)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.requests, a.concurrency, a.seconds, a.warmup = 3000, 8, min(a.seconds, 120.0), 0.3
    r = run_soak(a.requests, a.concurrency, a.seconds, a.bundle, a.warmup)
    if a.json:
        print(json.dumps(r))
    else:
        print(
            f"requests {r['requests']} in {r['seconds']:.1f} s ({r['throughput']:.0f}/s), "
            f"concurrency {r['concurrency']}"
        )
        print(f"5xx {r['server_errors']}, status {r['status']}, connection errors {r['connection_errors']}")
        print(f"latency p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, max {r['max_ms']:.1f} ms")
        print(
            f"RSS after warm-up {r['rss_mb_after_warmup']} MB, final {r['rss_mb_final']} MB "
            f"({r['rss_growth'] * 100:+.1f} %), peak {r['rss_mb_peak']} MB"
        )
        print(
            f"fds {r['fds_after_warmup']} -> {r['fds_final']}, "
            f"threads {r['threads_after_warmup']} -> {r['threads_final']}"
        )
        print(f"agent exit after SIGTERM: {r['agent_exit']}")
        print("targets: " + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in r["targets"].items()))
    return 0 if all(r["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
