"""Polls an evaluator's liveness probe and ``/metrics`` from a process of its own, until its standard input
closes; then prints the slowest answer of each and the failed probes as one JSON line.

A probe must run outside the process that serves the hostile answers (:mod:`bench.fleet.hostile_prometheus`):
building a 33 MB answer there holds that process's GIL for most of a second, and a probe thread beside it
would time the bench's own pause, not the evaluator's.

Run: ``python -m bench.fleet.probe URL [--poll 0.2] [--timeout 10]`` (closing its stdin stops it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

PATHS = ("/v2/health/live", "/metrics")


@dataclass
class Slowest:
    """The slowest answer per path and the failed probes (a status other than 200, or no answer)."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PATHS, 0.0))
    answers: int = 0
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, path: str, took: float, ok: bool) -> None:
        with self.lock:
            self.seconds[path] = max(self.seconds[path], took)
            self.answers += ok
            self.failures += not ok


def _poll(url: str, path: str, every: float, timeout: float, stop: threading.Event, out: Slowest) -> None:
    with httpx.Client(timeout=timeout) as client:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                ok = client.get(url + path).status_code == 200
            except httpx.HTTPError:
                ok = False
            out.add(path, time.monotonic() - t0, ok)
            stop.wait(every)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet.probe", description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--poll", type=float, default=0.2, help="seconds between probes of one path")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds a probe waits for its answer")
    args = ap.parse_args(argv)
    stop, out = threading.Event(), Slowest()
    threads = [
        threading.Thread(target=_poll, args=(args.url, p, args.poll, args.timeout, stop, out), daemon=True)
        for p in PATHS
    ]
    for t in threads:
        t.start()
    print("started", flush=True)
    sys.stdin.read()  # until the parent closes it
    stop.set()
    for t in threads:
        t.join(args.timeout * 2)
    live, metrics = out.seconds[PATHS[0]], out.seconds[PATHS[1]]
    print(json.dumps({"live_max": live, "metrics_max": metrics, "answers": out.answers, "failures": out.failures}))
    return 0


class ProbeProcess:
    """``python -m bench.fleet.probe`` as a child process: started on entering, its figures read on leaving
    (:attr:`result`)."""

    def __init__(self, url: str, poll: float = 0.2, timeout: float = 10.0) -> None:
        self.argv = [sys.executable, "-m", "bench.fleet.probe", url, "--poll", str(poll), "--timeout", str(timeout)]
        self.timeout = timeout
        self.result: dict[str, float] = {}
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ProbeProcess:
        self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "started":  # polling before the case begins
            raise RuntimeError("the probe process did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        out, _ = self._proc.communicate("", timeout=self.timeout * 3)
        line = out.strip().splitlines()[-1] if out.strip() else "{}"
        self.result = json.loads(line)


if __name__ == "__main__":
    sys.exit(main())
