"""What the hostile-serving benchmark measures from outside a serving agent.

* :class:`ServedAgent`: ``python -m agent serve`` as a real process, run from any checkout (``PYTHONPATH``
  and working directory set to it), on free loopback ports for HTTP and gRPC.
* :class:`RssPeak`: the process's peak resident memory over a span, from the kernel's high-water mark
  (``VmHWM``, reset at the start through ``/proc/<pid>/clear_refs``) and ``VmRSS`` sampled every 10 ms;
  :func:`settled_rss`: its resident memory once it stops falling after the span.
* :class:`SideClients`: the other clients, in a process of their own so that the hostile client's work
  (reading a gigabyte answer, say) does not slow them in this interpreter: a liveness probe
  (``/v2/health/live`` every 50 ms) and a batch-1 inference client (one request every 50 ms), whose
  slowest answers and failures say whether the agent kept serving everyone else.
* :class:`Runner`: measures each step of a case (a hostile client's action) with all of the above and
  keeps one :class:`Row` per step.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

HOST = "127.0.0.1"
#: The other clients' pause between two requests, and their per-request timeout.
SIDE_PERIOD = 0.05
SIDE_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def proc_status(pid: int, key: str) -> int:
    """A ``kB`` line of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} line in /proc/{pid}/status")


class ServedAgent:
    """The agent of checkout ``root`` in serve mode; its output goes to ``<directory>/agent.log``."""

    def __init__(self, root: Path, directory: Path, settings: dict[str, Any], env: dict[str, str]) -> None:
        self.root, self.dir = root, directory
        self.port, self.grpc_port = free_port(), free_port()
        cfg = dict(settings)
        cfg["server"] = {**cfg.get("server", {}), "host": HOST, "port": self.port, "grpc_port": self.grpc_port}
        self.config_path = directory / "agent.yaml"
        self.config_path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML: no writer needed
        self.log_path = directory / "agent.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ICOS_AGENT_")}
        self.env.update(env, PYTHONPATH=str(root))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def grpc_target(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 120.0) -> ServedAgent:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent", "serve", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.root,
            )
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as c:
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if c.get(f"{self.url}/v2/health/ready").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the agent did not start within {timeout:.0f} s:\n{self.log_tail()}")

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)


class RssPeak:
    """Peak resident memory of process ``pid`` between ``__enter__`` and ``__exit__``: the kernel's
    high-water mark, reset on entry (writing 5 to ``clear_refs``), and 10 ms samples of ``VmRSS`` (all
    there is where the reset is refused)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = self.peak = proc_status(pid, "VmRSS")
        self._reset = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            try:
                self.peak = max(self.peak, proc_status(self.pid, "VmRSS"))
            except (OSError, RuntimeError):  # the process ended
                return

    def __enter__(self) -> RssPeak:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            self._reset = True
        except OSError:
            self._reset = False
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        if self._reset:
            try:
                self.peak = max(self.peak, proc_status(self.pid, "VmHWM"))
            except (OSError, RuntimeError):
                pass


def settled_rss(pid: int, seconds: float) -> int | None:
    """``VmRSS`` once it has stopped falling (by less than 1 MB over the last second), or after ``seconds``;
    ``None`` if the process ended."""
    deadline = time.monotonic() + seconds
    try:
        readings = [proc_status(pid, "VmRSS")]
        while time.monotonic() < deadline:
            time.sleep(0.25)
            readings.append(proc_status(pid, "VmRSS"))
            if len(readings) > 4 and readings[-5] - readings[-1] < 1_000_000:
                break
    except (OSError, RuntimeError):
        return None
    return readings[-1]


# -- the other clients -------------------------------------------------------------------------------


@dataclass
class SideStats:
    live_n: int = 0
    live_failed: int = 0
    live_max: float = 0.0
    infer_n: int = 0
    infer_failed: int = 0
    infer_max: float = 0.0


def _loop(
    call: Callable[[], httpx.Response], stats: SideStats, kind: str, lock: threading.Lock, stop: threading.Event
) -> None:
    for _ in range(1_000_000):  # bounded; stopped by the event long before
        if stop.is_set():
            return
        t0 = time.monotonic()
        try:
            ok = call().status_code == 200
        except httpx.HTTPError:
            ok = False
        took = time.monotonic() - t0
        with lock:
            setattr(stats, f"{kind}_n", getattr(stats, f"{kind}_n") + 1)
            setattr(stats, f"{kind}_failed", getattr(stats, f"{kind}_failed") + (not ok))
            setattr(stats, f"{kind}_max", max(getattr(stats, f"{kind}_max"), took))
        stop.wait(SIDE_PERIOD)


def _side_main(url: str, model: str, infer: bool, conn: Connection) -> None:
    """The side process: the probe and the batch-1 client in two threads; ``reset``/``report``/``stop``
    commands arrive on ``conn``."""
    tensor = {"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32", "parameters": {"binary_data_size": 3136}}
    head = json.dumps({"inputs": [tensor], "outputs": [{"name": "label"}]}).encode()
    body = head + bytes(3136)  # one black image
    headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
    stats, lock, stop = SideStats(), threading.Lock(), threading.Event()
    probe_client, infer_client = httpx.Client(timeout=SIDE_TIMEOUT), httpx.Client(timeout=SIDE_TIMEOUT)
    calls: list[tuple[Callable[[], httpx.Response], str]] = [
        (lambda: probe_client.get(f"{url}/v2/health/live"), "live")
    ]
    if infer:
        infer_url = f"{url}/v2/models/{model}/infer"
        calls.append((lambda: infer_client.post(infer_url, content=body, headers=headers), "infer"))
    threads = [threading.Thread(target=_loop, args=(f, stats, k, lock, stop), daemon=True) for f, k in calls]
    for t in threads:
        t.start()
    conn.send("started")
    while True:
        command = conn.recv() if conn.poll(600) else "stop"
        if command == "reset":
            with lock:
                stats.__dict__.update(SideStats().__dict__)
            conn.send(None)
        elif command == "report":
            with lock:
                conn.send(dict(stats.__dict__))
        else:
            break
    stop.set()
    for t in threads:
        t.join(SIDE_TIMEOUT + 5)
    probe_client.close()
    infer_client.close()


class SideClients:
    """The other clients, in a spawned process; :meth:`reset` starts a span, :meth:`report` ends it."""

    def __init__(self, url: str, model: str, infer: bool = True) -> None:
        self.infer = infer
        self._conn, child = multiprocessing.Pipe()
        ctx = multiprocessing.get_context("spawn")
        self._proc = ctx.Process(target=_side_main, args=(url, model, infer, child), daemon=True)
        self._proc.start()
        if not self._conn.poll(60):
            self.stop()
            raise RuntimeError("the side clients did not start within 60 s")
        self._conn.recv()

    def _ask(self, command: str) -> Any:
        self._conn.send(command)
        if not self._conn.poll(SIDE_TIMEOUT * 2):
            raise RuntimeError(f"the side clients did not answer {command!r}")
        return self._conn.recv()

    def reset(self) -> None:
        self._ask("reset")

    def report(self) -> SideStats:
        return SideStats(**self._ask("report"))

    def stop(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send("stop")
            except OSError:
                pass
            self._proc.join(SIDE_TIMEOUT + 10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(10)


# -- one step of a case -------------------------------------------------------------------------------


@dataclass
class StepResult:
    """What the hostile client saw: its request's size, the answers' statuses (``"200"``,
    ``"403 ×5, 429 ×1995"``) and the largest answer's size, and the case-specific outcome.
    ``answer_bound``: the largest answer the targets allow (default: twice the request and the model's
    output for its batch, ``output_bytes``); ``None`` where no bound applies."""

    request: str
    request_bytes: int
    status: str
    answer_bytes: int
    outcome: str
    output_bytes: int = 0
    answer_bound: int | None = -1

    def bound(self) -> int | None:
        if self.answer_bound == -1:
            return 2 * (self.request_bytes + self.output_bytes)
        return self.answer_bound


@dataclass
class Row:
    case: str
    result: StepResult
    seconds: float
    rss_before: int
    rss_peak: int
    rss_after: int | None
    side: SideStats
    side_infer: bool
    agent_exit: int | None = None

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("result", "side")}
        return {**d, **self.result.__dict__, **{f"side_{k}": v for k, v in self.side.__dict__.items()}}


@dataclass
class Runner:
    """Runs the steps of one case against one agent, measuring each (see the module docstring)."""

    agent: ServedAgent
    side: SideClients
    settle_seconds: float
    rows: list[Row] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.agent.exit_code() is None

    def step(self, case: str, action: Callable[[], StepResult]) -> StepResult | None:
        """Run ``action`` (the hostile client) and keep its row; ``None`` if the agent is gone."""
        if not self.alive:
            return None
        self.side.reset()
        with RssPeak(self.agent.pid) as rss:
            t0 = time.monotonic()
            try:
                result = action()
            except (httpx.HTTPError, OSError) as exc:  # no answer at all, e.g. the agent died under it
                result = StepResult("?", 0, "no answer", 0, f"{type(exc).__name__}: {exc}"[:200])
            seconds = time.monotonic() - t0
        side = self.side.report()
        after = settled_rss(self.agent.pid, self.settle_seconds) if self.alive else None
        row = Row(case, result, seconds, rss.before, rss.peak, after, side, self.side.infer, self.agent.exit_code())
        self.rows.append(row)
        return result
