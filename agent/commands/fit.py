"""``icos-agent fit``: mine the invariants of a model and write a bundle."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agent.commands.audit import log_fit
from agent.commands.data_args import add_limit_arguments, data_limits, metadata_to_read
from agent.commands.model_args import add_model_arguments, add_table_arguments, load_model, split_columns
from agent.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "fit",
        help="fit IDI/TDI/ADI invariants for a model (ONNX, or any model from a table of its predictions) "
        "and write a bundle",
    )
    add_model_arguments(p)
    p.add_argument("--train", help="labeled training data (.npz x/y, .csv, .parquet); with --model")
    p.add_argument("--val", help="labeled validation data (ADI training + calibration); with --model")
    p.add_argument(
        "--reference",
        metavar="TABLE",
        help="instead of --model/--train/--val: a labeled reference table (.csv, .parquet) of features and "
        "predicted probabilities (--proba-columns) of any model",
    )
    add_table_arguments(p)
    p.add_argument(
        "--classes",
        metavar="NAMES",
        help="comma-separated class names, in the order of --proba-columns (default: the column names without "
        "their common prefix; 0,1 for a single column)",
    )
    p.add_argument(
        "--train-fraction",
        type=float,
        default=0.5,
        help="share of the reference table's rows that fit the TDIs; the rest is validation (default 0.5)",
    )
    p.add_argument(
        "--decision-threshold",
        type=float,
        help="binary models: class 1 is predicted when its probability is at least this (default: argmax, i.e. 0.5)",
    )
    p.add_argument("--idi", help="YAML file of input-data-dependent invariants")
    p.add_argument("--confidence", type=float, default=0.99, help="minimum TDI rule confidence C (default 0.99)")
    p.add_argument("--support", type=int, default=8, help="TDI rules need support > S records (default 8)")
    p.add_argument(
        "--calibration-fraction",
        type=float,
        default=0.3,
        help="share of the validation data held out of ADI training to measure TPR/FPR (default 0.3)",
    )
    p.add_argument("--trees", type=int, default=100, help="random-forest size of the ADI (default 100, paper Table 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label-column", help="label column for CSV/Parquet data")
    p.add_argument("--metadata", nargs="*", default=[], help="metadata columns/arrays for IDIs")
    add_limit_arguments(p)
    p.add_argument("--out", required=True, help="bundle directory to write")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument(
        "--mlflow", metavar="URI", help="log the fit as an MLflow run (params, metrics, rules, bundle files)"
    )
    p.add_argument("--experiment", default="icos-agent", help="MLflow experiment (default icos-agent)")
    p.add_argument("--state-dir", help="spool directory for runs MLflow could not take yet")
    p.set_defaults(func=run)


def _check_args(args: argparse.Namespace) -> None:
    if not 0.0 <= args.confidence <= 1.0:
        raise UserError("--confidence must be within [0, 1]")
    if not 0.0 < args.calibration_fraction < 1.0:
        raise UserError("--calibration-fraction must be within (0, 1)")
    if args.decision_threshold is not None and not 0.0 < args.decision_threshold < 1.0:
        raise UserError("--decision-threshold must be within (0, 1)")
    if args.reference:
        given = [f for f in ("model", "train", "val") if getattr(args, f)]
        if given:
            raise UserError(f"--reference replaces --model, --train and --val; drop --{given[0]}")
        if not args.proba_columns:
            raise UserError("--reference needs --proba-columns (the predicted probability columns)")
        if not args.label_column:
            raise UserError("--reference needs --label-column (the reference table's labels)")
    else:
        missing = [f for f in ("model", "train", "val") if not getattr(args, f)]
        if missing:
            raise UserError(
                f"fit needs --model, --train and --val (missing --{missing[0]}), or --reference with "
                "--proba-columns for a table of any model's predictions"
            )


def _fit_table(args: argparse.Namespace, say: Any) -> tuple[Any, Any]:
    """The reference table path: (report, a stand-in for the model in the summary and run record)."""
    from agent.data.tables import default_classes, resolve_columns
    from agent.offline.tables import fit_table_bundle, read_reference

    proba = split_columns(args.proba_columns) or []
    limits = data_limits(args)
    columns, skipped = resolve_columns(
        args.reference,
        proba=proba,
        label=args.label_column,
        features=split_columns(args.feature_columns),
        metadata=args.metadata,
        require_label=True,
        limits=limits,
    )
    if skipped:
        say(f"non-numeric columns left out of the features: {', '.join(skipped)} (encode them as numbers to use them)")
    classes = split_columns(args.classes) or default_classes(proba)
    ref = read_reference(args.reference, columns, args.batch_rows, limits)
    report = fit_table_bundle(
        ref,
        columns,
        classes,
        idi_path=args.idi,
        decision_threshold=args.decision_threshold,
        train_fraction=args.train_fraction,
        confidence=args.confidence,
        support=args.support,
        calibration_fraction=args.calibration_fraction,
        n_estimators=args.trees,
        seed=args.seed,
        progress=say,
    )
    return report, SimpleNamespace(name=Path(args.reference).stem, sha256="")


def _rule_fields(args: argparse.Namespace, classes: list[str]) -> frozenset[str]:
    """The metadata fields the ``--idi`` rules read (none without rules)."""
    if args.metadata or not args.idi:
        return frozenset()
    from invariants.idi import IdiRuleSet

    return IdiRuleSet.load(args.idi, classes).metadata_fields


def run(args: argparse.Namespace) -> int:
    # lazy: keeps numpy out of CLI start-up
    from agent.data.files import load_data
    from agent.offline.fit import fit_bundle

    _check_args(args)
    started = time.perf_counter()

    def say(msg: str) -> None:
        if not args.json:
            print(f"  {msg}", file=sys.stderr)

    if args.reference:
        report, model = _fit_table(args, say)
        return _finish(args, report, model, started)
    model = load_model(args)
    if args.decision_threshold is not None:
        if model.n_classes != 2:
            raise UserError(
                f"--decision-threshold applies to binary models only; this one has {model.n_classes} classes"
            )
        model.decision_threshold = args.decision_threshold
    limits = data_limits(args)
    rules = _rule_fields(args, model.classes)
    train = load_data(
        args.train,
        label_column=args.label_column,
        metadata=metadata_to_read(args.train, args.metadata, rules),
        require_metadata=False,
        limits=limits,
    )
    val = load_data(
        args.val,
        label_column=args.label_column,
        metadata=metadata_to_read(args.val, args.metadata, rules),
        require_metadata=bool(args.metadata),
        limits=limits,
    )
    report = fit_bundle(
        model,
        train,
        val,
        idi_path=args.idi,
        confidence=args.confidence,
        support=args.support,
        calibration_fraction=args.calibration_fraction,
        n_estimators=args.trees,
        seed=args.seed,
        progress=say,
    )
    return _finish(args, report, model, started)


def _finish(args: argparse.Namespace, report: Any, model: Any, started: float) -> int:
    """Write the bundle, log the run when asked, print the summary."""
    from agent.estimation.estimators import headline_estimator
    from agent.offline.fit import fit_warnings

    report.bundle.save(args.out)
    cal = report.bundle.calibration
    table = report.bundle.table
    summary: dict[str, Any] = {
        "bundle": args.out,
        "model_sha256": model.sha256 or None,
        "source": "table" if table is not None else "model",
        "headline": headline_estimator(report.bundle.headline),
        "decision_threshold": report.bundle.decision_threshold,
        "train_accuracy": report.train_accuracy,
        "val_accuracy": report.val_accuracy,
        "tdi_rules": report.n_rules,
        "tdi_selected": report.n_selected,
        "tdi_coverage_val": report.coverage,
        "idi_rules": len(report.bundle.idi.rules) if report.bundle.idi else 0,
        "calibration": {"tpr": cal.tpr, "fpr": cal.fpr, "n": cal.n, "errors": cal.tp + cal.fn},
        "warnings": fit_warnings(report.calibration),
        "seconds": round(time.perf_counter() - started, 2),
    }
    if args.mlflow:
        summary["mlflow"] = log_fit(args, model, summary, started)
    for warning in summary["warnings"]:  # type: ignore[attr-defined]
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"bundle written to {args.out}" + (" (from a table of predictions: no model)" if table else ""))
        print(f"  model accuracy: train {report.train_accuracy:.4f}, validation {report.val_accuracy:.4f}")
        print(
            f"  TDI: {report.n_selected} of {report.n_rules} rules selected (C >= {args.confidence}, "
            f"S > {args.support}); they cover {report.coverage:.1%} of validation inputs"
        )
        print(
            f"  oracle on the calibration split ({cal.n} samples, {cal.tp + cal.fn} model errors): "
            f"TPR {cal.tpr:.3f}, FPR {cal.fpr:.3f}"
        )
        if table is not None:
            print(f"  headline estimator: {summary['headline']} (shift_aware needs the model to perturb inputs)")
        print(f"  took {summary['seconds']} s")
    return 0
