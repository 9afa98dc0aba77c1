"""``icos-agent estimate-lake``: ``check`` over the Parquet files of a directory or a glob, read row group by row
group (memory bounded by one batch), optionally cut into windows of time or of rows."""

from __future__ import annotations

import argparse
import json

from agent.commands.data_args import add_limit_arguments, data_limits
from agent.commands.model_args import add_model_arguments, load_model


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "estimate-lake",
        help="check over a directory or glob of Parquet files, streamed row group by row group (the same "
        "result as check over the files concatenated), optionally per window",
    )
    add_model_arguments(p)
    p.add_argument("--bundle", required=True, help="bundle directory written by `fit`")
    p.add_argument("--data", required=True, help="a directory of .parquet files (recursively) or a glob of them")
    p.add_argument("--label-column", help="label column, where the data has labels")
    p.add_argument("--metadata", nargs="*", default=[], help="metadata columns the IDIs read")
    p.add_argument("--timestamp", metavar="COLUMN", help="timestamp column (with a duration --window)")
    p.add_argument(
        "--window",
        metavar="SPAN",
        help="also report every window: a duration (1h, 15min, '1 day'; needs --timestamp), or a number of rows",
    )
    p.add_argument(
        "--batch-rows",
        type=int,
        default=16384,
        help="rows read at once (bounds memory whatever the lake's size; default 16384)",
    )
    p.add_argument(
        "--openmetrics",
        metavar="FILE",
        help="also write the time windows as the agent's metrics history (OpenMetrics text, each sample stamped "
        "with its window's end) for `promtool tsdb create-blocks-from openmetrics FILE DATA_DIR`",
    )
    p.add_argument(
        "--model-name",
        metavar="NAME",
        help="the model label of --openmetrics' series: the agent's model.name (default: file name)",
    )
    p.add_argument(
        "--model-version",
        metavar="VERSION",
        default="1",
        help="the version label of --openmetrics' series: model.version (default 1)",
    )
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    add_limit_arguments(p)
    p.set_defaults(func=run)


def _window(text: str | None) -> str | int | None:
    """A number of rows, or a duration."""
    if text is None:
        return None
    return int(text) if text.strip().isdigit() else text


def run(args: argparse.Namespace) -> int:
    from agent.errors import UserError
    from agent.offline.backfill import window_label, write_openmetrics
    from agent.offline.lake import lake_batches, lake_files
    from agent.offline.windowed import Windowed, Windowing
    from invariants.bundle import Bundle

    if not args.model:
        raise UserError("--model is required: estimate-lake runs the ONNX model over the lake")
    windowing = Windowing.of(_window(args.window))
    if windowing.by_time and not args.timestamp:
        raise UserError("a duration --window needs --timestamp (the column of the rows' times)")
    if args.openmetrics:
        window_label(windowing)  # refuses windows of rows before the model runs
    model = load_model(args)
    bundle = Bundle.load(args.bundle, expected_model_sha256=model.sha256)
    model.decision_threshold = bundle.decision_threshold
    files = lake_files(args.data)
    batches = lake_batches(
        files,
        model.signature.names,
        label_column=args.label_column,
        timestamp_column=args.timestamp,
        metadata=args.metadata,
        batch_rows=args.batch_rows,
        limits=data_limits(args),
    )
    windowed = Windowed(model, bundle, windowing).add_all(batches, args.batch_rows)
    report = windowed.report()
    report["files"] = len(files)
    if args.openmetrics:
        written = write_openmetrics(
            args.openmetrics, windowed, model_name=args.model_name, model_version=args.model_version
        )
        report["openmetrics"] = written.to_json()
    print(json.dumps(report) if args.json else "\n".join(_text(report)))
    return 0


def _text(report: dict[str, object]) -> list[str]:
    """``check``'s lines, then one line per window."""
    from agent.results.check_report import CheckReport

    lines = [f"{report['files']} Parquet file(s)", CheckReport(report).to_text()]
    windows = report.get("windows")
    if isinstance(windows, list):
        head = str(report.get("headline"))
        lines.append(f"per window ({head}):")
        for w in windows:
            e = w.get("headline_estimate") or w["estimates"].get(head)
            est = f"{e['value']:.4f} [{e['lower']:.4f}, {e['upper']:.4f}]" if e else "-"
            trust = w.get("trust") or {}
            flag = f"  RAISED: {', '.join(trust['reasons'])}" if trust.get("calibrated") is False else ""
            lines.append(f"  {w['start']}..{w['end']}  n {w['n']}  {est}{flag}")
    om = report.get("openmetrics")
    if isinstance(om, dict):
        lines.append(
            f"metrics history: {om['samples']} samples of {om['series']} series over {om['windows']} windows "
            f"({om['first']}..{om['last']}) in {om['path']}"
        )
    return lines
