"""``icos-agent audit dscore|mutation|metamorphic``: robustness audits of an ONNX classifier.

Examples::

    icos-agent audit dscore --model agent/shipped_models/mnist_cnn.onnx --data test.npz --n 3 --t 5 --json
    icos-agent audit mutation --model M.onnx --data ref.npz --k 200 --repetitions 5 --operators SGN,DIG
    icos-agent audit mutation --spec spec.yaml --train train.csv --test test.csv --target y   # retrain mode
    icos-agent audit metamorphic --model M.onnx --data ref.npz --transformations "[shift, blur]" --order 2

``--mlflow URI`` logs one run (params, metrics, ``report.json``, PNG heatmaps, model tags); without
it nothing is logged unless ``--state-dir`` is given (then ``sqlite:///<state-dir>/mlflow.db``).
If MLflow cannot be reached the run is spooled in the state directory and delivered by the next
run that logs there.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from tqdm import tqdm

from agent.audits.config import AUDIT_KINDS
from agent.audits.registry import AuditKind
from agent.audits.report import AuditError, AuditResult, ProgressFn
from agent.audits.runner import (
    AuditOutcome,
    audit_record,
    load_audit_data,
    run_audit,
)
from agent.commands.data_args import add_limit_arguments, data_limits
from agent.errors import UserError
from agent.model.classifier import OnnxClassifier
from exporters.mlflow_runs import default_state_dir, open_logger
from exporters.redaction import redact_uri


def _common(p: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    g = p.add_argument_group("model and data")
    g.add_argument("--model", required=model_required, help="ONNX classifier")
    g.add_argument("--data", required=model_required, help="inputs (.npz x[/y], .csv, .parquet)")
    g.add_argument("--label-column", help="label column for CSV/Parquet data")
    g.add_argument("--label-free", action="store_true", help="ignore labels: compare with the model's own labels")
    g.add_argument("--max-samples", type=int, default=2000, help="audit at most N inputs (seeded subset; 0 = all)")
    g.add_argument("--batch-size", type=int, default=256)
    g.add_argument("--model-name", help="model name for MLflow tags (default: file name)")
    g.add_argument("--model-version", default="", help="model version for MLflow tags")
    add_limit_arguments(g)
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print exactly one JSON object")
    o.add_argument("--mlflow", metavar="URI", help="MLflow tracking URI to log the run to")
    o.add_argument("--experiment", default="icos-agent", help="MLflow experiment (default icos-agent)")
    o.add_argument("--state-dir", help="spool directory for MLflow; alone: log to sqlite:///<dir>/mlflow.db")
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("audit", help="robustness audits: D-Score, data mutation, metamorphic testing")
    kinds = p.add_subparsers(dest="audit_kind", metavar="AUDIT", required=True)

    for kind in AUDIT_KINDS.values():
        sp = kinds.add_parser(kind.name, help=kind.help)
        kind.add_arguments(sp)
        _common(sp, model_required=kind.cli_model_required)
        sp.set_defaults(func=run)


# -- helpers ----------------------------------------------------------------------------------------------
def _params(args: argparse.Namespace) -> Any:
    common: dict[str, Any] = {
        "label_free": args.label_free,
        "max_samples": args.max_samples or None,
        "batch_size": args.batch_size,
    }
    kind: AuditKind = AUDIT_KINDS[args.audit_kind]
    try:
        return kind.params(**common, **kind.cli_params(args))
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            flag = "--" + ".".join(str(p) for p in err["loc"][:1]).replace("_", "-")
            problems.append(f"{flag}: {err['msg'].removeprefix('Value error, ')}")
        raise UserError("; ".join(problems)) from None


class _Bar:
    """tqdm on stderr, fed by ``progress(done, total)``."""

    def __init__(self, desc: str, disable: bool) -> None:
        self.bar = tqdm(total=None, desc=desc, unit="step", disable=True if disable else None, leave=False)

    def __call__(self, done: int, total: int) -> None:
        if self.bar.total != total:
            self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _summary_lines(kind: str, entry: AuditKind, out: dict[str, Any]) -> list[str]:
    lines = [f"{kind} audit of {out['model']['name']} on {out['n_samples']} inputs ({out['seconds']:.1f} s)"]
    lines += entry.summary_lines(out)
    ml = out.get("mlflow") or {}
    if ml.get("run_id"):
        lines.append(f"  MLflow run {ml['run_id']} ({ml.get('tracking_uri')})")
    elif ml.get("spooled"):
        lines.append(f"  MLflow unreachable: run spooled in {ml.get('spool_dir')}; it is delivered by the next run")
    return lines


# -- the command --------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    entry = AUDIT_KINDS[args.audit_kind]
    params = _params(args)
    bar = _Bar(entry.name, args.no_progress or False)
    started = time.time()
    try:
        ran = entry.cli_alt_run(args, params, bar) if entry.cli_alt_run is not None else None
        result, n, source, model_info = ran if ran is not None else _run_on_model(args, entry, params, bar)
    except AuditError as exc:
        raise UserError(str(exc)) from None
    finally:
        bar.close()
    outcome = AuditOutcome(
        kind=result.kind,
        status="success",
        started_at=started,
        finished_at=time.time(),
        trigger="cli",
        data_source=source,
        n_samples=n,
        result=result,
        id=uuid.uuid4().hex,
    )
    mlflow_info: dict[str, Any] = {}
    if args.mlflow or args.state_dir:
        state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
        try:
            logger = open_logger(args.mlflow, args.experiment, state_dir)
        except ValueError as exc:
            raise UserError(f"--mlflow: {exc}") from None
        record = audit_record(
            outcome,
            model_name=model_info["name"],
            model_version=model_info.get("version", ""),
            model_sha256=model_info.get("sha256", ""),
        )
        run_id = logger.log(record)
        outcome.mlflow_run_id, outcome.mlflow_spooled = run_id, run_id is None and logger.pending() > 0
        mlflow_info = {
            "run_id": run_id,
            "spooled": outcome.mlflow_spooled,
            "tracking_uri": redact_uri(logger.tracking_uri),
            "experiment": args.experiment,
            "spool_dir": str(logger.spool_dir),
        }
    out = outcome.to_dict()
    out["model"] = model_info
    out["mlflow"] = mlflow_info or None
    out = entry.cli_json(out)
    if args.json:
        print(json.dumps(out, allow_nan=False))
    else:
        print("\n".join(_summary_lines(result.kind, entry, out)))
    return 0


def _run_on_model(
    args: argparse.Namespace, entry: AuditKind, params: Any, progress: ProgressFn
) -> tuple[AuditResult, int, str, dict[str, str]]:
    """Audit the ONNX model of ``--model`` on ``--data``."""
    if not args.model or not args.data:
        if entry.cli_alt_run is not None:
            raise UserError("--model and --data are required (or --spec/--train/--test/--target for retrain mode)")
        raise UserError("--model and --data are required")
    model = OnnxClassifier.load(args.model)
    model_info = {"name": args.model_name or model.name, "version": args.model_version, "sha256": model.sha256}
    x, y = load_audit_data(args.data, model, label_column=args.label_column, limits=data_limits(args))
    result = run_audit(entry.name, model, x, y, params, progress=progress)
    return result, int(result.params.get("n_samples", len(x))), str(args.data), model_info
