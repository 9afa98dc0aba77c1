"""The serving benchmark's challenger setting (``python -m bench.serving --model mnist --challenger-share
0.1``): what a challenger on a share of the requests costs the champion, and what it costs itself.

Two agents serve the shipped MNIST CNN side by side, one of them with the challenger of the champion/challenger
benchmark (``bench/challenger/models/mnist_drift.onnx``, its bundle fitted with ``fit --champion``) on
``share`` of its requests; they are measured one after the other, interleaved, ``--rounds`` times, with the
serving benchmark's load (:func:`bench.serving.__main__.measure`: binary tensors over HTTP, concurrency 1 and 16,
one image a request). The champion's serving CPU per request is the agent process's CPU without the
challenger's own thread (``icos-challenger``, read from ``/proc``); p50 is the client's. Targets: both within
5% of the agent without a challenger. The challenger's own cost per prediction is its thread's CPU time over
the predictions it made (its metrics ``icos_challenger_cpu_seconds_total`` / ``icos_challenger_predictions_total``).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: The challenger the setting runs (a model of the champion/challenger benchmark).
CHALLENGER = Path(__file__).resolve().parents[1] / "challenger" / "models" / "mnist_drift.onnx"
#: The targets: the champion's CPU per request and p50 latency with the challenger, over without.
MAX_RATIO = 1.05
THREAD = "icos-challenger"


def fit_challenger_bundle(out: Path, champion: Path) -> Path:
    """The challenger's bundle fitted with ``fit --champion`` (paper defaults) into ``out``."""
    from agent.data.datasets import mnist_splits
    from agent.data.files import Dataset
    from agent.model.classifier import OnnxClassifier
    from agent.offline.fit import fit_bundle

    s = mnist_splits()
    model = OnnxClassifier.load(CHALLENGER)
    report = fit_bundle(
        model, Dataset(s.train.x, s.train.y), Dataset(s.val.x, s.val.y), champion=OnnxClassifier.load(champion)
    )
    report.bundle.save(out)
    return out


def thread_cpu(pid: int, name: str = THREAD) -> float:
    """CPU seconds of process ``pid``'s threads called ``name`` so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != name:
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def scraped(port: int, name: str) -> float:
    """The sum of the samples of ``name`` in the agent's ``/metrics``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _measure(
    drive: Callable[..., Any],
    cpu: Callable[[int], float],
    port: int,
    req: bytes,
    concurrency: int,
    seconds: float,
    pid: int,
) -> dict[str, float]:
    """One measurement (warm-up first): p50 and p99 latency, the process's CPU and its challenger thread's,
    per request, both read over the same interval."""
    asyncio.run(drive(port, req, concurrency, min(1.0, seconds / 4)))
    cpu0, own0 = cpu(pid), thread_cpu(pid)
    lat, errors, elapsed = asyncio.run(drive(port, req, concurrency, seconds))
    total, own = cpu(pid) - cpu0, thread_cpu(pid) - own0
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, e.g. status {errors[0]}")
    lat_ms, n = np.asarray(lat) * 1000, max(1, len(lat))
    return {
        "requests_per_s": len(lat) / elapsed,
        "p50_ms": float(np.percentile(lat_ms, 50)),
        "p99_ms": float(np.percentile(lat_ms, 99)),
        "server_cpu_ms_per_request": 1000 * total / n,
        "challenger_cpu_ms_per_request": 1000 * own / n,
        "champion_cpu_ms_per_request": 1000 * (total - own) / n,
    }


def measure_challenger(
    start_agent: Callable[[dict[str, Any], str], Any],
    stop: Callable[[Any], None],
    drive: Callable[..., Any],
    cpu: Callable[[int], float],
    request_bytes: Callable[..., bytes],
    config: Callable[[int], dict[str, Any]],
    ports: tuple[int, int],
    challenger_bundle: Path,
    x_all: np.ndarray,
    *,
    share: float,
    seconds: float,
    rounds: int,
) -> dict[str, Any]:
    """Concurrency 1 and 16, one image a request: the agent without and with the challenger (module
    docstring), medians of ``rounds`` interleaved rounds."""
    plain_port, paired_port = ports
    paired_cfg = config(paired_port)
    paired_cfg["challenger"] = {"model_path": str(CHALLENGER), "bundle_path": str(challenger_bundle), "share": share}
    agents = (start_agent(config(plain_port), "plain.yaml"), start_agent(paired_cfg, "paired.yaml"))
    settings = []
    try:
        x = np.ascontiguousarray(x_all[:1], dtype=np.float32)
        for concurrency in (1, 16):
            runs: tuple[list[dict[str, float]], list[dict[str, float]]] = ([], [])
            for _ in range(max(1, rounds)):
                for k, (port, agent) in enumerate(zip(ports, agents, strict=True)):
                    req = request_bytes(port, "mnist", x, ("probabilities", "label"))
                    runs[k].append(_measure(drive, cpu, port, req, concurrency, seconds, agent.pid))
            without, with_ = ({key: statistics.median(r[key] for r in rs) for key in rs[0]} for rs in runs)
            settings.append(
                {
                    "concurrency": concurrency,
                    "without": without,
                    "with": with_,
                    "cpu_ratio": with_["champion_cpu_ms_per_request"] / without["champion_cpu_ms_per_request"],
                    "p50_ratio": with_["p50_ms"] / without["p50_ms"],
                }
            )
        predictions = scraped(paired_port, "icos_challenger_predictions_total")
        own_cpu = scraped(paired_port, "icos_challenger_cpu_seconds_total")
        dropped = scraped(paired_port, "icos_challenger_dropped_total")
    finally:
        for agent in agents:
            stop(agent)
    return {
        "share": share,
        "rounds": max(1, rounds),
        "seconds": seconds,
        "settings": settings,
        "challenger_predictions": predictions,
        "challenger_dropped": dropped,
        "challenger_cpu_ms_per_prediction": 1000 * own_cpu / predictions if predictions else float("nan"),
    }


def report(results: dict[str, Any]) -> str:
    """The measurement as a Markdown table, the targets with PASS/FAIL and the challenger's own cost."""
    lines = [
        f"Challenger on {results['share']:.0%} of the requests (mnist_drift.onnx beside the shipped CNN); medians "
        f"of {results['rounds']} interleaved round(s) of {results['seconds']:g} s, one image a request, HTTP binary:",
        "",
        "| concurrency | p50 ms without | p50 ms with | champion CPU ms/request without | with | CPU ratio | "
        "p50 ratio | targets |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in results["settings"]:
        a, b = s["without"], s["with"]
        ok = s["cpu_ratio"] <= MAX_RATIO and s["p50_ratio"] <= MAX_RATIO
        lines.append(
            f"| {s['concurrency']} | {a['p50_ms']:.3f} | {b['p50_ms']:.3f} | {a['champion_cpu_ms_per_request']:.3f} | "
            f"{b['champion_cpu_ms_per_request']:.3f} | {s['cpu_ratio']:.3f} | {s['p50_ratio']:.3f} | "
            f"{'PASS' if ok else 'FAIL'} (≤ {MAX_RATIO}) |"
        )
    lines += [
        "",
        f"The challenger's own cost: {results['challenger_cpu_ms_per_prediction']:.3f} ms CPU per prediction "
        f"(its thread: model, oracle, paired statistics) over {results['challenger_predictions']:.0f} predictions; "
        f"{results['challenger_dropped']:.0f} requests dropped.",
    ]
    return "\n".join(lines)
