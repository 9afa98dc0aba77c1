"""``icos-agent demo``: the whole story on the shipped MNIST CNN.

1. Load the CNN and the MNIST-5k splits; load the invariant bundle cached in the state directory
   or fit it (logged to MLflow as a ``fit`` run).
2. Start the real agent (``python -m agent serve --config <state>/agent.yaml``) on 127.0.0.1.
3. Replay live traffic as V2 binary inference requests in phases (in distribution, label shift,
   translation drift, noise drift, recovery); the live view shows the truth of each phase beside
   every estimator of ``GET /v1/estimates`` (count window = one phase) and the verdict mix.
4. Ask the agent for a D-Score, a mutation and a metamorphic audit (``POST /v1/audits/{kind}``);
   the agent logs them to MLflow (``sqlite:///<state>/mlflow.db``).
5. Write the report (``<report>/index.html``) and say where to look; ``--serve`` keeps the agent
   running (with a trickle of traffic) until Ctrl-C.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from agent.audits.config import AUDIT_KINDS
from agent.data.datasets import Split, mnist_splits
from agent.demo.agent_process import (
    CONFIG_FILE,
    LOG_FILE,
    MODEL_NAME,
    MODEL_VERSION,
    AgentProcess,
    agent_config,
    clear_window_state,
    free_port,
    write_config,
)
from agent.demo.client import AgentClient
from agent.demo.fitting import FitOutcome, load_or_fit
from agent.demo.live import LiveView
from agent.demo.record import DemoRecord, PhaseStats
from agent.demo.report import write_report
from agent.demo.traffic import Phase, build_phases
from agent.errors import Abort
from agent.model.classifier import OnnxClassifier, default_model_path
from agent.offline.fit_record import fit_record
from exporters.mlflow_runs import open_logger
from exporters.redaction import redact_uri
from exporters.run_record import RunRecord

EXPERIMENT = "icos-agent"


@dataclass(frozen=True)
class DemoOptions:
    """What ``icos-agent demo`` was asked to do (see ``agent/commands/demo.py`` for the flags)."""

    state_dir: Path = Path("icos-state")
    report_dir: Path = Path("demo-report")
    quick: bool = False
    serve: bool = False
    port: int | None = None
    seed: int = 0
    refit: bool = False
    live: bool = False

    @property
    def phase_size(self) -> int:
        return 250 if self.quick else 1000

    @property
    def batch_size(self) -> int:
        return 25

    @property
    def phase_seconds(self) -> float:
        """Pacing of the replay: the minimum duration of a phase (so the live view can be followed)."""
        return 0.0 if self.quick else 10.0


class _Terminated(Abort):
    """SIGTERM: the demo stops its agent and exits 143."""


def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise _Terminated()


# -- MLflow (demo side: the fit and the estimate snapshots; the agent logs its audits) -------------------
def _log_fit_and_snapshots(state_dir: Path, fit: FitOutcome, model: Any, record: DemoRecord | None) -> dict[str, Any]:

    logger = open_logger(None, EXPERIMENT, state_dir)
    runs: dict[str, Any] = {}
    if fit.summary:
        rec = fit_record(
            fit.summary,
            fit.params,
            fit.bundle_dir,
            model_name=MODEL_NAME,
            model_version=MODEL_VERSION,
            model_sha256=model.sha256,
            started_at=fit.started_at or time.time(),
            finished_at=fit.finished_at or time.time(),
        )
        runs["fit"] = logger.log(rec)
    if record is not None:
        now = time.time()
        for i, p in enumerate(record.phases):
            metrics = {name: v for name, e in p.estimates.items() if (v := e.value) is not None}
            if p.accuracy is not None:
                metrics["truth"] = p.accuracy
                metrics.update(
                    {f"abs_error_{k}": abs(v - p.accuracy) for k, v in list(metrics.items()) if k != "truth"}
                )
            metrics["pass_share"] = p.verdict_shares().get("pass", 0.0)
            snap = RunRecord(
                kind="estimates",
                name=f"estimates {MODEL_NAME} {MODEL_VERSION}",
                params={"window": record.window},
                metrics={k: float(v) for k, v in metrics.items()},
                tags={"icos.demo.phase": p.name},
                model_name=MODEL_NAME,
                model_version=MODEL_VERSION,
                model_sha256=model.sha256,
                started_at=now,
                finished_at=now,
                step=int(now) * 10 + i,
            )
            runs["estimates"] = logger.log(snap)
    runs["tracking_uri"] = redact_uri(logger.tracking_uri)
    return runs


class _Background:
    """Runs a function in a thread; ``result()`` joins and re-raises."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self._out: Any = None
        self._exc: BaseException | None = None

        def run() -> None:
            try:
                self._out = fn(*args)
            except BaseException as exc:  # re-raised in result()
                self._exc = exc

        self._thread = threading.Thread(target=run, name="demo-mlflow", daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        if self._exc is not None:
            raise self._exc
        return self._out


# -- the replay -------------------------------------------------------------------------------------------
def replay(
    client: AgentClient,
    phases: list[Phase],
    record: DemoRecord,
    view: LiveView,
    opts: DemoOptions,
    labels: bool = False,
    poll_seconds: float = 0.25,
) -> None:
    """Send every phase as V2 requests of ``batch_size`` images, reading the estimates as it goes.

    With ``labels`` the true class of every prediction is posted right after it
    (``POST /v1/labels``), and the agent's realized accuracy is shown beside the estimates.
    """
    run_id = f"{int(time.time()):x}"
    for i, phase in enumerate(phases):
        record.current = i
        stats = record.phases[i]
        t0 = time.monotonic()
        n_batches = int(np.ceil(phase.n / opts.batch_size))
        last_poll = 0.0
        for b in range(n_batches):
            sl = slice(b * opts.batch_size, (b + 1) * opts.batch_size)
            res = client.infer(phase.x[sl], request_id=f"demo-{run_id}-{phase.key}-{b:04d}")
            record.add_predictions(i, res.labels, phase.y[sl], res.verdicts)
            if labels:
                client.post_labels(res.prediction_ids, phase.y[sl])
            if opts.phase_seconds > 0:
                target = t0 + opts.phase_seconds * (b + 1) / n_batches
                delay = target - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            now = time.monotonic()
            if now - last_poll >= poll_seconds:
                record.read_estimates(i, client.estimates())
                last_poll = now
                view.update(record)
        record.read_estimates(i, client.estimates())
        stats.seconds = time.monotonic() - t0
        stats.done = True
        view.phase_done(record, i)


def _audit_line(kind: str, outcome: dict[str, Any]) -> str:
    status = outcome.get("status")
    secs = float(outcome.get("seconds", 0.0))
    m = (outcome.get("result") or {}).get("metrics", {})
    if status != "success":
        return f"  {kind}: {status} after {secs:.1f} s: {outcome.get('error')}"
    what = AUDIT_KINDS[kind].demo_line(m)
    return f"  {kind}: {what} [{secs:.1f} s]"


def _commands(opts: DemoOptions, url: str | None, tracking_uri: str) -> list[tuple[str, str]]:
    state = opts.state_dir.resolve()
    out = [
        ("open the report", f"xdg-open {(opts.report_dir / 'index.html').resolve()}"),
        (
            "browse the MLflow runs (fit, audits, estimate snapshots)",
            f"mlflow ui --backend-store-uri {tracking_uri} --port 5000",
        ),
    ]
    if url:
        out += [
            ("live estimates (JSON)", f"curl -s {url}/v1/estimates"),
            ("Prometheus metrics", f"curl -s {url}/metrics | grep '^icos_estimated_accuracy_ratio'"),
            ("last audit results", f"curl -s {url}/v1/audits?details=false"),
        ]
    else:
        out.append(
            ("run the agent yourself with the demo's config", f"icos-agent serve --config {state / CONFIG_FILE}")
        )
    out.append(
        (
            "audit from the command line",
            "icos-agent audit dscore --model agent/shipped_models/mnist_cnn.onnx --data D.npz",
        )
    )
    return out


def _trickle(client: AgentClient, phases: list[Phase], stop: threading.Event) -> None:
    """``--serve``: keep a slow stream of traffic (8 images every 0.5 s, one phase per minute)."""
    b = 0
    while not stop.is_set():
        phase = phases[int(time.time() // 60) % len(phases)]
        idx = np.random.default_rng(b).choice(phase.n, 8, replace=False)
        try:
            client.infer(phase.x[idx], request_id=f"demo-serve-{phase.key}-{b}")
        except Exception:
            pass
        b += 1
        stop.wait(0.5)


def run_demo(opts: DemoOptions) -> int:
    """Run the story; exit status 0 when every step succeeded."""
    t_start = time.monotonic()
    in_main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        return _run(opts, t_start)
    except _Terminated:
        print("icos-agent demo: terminated; the agent was stopped", file=sys.stderr)
        return 143
    finally:
        if in_main and old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _run(opts: DemoOptions, t_start: float) -> int:

    # MLflow announces the migrations of a new store at INFO level (here and in the agent it starts).
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    state = opts.state_dir.resolve()
    report_dir = opts.report_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    view = LiveView(opts.live)
    say = view.say
    model_path = default_model_path()
    model = OnnxClassifier.load(model_path, name=MODEL_NAME)
    say(f"icos-agent demo — model {model_path.name} (sha256 {model.sha256[:12]}…), state in {state}")
    splits = mnist_splits()
    fit = load_or_fit(model, splits, state, refit=opts.refit, seed=opts.seed, say=say)
    mlflow_db = state / "mlflow.db"
    log_fit = fit if (fit.fitted or not mlflow_db.exists()) else FitOutcome(fit.bundle, fit.bundle_dir, False)
    # MLflow's first use of a store takes seconds (import, migrations): log the fit while traffic runs.
    fit_logging = _Background(_log_fit_and_snapshots, state, log_fit, model, None)

    config_path, port = _write_agent_config(opts, state, model_path, fit, splits.test)
    clear_window_state(state)
    phases = build_phases(splits.test.x, splits.test.y, opts.phase_size, opts.seed)
    record = _new_record(opts, phases, model_path, model.sha256, fit)
    agent = AgentProcess(config_path, port, state / LOG_FILE)
    say(f"starting the agent: {sys.executable} -m agent serve --config {config_path}")
    with agent:
        record.info["url"] = agent.url
        say(f"agent ready at {agent.url} (log: {state / LOG_FILE})")
        client = AgentClient(agent.url, MODEL_NAME, agent.token)
        try:
            say(
                f"replaying live traffic: {len(phases)} phases x {opts.phase_size} MNIST test images, V2 binary "
                f"requests of {opts.batch_size}; the truth is known to the demo, not to the agent"
            )
            labels = client.has_path("post", "/v1/labels")
            if labels:
                say("the true labels are posted right after each prediction (POST /v1/labels: delayed labels)")
            replay(client, phases, record, view, opts, labels=labels)
            view.finish(record)
            fit_runs = fit_logging.result()
            _run_audits(client, record, say)
            snap_runs = _log_fit_and_snapshots(state, FitOutcome(fit.bundle, fit.bundle_dir, False), model, record)
            if "fit" in fit_runs:
                record.mlflow_runs = {"fit": fit_runs["fit"], **record.mlflow_runs}
            record.mlflow_runs["estimates (per phase)"] = snap_runs.get("estimates")
            tracking_uri = str(snap_runs["tracking_uri"])
            report_dir.mkdir(parents=True, exist_ok=True)
            (report_dir / "metrics.txt").write_text(client.metrics_text(), encoding="utf-8")
            record.info["seconds"] = time.monotonic() - t_start
            commands = _commands(opts, agent.url if opts.serve else None, tracking_uri)
            index = _report(record, report_dir, commands)
            ok = all(o.get("status") == "success" for o in record.audits.values())
            if not opts.serve:
                say("stopping the agent")
                agent.stop()
            _where(say, index, tracking_uri, agent.url if opts.serve else None, time.monotonic() - t_start)
            if opts.serve:
                _serve(client, phases, agent, say)
        finally:
            client.close()
    return 0 if ok else 1


def _write_agent_config(
    opts: DemoOptions, state: Path, model_path: Path, fit: FitOutcome, test: Split
) -> tuple[Path, int]:
    """The agent's config file (and the reference data its audits read), in ``state``; its path and port."""
    reference = state / "reference.npz"
    np.savez(reference, x=test.x, y=test.y)
    port = opts.port or free_port()
    config_path = state / CONFIG_FILE
    write_config(
        config_path,
        agent_config(
            model_path=model_path.resolve(),
            bundle_dir=fit.bundle_dir,
            state_dir=state,
            reference=reference,
            port=port,
            count_window=opts.phase_size,
            quick=opts.quick,
        ),
    )
    return config_path, port


def _new_record(opts: DemoOptions, phases: list[Phase], model_path: Path, sha256: str, fit: FitOutcome) -> DemoRecord:
    """The record of this run, before any traffic: the phases, the model and its bundle's calibration."""
    record = DemoRecord(window=f"last{opts.phase_size}", window_size=opts.phase_size)
    record.phases = [PhaseStats(p.key, p.name, p.description, p.n) for p in phases]
    cal = fit.bundle.calibration
    record.info = {
        "model": model_path.name,
        "sha256": sha256,
        "tpr": cal.tpr,
        "fpr": cal.fpr,
        "when": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
    }
    return record


def _run_audits(client: AgentClient, record: DemoRecord, say: Callable[[str], None]) -> None:
    """Every audit kind, run by the agent and waited for, into ``record``."""
    say("robustness audits, run by the agent (POST /v1/audits/{kind}?wait=true):")
    for kind in AUDIT_KINDS:
        outcome = client.run_audit(kind)
        record.audits[kind] = outcome
        record.mlflow_runs[kind] = (outcome.get("mlflow") or {}).get("run_id")
        say(_audit_line(kind, outcome))


def _report(record: DemoRecord, report_dir: Path, commands: list[tuple[str, str]]) -> Path:

    return write_report(record, report_dir, commands)


def _where(say: Any, index: Path, tracking_uri: str, url: str | None, seconds: float) -> None:
    say(f"\ndone in {seconds:.0f} s. Where to look:")
    say(f"  report      {index}")
    say(f"  MLflow UI   mlflow ui --backend-store-uri {tracking_uri} --port 5000   (then http://127.0.0.1:5000)")
    if url:
        say(f"  metrics     {url}/metrics")
        say(f"  estimates   {url}/v1/estimates")
        say(f"  audits      {url}/v1/audits")
    else:
        say("  metrics     the agent has stopped; run `icos-agent demo --serve` to keep it up for Prometheus/Grafana")


def _serve(client: AgentClient, phases: list[Phase], agent: AgentProcess, say: Any) -> None:
    say(
        f"\nthe agent keeps running at {agent.url} with a trickle of traffic (one phase per minute); "
        "point Prometheus at /metrics (docs/deploy.md). Ctrl-C stops it."
    )
    stop = threading.Event()
    t = threading.Thread(target=_trickle, args=(client, phases, stop), name="demo-trickle", daemon=True)
    t.start()
    try:
        while agent.running:
            time.sleep(0.5)
        say("the agent exited")
    except KeyboardInterrupt:
        say("\nCtrl-C: stopping")
    finally:
        stop.set()
        t.join(timeout=5)
