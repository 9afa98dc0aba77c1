"""The fleet evaluator under a hostile Prometheus, case by case (:mod:`bench.fleet.hostile_prometheus`).

For every case a fresh evaluator process (``icos-agent serve`` with ``mode: fleet``) is started against
the hostile API in its consistent mode, waits for a fresh estimate, and then the API switches to the
case. Reported per case: what became of the refresh (refused and counted with its reason, raised
without being counted, accepted as a fresh estimate, or nothing within ``--observe`` seconds), the
evaluator's ``last_error``, whether ``icos_fleet_stale`` rose, the growth of its peak RSS over its
RSS before the case (``VmHWM`` reset through ``/proc/<pid>/clear_refs``), and the slowest answer of
its liveness probe and of ``/metrics``, polled every 0.2 s throughout from a process of its own
(:mod:`bench.fleet.probe`: the hostile API runs in this one, and building its largest answer holds this
process's GIL for most of a second, which a probe thread here would time as the evaluator's).

Run: ``python -m bench.fleet.hostile [--bundle DIR] [--cases drip,inf] [--observe 90]
[--max-response-bytes N] [--max-series N] [--compare-bounds] [--agent-root DIR] [--out docs/scaling.md]``
(without ``--bundle`` a bundle of the shipped MNIST CNN is fitted first, about a minute).
``--max-response-bytes``/``--max-series`` raise the evaluator's bounds (``fleet.max_response_bytes``,
``fleet.max_series``): with 64 MiB and 400,000, ``many_series`` (200,000 series, 33 MB) is parsed instead
of refused for its size, the most an evaluator configured for a large fleet parses. ``--compare-bounds``
runs every case at the defaults and then at the raised bounds (64 MiB and 400,000 unless given), one row
each; ``--out docs/scaling.md`` rewrites that page's block of the liveness by bounds with the table.
``--agent-root DIR`` runs the evaluator of another checkout (``PYTHONPATH=DIR``), so the same script
measures the code before a change.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from agent.config.settings import FleetConfig
from bench.fleet.hostile_prometheus import CASES, HostilePrometheus
from bench.fleet.probe import ProbeProcess
from bench.generated_docs import provenance, write_block

MODEL, VERSION = "mnist", "1"
POLL_SECONDS = 0.2
ROOT = Path(__file__).resolve().parents[2]
#: The block of docs/scaling.md that ``--out`` rewrites (the liveness at the defaults and at raised bounds).
BEGIN = "<!-- BEGIN GENERATED: python -m bench.fleet.hostile (liveness by bounds) -->"
#: The bounds of an evaluator configured for a large fleet (``--compare-bounds``): ``many_series`` is then
#: parsed whole instead of refused for its size.
RAISED = {"max_response_bytes": 64 * 1024 * 1024, "max_series": 400_000}
PROBE_TIMEOUT = 10.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fit_mnist_bundle(out: Path) -> Path:
    """A bundle of the shipped MNIST CNN (as the tests fit it: ADI with 30 trees)."""
    from agent.data.datasets import mnist_splits
    from agent.data.files import Dataset
    from agent.model.classifier import OnnxClassifier, default_model_path
    from agent.offline.fit import fit_bundle
    from invariants.fit_params import FitParams

    splits = mnist_splits()
    model = OnnxClassifier.load(default_model_path(), name=MODEL)
    train, val = Dataset(splits.train.x, splits.train.y), Dataset(splits.val.x, splits.val.y)
    report = fit_bundle(model, train, val, params=FitParams(n_estimators=30))
    report.bundle.save(out)
    return out


def bundle_label(bundle: Path) -> str:
    """The ``bundle`` label the evaluator expects: its manifest's sha256, first 16 hex digits."""
    return hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()[:16]


def fleet_config(url: str, bundle: Path, state: Path, bounds: dict[str, int] | None = None) -> dict[str, Any]:
    """The evaluator's configuration (``bounds``: ``max_response_bytes``/``max_series`` when raised);
    settings this version of the code does not know are left out, so that the same script measures the
    code before the bounds."""
    fleet: dict[str, Any] = {
        "prometheus_url": url,
        "refresh_seconds": 2,
        "query_timeout_seconds": 10,
        "lookback_seconds": 60,
        "stale_after_seconds": 6,
        "refresh_timeout_seconds": 5,
        **(bounds or {}),
    }
    fleet = {k: v for k, v in fleet.items() if k in FleetConfig.model_fields}
    return {
        "mode": "fleet",
        "model": {"name": MODEL, "version": VERSION},
        "bundle": {"path": str(bundle)},
        "windows": {"time": ["5m"]},
        "state_dir": str(state),
        "fleet": fleet,
    }


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} line")


class Evaluator:
    """The evaluator process (stderr to ``<dir>/fleet.log``)."""

    def __init__(self, directory: Path, config: dict[str, Any], root: Path | None = None) -> None:
        self.port = _free_port()
        config = {**config, "server": {"host": "127.0.0.1", "port": self.port}}
        self.config = directory / "fleet.yaml"
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.log = directory / "fleet.log"
        env = {**os.environ, "PYTHONPATH": str(root)} if root is not None else None
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agent", "serve", "--config", str(self.config)],
                stdout=log,
                stderr=log,
                env=env,
                cwd=root,
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def estimates(self) -> dict[str, Any] | None:
        try:
            body: dict[str, Any] = httpx.get(f"{self.url}/v1/estimates", timeout=PROBE_TIMEOUT).json()
            return body
        except (httpx.HTTPError, ValueError):
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def _wait(predicate: Any, seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.25)
    return None


def _errors(body: dict[str, Any]) -> int:
    return int(body["fleet"]["query_errors_total"])


def run_case(
    case: str,
    api: HostilePrometheus,
    bundle: Path,
    observe: float,
    bounds: dict[str, int] | None = None,
    root: Path | None = None,
) -> dict[str, Any]:
    api.mode = "good"
    with tempfile.TemporaryDirectory(prefix="fleet-hostile-") as tmp:
        ev = Evaluator(Path(tmp), fleet_config(api.url, bundle, Path(tmp) / "state", bounds), root)
        try:
            good = _wait(lambda: (b := ev.estimates()) and b["windows"] and not b["fleet"]["stale"] and b, 120)
            if not good:
                raise RuntimeError(f"no good estimate: {ev.log.read_text()[-2000:]}")
            head = good["headline"]
            good_value = good["windows"]["5m"]["estimates"][head]["value"]
            errors0, raised0 = _errors(good), ev.log.read_text().count("refresh raised")
            baseline = _status(ev.proc.pid, "VmRSS")
            Path(f"/proc/{ev.proc.pid}/clear_refs").write_text("5")  # the peak RSS starts again from here
            t0 = time.time()
            outcome, seconds, last, reason = "nothing within the observation", observe, None, None
            with ProbeProcess(ev.url, POLL_SECONDS, PROBE_TIMEOUT) as probe:
                api.mode = case
                deadline = time.monotonic() + observe
                while time.monotonic() < deadline:
                    b = ev.estimates()
                    raised = ev.log.read_text().count("refresh raised") - raised0
                    if b is not None and _errors(b) > errors0:
                        outcome, last = "refused, counted", b["fleet"]["last_error"]
                        reason = b["fleet"].get("last_error_reason")
                    elif b is not None and b["timestamp"] is not None and b["timestamp"] > t0:
                        w = b["windows"].get("5m")
                        value = w["estimates"][head]["value"] if w else None
                        outcome, last = f"accepted as fresh (headline {value})", b["fleet"]["last_error"]
                    elif raised:
                        outcome, last = "raised, not counted", b["fleet"]["last_error"] if b else None
                    else:
                        time.sleep(0.25)
                        continue
                    seconds = time.time() - t0
                    break
                stale = None
                if outcome.startswith(("refused", "raised")):
                    stale = bool(_wait(lambda: (b := ev.estimates()) and b["fleet"]["stale"], 15))
                    kept = ev.estimates()
                    if kept is not None and kept["windows"]:
                        kept_value = kept["windows"]["5m"]["estimates"][head]["value"]
                        outcome += ", last estimate kept" if kept_value == good_value else ", estimate changed"
            peak = _status(ev.proc.pid, "VmHWM") - baseline if ev.proc.poll() is None else None
            return {
                "case": case,
                "outcome": outcome,
                "reason": reason,
                "last_error": last,
                "stale": stale,
                "seconds": seconds,
                "rss_growth_mb": None if peak is None else peak / 1e6,
                "live_max": probe.result["live_max"],
                "metrics_max": probe.result["metrics_max"],
                "probe_failures": probe.result["failures"],
            }
        finally:
            api.mode = "good"
            ev.stop()


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.2f}"
    text = str(value).replace("|", "/").replace("\n", " ")
    return text if len(text) <= 90 else text[:87] + "..."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet.hostile", description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=None, help="a bundle of the shipped MNIST CNN")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--observe", type=float, default=90.0, help="seconds to wait for a case's outcome")
    ap.add_argument("--max-response-bytes", type=int, help="fleet.max_response_bytes (default: the setting's)")
    ap.add_argument("--max-series", type=int, help="fleet.max_series (default: the setting's)")
    ap.add_argument(
        "--compare-bounds",
        action="store_true",
        help="run every case twice: at the settings' defaults, then at --max-response-bytes/--max-series "
        f"(without them: {RAISED['max_response_bytes']} and {RAISED['max_series']})",
    )
    ap.add_argument("--agent-root", type=Path, help="checkout whose evaluator runs (default: this one)")
    ap.add_argument("--out", type=Path, help=f"rewrite the page's block {BEGIN!r} with the table (docs/scaling.md)")
    args = ap.parse_args(argv)
    bounds = {k: v for k, v in (("max_response_bytes", args.max_response_bytes), ("max_series", args.max_series)) if v}
    runs: list[dict[str, int]] = [{}, {**RAISED, **bounds}] if args.compare_bounds else [bounds]
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"unknown case(s): {', '.join(unknown)}; choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fleet-hostile-bundle-") as tmp:
        bundle = args.bundle or fit_mnist_bundle(Path(tmp) / "bundle")
        api = HostilePrometheus(MODEL, VERSION, bundle_label(bundle))
        try:
            lines = [
                "| case | bounds | outcome | reason | last_error | stale | s to outcome | peak RSS growth MB "
                "| liveness max s | /metrics max s | probe failures |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            print("\n".join(lines), flush=True)
            for case in cases:
                for chosen in runs:
                    r = run_case(case, api, bundle, args.observe, chosen, args.agent_root)
                    shown = ", ".join(f"{k} {v}" for k, v in chosen.items()) or "defaults"
                    cells = [r["case"], shown]
                    cells += [r[k] for k in ("outcome", "reason", "last_error", "stale", "seconds")]
                    cells += [r[k] for k in ("rss_growth_mb", "live_max", "metrics_max", "probe_failures")]
                    lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
                    print(lines[-1], flush=True)
        finally:
            api.stop()
    if args.out is not None:
        given = list(argv if argv is not None else sys.argv[1:])
        kept = [a for i, a in enumerate(given) if not a.startswith("--bundle") and given[i - 1 : i] != ["--bundle"]]
        command = " ".join(["python -m bench.fleet.hostile --bundle <a bundle of the MNIST CNN>", *kept])
        write_block(args.out, BEGIN, provenance(command, ROOT) + "\n\n" + "\n".join(lines))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
