"""``icos-agent check``: judge a batch offline and print verdicts and every estimate."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from agent.commands.data_args import add_limit_arguments, data_limits, image_reading, metadata_to_read
from agent.commands.model_args import add_model_arguments, load_model, split_columns
from agent.errors import UserError
from agent.results.check_report import CheckReport

if TYPE_CHECKING:
    from agent.offline.check_companions import CheckCompanion


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("check", help="judge a data set with a bundle: verdicts, estimates, truth if labeled")
    add_model_arguments(p)
    p.add_argument("--bundle", required=True, help="bundle directory written by `fit`")
    p.add_argument("--data", required=True, help="data (.npz x[/y], .csv, .parquet)")
    p.add_argument("--metadata", nargs="*", default=[], help="metadata columns/arrays the IDIs read")
    p.add_argument("--label-column", help="label column for CSV/Parquet data")
    p.add_argument(
        "--labels",
        type=int,
        default=0,
        metavar="N",
        help="reveal the true labels of N randomly drawn samples (the data must be labeled) and report the "
        "label-assisted estimate `with_labels` (prediction-powered inference) from them; table-based bundles: "
        "N per chunk of --chunk-size too",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the --labels draw (default 0)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument(
        "--chunk-size",
        type=int,
        metavar="ROWS",
        help="table-based bundles: also report every chunk of this many rows, in file order",
    )
    p.add_argument(
        "--batch-rows",
        type=int,
        default=16384,
        help="table-based bundles: rows read at once (bounds memory whatever the file's length; default 16384)",
    )
    p.add_argument(
        "--challenger",
        metavar="MODEL",
        help="another version's ONNX model, compared with --model on the same data: the `challenger` section "
        "(its accuracy minus the model's, with a 95%% interval); needs --challenger-bundle",
    )
    p.add_argument(
        "--challenger-bundle",
        metavar="BUNDLE",
        help="the challenger's bundle, fitted with `fit --champion` (for table-based bundles: `fit --reference "
        "... --champion-proba-columns`); with --labels N, N labels of the versions' disagreements are revealed "
        "for the label-assisted difference",
    )
    p.add_argument(
        "--challenger-proba-columns",
        metavar="COLS",
        help="table-based bundles: the challenger's probability columns in the data (default: those its bundle "
        "was fitted on)",
    )
    add_limit_arguments(p)
    p.set_defaults(func=run)


def check_table(args: argparse.Namespace) -> dict[str, object]:
    """A table-based bundle: features and probabilities come from the data table, no model."""
    from agent.data.tables import resolve_columns
    from agent.offline.tables import check_table_report
    from invariants.bundle import Bundle

    bundle = Bundle.load(args.bundle)
    table = bundle.table
    assert table is not None
    label = args.label_column or table.label_column
    columns, _ = resolve_columns(
        args.data,
        proba=table.proba_columns,
        label=label,
        features=table.feature_columns,
        metadata=args.metadata,
        require_label=args.label_column is not None,
        limits=data_limits(args),
    )
    report = check_table_report(
        bundle,
        args.data,
        columns,
        chunk_rows=args.chunk_size,
        batch_rows=args.batch_rows,
        limits=data_limits(args),
        labels=args.labels,
        seed=args.seed,
    )
    if args.challenger_bundle:
        from agent.offline.paired_check import check_table_pair

        report["challenger"] = check_table_pair(
            bundle,
            Bundle.load(args.challenger_bundle),
            args.challenger_bundle,
            args.data,
            columns,
            split_columns(args.challenger_proba_columns),
            batch_rows=args.batch_rows,
            limits=data_limits(args),
            labels=args.labels,
            seed=args.seed,
        )
    return report


def _companions(args: argparse.Namespace) -> list[CheckCompanion]:
    """What the check runs beside its report: the challenger the flags name (a model and its bundle)."""
    from agent.model.classifier import OnnxClassifier
    from agent.offline.paired_check import ChallengerCheck
    from invariants.bundle import Bundle

    if not args.challenger:
        if args.challenger_bundle:
            raise UserError("--challenger-bundle needs --challenger MODEL (the challenger's ONNX model)")
        return []
    if not args.challenger_bundle:
        raise UserError("--challenger needs --challenger-bundle (the challenger's bundle, `fit --champion`)")
    model = OnnxClassifier.load(args.challenger)
    bundle = Bundle.load(args.challenger_bundle, expected_model_sha256=model.sha256)
    model.decision_threshold = bundle.decision_threshold
    return [ChallengerCheck(model, bundle, args.challenger_bundle)]


def run(args: argparse.Namespace) -> int:
    # lazy: keeps numpy out of CLI start-up
    from agent.data.files import load_data
    from agent.offline.check import check_report
    from invariants.bundle import Bundle

    if not args.model:
        if args.challenger:
            raise UserError(
                "--challenger compares ONNX models: with a table-based bundle give --challenger-bundle only"
            )
        if Bundle.table_source(args.bundle) is None:
            raise UserError(f"--model is required: bundle {args.bundle} was fitted from an ONNX model")
        report = check_table(args)
        result = CheckReport(report)
        print(json.dumps(result.to_json()) if args.json else result.to_text())
        return 0
    if args.chunk_size is not None:
        raise UserError("--chunk-size applies to table-based bundles (fitted with `fit --reference`)")
    model = load_model(args)
    bundle = Bundle.load(args.bundle, expected_model_sha256=model.sha256)
    model.decision_threshold = bundle.decision_threshold
    rules = bundle.idi.metadata_fields if bundle.idi else frozenset()
    data = load_data(
        args.data,
        label_column=args.label_column,
        metadata=metadata_to_read(args.data, args.metadata, rules),
        require_metadata=bool(args.metadata),
        limits=data_limits(args),
        inputs=model.signature.names,
        image=image_reading(model, None, bundle.preprocess),
        classes=model.classes,
    )
    companions = _companions(args)
    report = check_report(model, bundle, data, args.metadata, labels=args.labels, seed=args.seed, companions=companions)
    result = CheckReport(report)
    print(json.dumps(result.to_json()) if args.json else result.to_text())
    return 0
