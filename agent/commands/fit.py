"""``icos-agent fit``: mine the invariants of a model and write a bundle."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args, get_type_hints

from agent.commands.data_args import (
    add_limit_arguments,
    add_preprocess_argument,
    data_limits,
    image_reading,
    metadata_to_read,
)
from agent.commands.model_args import add_model_arguments, add_table_arguments, load_model, split_columns
from agent.errors import UserError
from invariants.fit_params import MODEL, TABLE, FitParams, FitParamsError, flag_name


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
    p.add_argument("--idi", help="YAML file of input-data-dependent invariants")
    add_fit_params(p)
    p.add_argument("--label-column", help="label column for CSV/Parquet data")
    p.add_argument("--metadata", nargs="*", default=[], help="metadata columns/arrays for IDIs")
    add_limit_arguments(p)
    add_preprocess_argument(p)
    p.add_argument(
        "--champion",
        metavar="MODEL",
        help="fit this model as the challenger of the champion MODEL (ONNX, the same inputs and classes): the "
        "comparison's calibration, on the validation data and the corrupted copies of it, is recorded in the "
        "bundle, for `check --challenger` and the `challenger:` settings of `serve`",
    )
    p.add_argument(
        "--champion-proba-columns",
        metavar="COLS",
        help="with --reference: the champion's probability columns in the same table (the comparison is "
        "calibrated on its rows alone: no model to corrupt inputs for)",
    )
    p.add_argument("--out", required=True, help="bundle directory to write")
    p.add_argument(
        "--json",
        action="store_true",
        help="print a JSON summary (with stage_seconds: the seconds each stage of the fit took)",
    )
    p.add_argument(
        "--mlflow", metavar="URI", help="log the fit as an MLflow run (params, metrics, rules, bundle files)"
    )
    p.add_argument("--experiment", default="icos-agent", help="MLflow experiment (default icos-agent)")
    p.add_argument("--state-dir", help="spool directory for runs MLflow could not take yet")
    p.set_defaults(func=run)


#: What a flag of a field that means something for one source only says about it.
_ONLY = {MODEL: "with --model only", TABLE: "with --reference only"}


def add_fit_params(p: argparse.ArgumentParser) -> None:
    """One flag per field of :class:`FitParams`: its name (or its ``flag``), type, default and help."""
    group = p.add_argument_group("fit parameters")
    hints = get_type_hints(FitParams)
    for f in fields(FitParams):
        kind = next(t for t in (get_args(hints[f.name]) or (hints[f.name],)) if t is not type(None))
        meta = f.metadata
        default = f"default: {meta['when_none']}" if f.default is None else f"default {f.default}"
        notes = [default, meta["cite"], None if len(meta["applies"]) > 1 else _ONLY[meta["applies"][0]]]
        group.add_argument(
            f"--{flag_name(f).replace('_', '-')}",
            dest=f.name,
            type=kind,
            default=f.default,
            metavar=flag_name(f).upper(),
            help=f"{meta['help']} ({', '.join(n for n in notes if n)})",
        )


def fit_params_of(args: argparse.Namespace) -> FitParams:
    """The fit parameters of parsed arguments; a value out of range names its flag."""
    try:
        return FitParams(**{f.name: getattr(args, f.name) for f in fields(FitParams)})
    except FitParamsError as exc:
        flag = flag_name(next(f for f in fields(FitParams) if f.name == exc.name)).replace("_", "-")
        raise UserError(f"--{flag} {exc.problem}") from None


def _check_args(args: argparse.Namespace) -> None:
    if args.reference:
        given = [f for f in ("model", "train", "val") if getattr(args, f)]
        if given:
            raise UserError(f"--reference replaces --model, --train and --val; drop --{given[0]}")
        if not args.proba_columns:
            raise UserError("--reference needs --proba-columns (the predicted probability columns)")
        if not args.label_column:
            raise UserError("--reference needs --label-column (the reference table's labels)")
        if args.champion:
            raise UserError("--champion names an ONNX champion; with --reference give --champion-proba-columns")
    else:
        if args.champion_proba_columns:
            raise UserError("--champion-proba-columns applies to --reference; with --model give --champion MODEL")
        missing = [f for f in ("model", "train", "val") if not getattr(args, f)]
        if missing:
            raise UserError(
                f"fit needs --model, --train and --val (missing --{missing[0]}), or --reference with "
                "--proba-columns for a table of any model's predictions"
            )


def _fit_table(args: argparse.Namespace, params: FitParams, say: Any) -> tuple[Any, Any]:
    """The reference table path: (report, a stand-in for the model in the summary and run record)."""
    from agent.data.tables import default_classes, resolve_columns
    from agent.offline.fit import fit_table_bundle
    from agent.offline.tables import read_reference

    proba = split_columns(args.proba_columns) or []
    champion = split_columns(args.champion_proba_columns) or []
    limits = data_limits(args)
    features = split_columns(args.feature_columns)
    if features is None and champion:  # the champion's columns are no features of the challenger
        from agent.data.tables import table_schema

        schema = table_schema(args.reference, limits)
        taken = {*proba, *champion, *args.metadata, args.label_column}
        features = [c for c in schema if c not in taken and schema[c]]
    columns, skipped = resolve_columns(
        args.reference,
        proba=proba,
        label=args.label_column,
        features=features,
        metadata=args.metadata,
        require_label=True,
        limits=limits,
    )
    if skipped:
        say(f"non-numeric columns left out of the features: {', '.join(skipped)} (encode them as numbers to use them)")
    classes = split_columns(args.classes) or default_classes(proba)
    ref = read_reference(args.reference, columns, args.batch_rows, limits)
    champion_probabilities = None
    if champion:
        if len(champion) != len(proba):
            raise UserError(f"--champion-proba-columns names {len(champion)} columns, --proba-columns {len(proba)}")
        from agent.data.tables import TableColumns

        champion_probabilities = read_reference(
            args.reference, TableColumns(tuple(champion), (), args.label_column), args.batch_rows, limits
        ).probabilities
    report = fit_table_bundle(
        ref,
        columns,
        classes,
        idi_path=args.idi,
        params=params,
        progress=say,
        champion_probabilities=champion_probabilities,
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
    params = fit_params_of(args)
    started = time.perf_counter()

    def say(msg: str) -> None:
        if not args.json:
            print(f"  {msg}", file=sys.stderr)

    if args.reference:
        report, model = _fit_table(args, params, say)
        return _finish(args, params, report, model, started)
    model = load_model(args)
    champion = None
    if args.champion:
        from agent.model.classifier import OnnxClassifier

        champion = OnnxClassifier.load(args.champion, name=Path(args.champion).stem)
    limits = data_limits(args)
    rules = _rule_fields(args, model.classes)
    image = image_reading(model, args.preprocess)
    train = load_data(
        args.train,
        label_column=args.label_column,
        metadata=metadata_to_read(args.train, args.metadata, rules),
        require_metadata=False,
        limits=limits,
        inputs=model.signature.names,
        image=image,
        classes=model.classes,
    )
    val = load_data(
        args.val,
        label_column=args.label_column,
        metadata=metadata_to_read(args.val, args.metadata, rules),
        require_metadata=bool(args.metadata),
        limits=limits,
        inputs=model.signature.names,
        image=image,
        classes=model.classes,
    )
    # read from an image folder: the bundle records how, and check reads image folders the same way
    preprocess = image[1].to_dict() if image is not None and hasattr(train.x, "preprocess") else None
    report = fit_bundle(
        model,
        train,
        val,
        idi_path=args.idi,
        params=params,
        progress=say,
        preprocess=preprocess,
        champion=champion,
    )
    return _finish(args, params, report, model, started)


def _finish(args: argparse.Namespace, params: FitParams, report: Any, model: Any, started: float) -> int:
    """Write the bundle, log the run when asked, print the summary."""
    from agent.estimation.estimators.evidence import evidence_section
    from agent.estimation.estimators.registry import estimator_specs, headline_estimator
    from agent.offline.fit import fit_warnings
    from agent.offline.fit_record import log_fit
    from invariants.fit_params import MODEL, TABLE

    saving = time.perf_counter()
    report.bundle.save(args.out)
    stage_seconds = {**report.stage_seconds, "save": round(time.perf_counter() - saving, 3)}
    cal = report.bundle.calibration
    table = report.bundle.table
    summary: dict[str, Any] = {
        "bundle": args.out,
        "model_sha256": model.sha256 or None,
        "source": "table" if table is not None else "model",
        "headline": headline_estimator(report.bundle.headline),
        **evidence_section(report.calibration.headline, shift_aware=report.calibration.shift is not None),
        "decision_threshold": report.bundle.decision_threshold,
        "train_accuracy": report.train_accuracy,
        "val_accuracy": report.val_accuracy,
        "tdi_rules": report.n_rules,
        "tdi_selected": report.n_selected,
        "tdi_coverage_val": report.coverage,
        "idi_rules": len(report.bundle.idi.rules) if report.bundle.idi else 0,
        "calibration": {"tpr": cal.tpr, "fpr": cal.fpr, "n": cal.n, "errors": cal.tp + cal.fn},
        "warnings": fit_warnings(report.calibration, report.validation),
        "validation_needed": report.validation.to_dict() if report.validation is not None else None,
        "seconds": round(time.perf_counter() - started, 2),
        "stage_seconds": stage_seconds,
    }
    if report.pair is not None:
        summary["champion"] = _champion_summary(report.pair)
    if args.mlflow:
        run = log_fit(
            summary,
            params,
            source=TABLE if args.reference else MODEL,
            files={k: getattr(args, k, None) for k in ("model", "train", "val", "reference", "idi")},
            bundle_dir=args.out,
            model_name=model.name,
            model_sha256=model.sha256,
            tracking_uri=args.mlflow,
            experiment=args.experiment,
            state_dir=args.state_dir,
            started=started,
        )
        if run.run_id is None and not args.json:
            print(f"  MLflow unreachable: run spooled in {run.spool_dir}", file=sys.stderr)
        summary["mlflow"] = run.to_dict()
    for warning in summary["warnings"]:  # type: ignore[attr-defined]
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"bundle written to {args.out}" + (" (from a table of predictions: no model)" if table else ""))
        print(f"  model accuracy: train {report.train_accuracy:.4f}, validation {report.val_accuracy:.4f}")
        print(
            f"  TDI: {report.n_selected} of {report.n_rules} rules selected (C >= {params.confidence}, "
            f"S > {params.support}); they cover {report.coverage:.1%} of validation inputs"
        )
        print(
            f"  oracle on the calibration split ({cal.n} samples, {cal.tp + cal.fn} model errors): "
            f"TPR {cal.tpr:.3f}, FPR {cal.fpr:.3f}"
        )
        if table is not None:
            model_only = ", ".join(s.name for s in estimator_specs() if s.needs_model)
            print(f"  headline estimator: {summary['headline']} ({model_only} needs the model to perturb inputs)")
        if report.pair is not None:
            print(_champion_line(report.pair))
        print(f"  took {summary['seconds']} s")
    return 0


def _champion_summary(pair: Any) -> dict[str, Any]:
    """``fit --json``'s ``champion``: the comparison with the champion recorded in the bundle."""
    return {
        "sha256": pair.champion_sha256,
        "disagreement_rate": pair.disagreement_rate,
        "corrupted_sets": pair.corrupted_sets,
        "model_error": list(pair.error),
    }


def _champion_line(pair: Any) -> str:
    return (
        f"  challenger of the champion: they disagree on {pair.disagreement_rate:.1%} of the validation rows; "
        f"comparison calibrated on {pair.corrupted_sets} corrupted copies"
    )
