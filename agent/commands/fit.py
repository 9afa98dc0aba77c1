"""``icos-agent fit``: mine the invariants of a model and write a bundle."""

from __future__ import annotations

import argparse
import json
import sys
import time

from agent.commands.audit import log_fit
from agent.commands.model_args import add_model_arguments, load_model
from agent.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("fit", help="fit IDI/TDI/ADI invariants for a model and write a bundle")
    add_model_arguments(p)
    p.add_argument("--train", required=True, help="labeled training data (.npz x/y, .csv, .parquet)")
    p.add_argument("--val", required=True, help="labeled validation data (ADI training + calibration)")
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
    p.add_argument("--out", required=True, help="bundle directory to write")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument(
        "--mlflow", metavar="URI", help="log the fit as an MLflow run (params, metrics, rules, bundle files)"
    )
    p.add_argument("--experiment", default="icos-agent", help="MLflow experiment (default icos-agent)")
    p.add_argument("--state-dir", help="spool directory for runs MLflow could not take yet")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # lazy: keeps numpy out of CLI start-up
    from agent.data.files import load_data
    from agent.offline.fit import fit_bundle, fit_warnings

    if not 0.0 <= args.confidence <= 1.0:
        raise UserError("--confidence must be within [0, 1]")
    if not 0.0 < args.calibration_fraction < 1.0:
        raise UserError("--calibration-fraction must be within (0, 1)")
    started = time.perf_counter()
    model = load_model(args)
    train = load_data(args.train, label_column=args.label_column, metadata=args.metadata, require_metadata=False)
    val = load_data(args.val, label_column=args.label_column, metadata=args.metadata)

    def say(msg: str) -> None:
        if not args.json:
            print(f"  {msg}", file=sys.stderr)

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
    report.bundle.save(args.out)
    cal = report.bundle.calibration
    summary = {
        "bundle": args.out,
        "model_sha256": model.sha256,
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
        print(f"bundle written to {args.out}")
        print(f"  model accuracy: train {report.train_accuracy:.4f}, validation {report.val_accuracy:.4f}")
        print(
            f"  TDI: {report.n_selected} of {report.n_rules} rules selected (C >= {args.confidence}, "
            f"S > {args.support}); they cover {report.coverage:.1%} of validation inputs"
        )
        print(
            f"  oracle on the calibration split ({cal.n} samples, {cal.tp + cal.fn} model errors): "
            f"TPR {cal.tpr:.3f}, FPR {cal.fpr:.3f}"
        )
        print(f"  took {summary['seconds']} s")
    return 0
