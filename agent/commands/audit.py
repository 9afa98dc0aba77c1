"""``icos-agent audit dscore|mutation|metamorphic``: robustness audits of an ONNX classifier.

Examples::

    icos-agent audit dscore --model agent/models/mnist_cnn.onnx --data test.npz --n 3 --t 5 --json
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
from typing import Any

KINDS = ("dscore", "mutation", "metamorphic")


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
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print exactly one JSON object")
    o.add_argument("--mlflow", metavar="URI", help="MLflow tracking URI to log the run to")
    o.add_argument("--experiment", default="icos-agent", help="MLflow experiment (default icos-agent)")
    o.add_argument("--state-dir", help="spool directory for MLflow; alone: log to sqlite:///<dir>/mlflow.db")
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("audit", help="robustness audits: D-Score, data mutation, metamorphic testing")
    kinds = p.add_subparsers(dest="audit_kind", metavar="AUDIT", required=True)

    d = kinds.add_parser("dscore", help="D-Score: region deletion and translation (white-box CNN diagnosis)")
    d.add_argument("--n", type=int, default=3, help="n×n regions (default 3)")
    d.add_argument("--t", type=float, default=5.0, help="translation hyper-parameter t (default 5)")
    _common(d)

    m = kinds.add_parser("mutation", help="data mutation DEC/IMP/SGN/DIG: relative change of MAE/MSE/RMSE")
    m.add_argument("--k", type=int, default=100, help="mutated cells per repetition (default 100)")
    m.add_argument("--repetitions", type=int, default=5)
    m.add_argument("--operators", default="DEC,IMP,SGN,DIG", help="comma-separated subset of DEC,IMP,SGN,DIG")
    m.add_argument("--seed", type=int, default=0)
    r = m.add_argument_group("retrain mode (the paper's procedure: mutate the training set, retrain)")
    r.add_argument("--spec", help="YAML estimator spec: {estimator: sklearn.ensemble.RandomForestRegressor, params}")
    r.add_argument("--train", help="training table (CSV/Parquet)")
    r.add_argument("--test", help="test table (CSV/Parquet)")
    r.add_argument("--target", help="target column")
    _common(m, model_required=False)

    t = kinds.add_parser("metamorphic", help="metamorphic testing: label changes under label-preserving edits")
    t.add_argument(
        "--transformations",
        help='YAML file or inline YAML list, e.g. "[shift, {name: blur, sigma: 0.7}]" (default: a safe set)',
    )
    t.add_argument("--order", type=int, default=1, help="compose this many transformations (default 1)")
    t.add_argument("--max-compositions", type=int, help="test a seeded subset of the compositions")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--allow-flips", action="store_true", help="declare horizontal/vertical flips label-preserving")
    _common(t)

    for sp in (d, m, t):
        sp.set_defaults(func=run)


# -- helpers ----------------------------------------------------------------------------------------------
def _read_yaml(text_or_path: str, what: str) -> Any:
    from pathlib import Path

    import yaml

    from agent.errors import UserError

    p = Path(text_or_path)
    try:
        is_file = p.is_file()
    except OSError:
        is_file = False
    text = p.read_text(encoding="utf-8") if is_file else text_or_path
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"{what}: not valid YAML: {getattr(exc, 'problem', exc)}") from None


def _transformations(value: str | None) -> list[Any] | None:
    from agent.errors import UserError

    if value is None:
        return None
    loaded = _read_yaml(value, "--transformations")
    if isinstance(loaded, dict) and "transformations" in loaded:
        loaded = loaded["transformations"]
    if isinstance(loaded, str):
        loaded = [s.strip() for s in loaded.split(",") if s.strip()]
    if not isinstance(loaded, list) or not loaded:
        raise UserError("--transformations must be a list of names or {name: ..., <param>: ...} mappings")
    return loaded


def _params(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from agent.audits.config import PARAM_MODELS
    from agent.errors import UserError

    common: dict[str, Any] = {
        "label_free": args.label_free,
        "max_samples": args.max_samples or None,
        "batch_size": args.batch_size,
    }
    kind = args.audit_kind
    if kind == "dscore":
        extra: dict[str, Any] = {"n": args.n, "t": args.t}
    elif kind == "mutation":
        ops = [o for o in args.operators.split(",") if o.strip()]
        extra = {"k": args.k, "repetitions": args.repetitions, "operators": ops, "seed": args.seed}
    else:
        extra = {
            "transformations": _transformations(args.transformations),
            "order": args.order,
            "seed": args.seed,
            "allow_flips": args.allow_flips,
            "max_compositions": args.max_compositions,
        }
    try:
        return PARAM_MODELS[kind](**common, **extra)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            flag = "--" + ".".join(str(p) for p in err["loc"][:1]).replace("_", "-")
            problems.append(f"{flag}: {err['msg'].removeprefix('Value error, ')}")
        raise UserError("; ".join(problems)) from None


class _Bar:
    """tqdm on stderr, fed by ``progress(done, total)``."""

    def __init__(self, desc: str, disable: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=None, desc=desc, unit="step", disable=True if disable else None, leave=False)

    def __call__(self, done: int, total: int) -> None:
        if self.bar.total != total:
            self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _summary_lines(kind: str, out: dict[str, Any]) -> list[str]:
    m = out["result"]["metrics"] if out.get("result") else {}
    lines = [f"{kind} audit of {out['model']['name']} on {out['n_samples']} inputs ({out['seconds']:.1f} s)"]
    if kind == "dscore":
        d = out["result"]["details"]
        n = out["result"]["params"]["n"]
        lines.append(
            f"  D-Score {m['dscore']:.4f} = fitness {m['fitness']:.4f} - robustness {m['robustness']:.4f}"
            f"  (base accuracy {m['base_accuracy']:.4f}{', label-free' if d['label_free'] else ''})"
        )
        for name, key in (
            ("variant accuracy (region deleted)", "variant_accuracies"),
            ("accuracy on translated inputs", "translated_accuracies"),
        ):
            vals = d[key]
            lines.append(f"  {name}:")
            for r in range(n):
                lines.append("    " + "  ".join(f"{v:.3f}" for v in vals[r * n : (r + 1) * n]))
        lines.append(f"  augmentation probability p = {m['augmentation_probability']:.4f}")
    elif kind in ("mutation", "mutation_retrain"):
        summary = out["result"]["details"]["summary"]
        lines.append(
            "  baseline: " + ", ".join(f"{k} {v:.4f}" for k, v in out["result"]["details"]["baseline"].items())
        )
        lines.append(f"  {'operator':<9}" + "".join(f"{k + ' Δ%':>20}" for k in ("mae", "mse", "rmse")))
        for op, s in summary.items():
            cells = []
            for k in ("mae", "mse", "rmse"):
                mean, std = s[k]["change_pct_mean"], s[k]["change_pct_std"]
                cells.append("n/a" if mean is None else f"{mean:+.2f} ± {std or 0:.2f}")
            note = f"  ({s['note']})" if s.get("note") else ""
            lines.append(f"  {op:<9}" + "".join(f"{c:>20}" for c in cells) + note)
    else:
        rels = out["result"]["details"]["relations"]
        lines.append(
            f"  overall violation rate {m['overall_violation_rate']:.4f}"
            f" [{m['overall_violation_rate_lower']:.4f}, {m['overall_violation_rate_upper']:.4f}]"
        )
        for r in rels:
            lines.append(
                f"  {r['relation']:<32} violations {r['violation_rate']:.4f}"
                f"  confidence drop {r['mean_confidence_drop']:+.4f}"
            )
    ml = out.get("mlflow") or {}
    if ml.get("run_id"):
        lines.append(f"  MLflow run {ml['run_id']} ({ml.get('tracking_uri')})")
    elif ml.get("spooled"):
        lines.append(f"  MLflow unreachable: run spooled in {ml.get('spool_dir')}; it is delivered by the next run")
    return lines


# -- the command --------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    import json
    import time
    import uuid
    from pathlib import Path

    from agent.audits.report import AuditError
    from agent.audits.runner import AuditOutcome, audit_record, default_state_dir, load_audit_data, open_logger
    from agent.errors import UserError

    kind: str = args.audit_kind
    retrain = kind == "mutation" and any(getattr(args, a) for a in ("spec", "train", "test", "target"))
    params = _params(args)
    bar = _Bar(kind, args.no_progress or False)
    started = time.time()
    model_info: dict[str, str] = {}
    try:
        if retrain:
            result, n, source, model_info = _run_retrain(args, params, bar)
        else:
            if not args.model or not args.data:
                raise UserError("--model and --data are required (or --spec/--train/--test/--target for retrain mode)")
            from agent.audits.runner import run_audit
            from agent.model.classifier import OnnxClassifier

            model = OnnxClassifier.load(args.model)
            model_info = {"name": args.model_name or model.name, "version": args.model_version, "sha256": model.sha256}
            x, y = load_audit_data(args.data, model, label_column=args.label_column)
            result = run_audit(kind, model, x, y, params, progress=bar)
            n, source = int(result.params.get("n_samples", len(x))), str(args.data)
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
            "tracking_uri": logger.tracking_uri,
            "experiment": args.experiment,
            "spool_dir": str(logger.spool_dir),
        }
    out = outcome.to_dict()
    out["model"] = model_info
    out["mlflow"] = mlflow_info or None
    if kind == "dscore":
        details = out["result"]["details"]
        out = {
            **details["score"],
            "base_accuracy": details["base_accuracy"],
            "variant_accuracies": details["variant_accuracies"],
            "translated_accuracies": details["translated_accuracies"],
            **out,
        }
    if args.json:
        print(json.dumps(out, allow_nan=False))
    else:
        print("\n".join(_summary_lines(result.kind, out)))
    return 0


def _run_retrain(args: argparse.Namespace, params: Any, bar: _Bar) -> tuple[Any, int, str, dict[str, str]]:
    import hashlib
    from pathlib import Path

    from agent.audits.runner import run_retrain
    from agent.errors import UserError

    missing = [f"--{a}" for a in ("spec", "train", "test", "target") if not getattr(args, a)]
    if missing:
        raise UserError(f"retrain mode needs --spec, --train, --test and --target; missing {', '.join(missing)}")
    if args.model or args.data:
        raise UserError("retrain mode trains its own model: drop --model/--data")
    if not Path(args.spec).is_file():
        raise UserError(f"--spec: file not found: {args.spec}")
    spec = _read_yaml(args.spec, "--spec")
    if not isinstance(spec, dict):
        raise UserError("--spec must be a mapping: {estimator: <class path>, params: {...}}")
    result = run_retrain(spec, args.train, args.test, args.target, params, progress=bar)
    result.params["spec_sha256"] = hashlib.sha256(Path(args.spec).read_bytes()).hexdigest()
    name = args.model_name or str(spec.get("estimator", "estimator")).rsplit(".", 1)[-1]
    source = f"{args.train} -> {args.test}"
    return result, int(result.params["n_train"]), source, {"name": name, "version": args.model_version, "sha256": ""}


def log_fit(args: argparse.Namespace, model: Any, summary: dict[str, Any], started: float) -> dict[str, Any]:
    """Log ``icos-agent fit`` as one MLflow run (see :func:`agent.audits.runner.fit_record`)."""
    import sys
    import time
    from pathlib import Path

    from agent.audits.runner import default_state_dir, fit_record, open_logger
    from agent.errors import UserError

    params = {
        k: getattr(args, k)
        for k in ("model", "train", "val", "idi", "confidence", "support", "calibration_fraction", "trees", "seed")
        if getattr(args, k, None) is not None
    }
    try:
        logger = open_logger(
            args.mlflow, args.experiment, Path(args.state_dir) if args.state_dir else default_state_dir()
        )
    except ValueError as exc:
        raise UserError(f"--mlflow: {exc}") from None
    record = fit_record(
        summary,
        params,
        args.out,
        model_name=model.name,
        model_sha256=model.sha256,
        started_at=time.time() - (time.perf_counter() - started),
        finished_at=time.time(),
    )
    run_id = logger.log(record)
    if run_id is None and not args.json:
        print(f"  MLflow unreachable: run spooled in {logger.spool_dir}", file=sys.stderr)
    return {"run_id": run_id, "tracking_uri": logger.tracking_uri, "spooled": run_id is None}
