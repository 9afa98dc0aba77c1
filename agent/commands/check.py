"""``icos-agent check``: judge a batch offline and print verdicts and every estimate."""

from __future__ import annotations

import argparse
import json

from agent.commands.model_args import add_model_arguments, load_model


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("check", help="judge a data set with a bundle: verdicts, estimates, truth if labeled")
    add_model_arguments(p)
    p.add_argument("--bundle", required=True, help="bundle directory written by `fit`")
    p.add_argument("--data", required=True, help="data (.npz x[/y], .csv, .parquet)")
    p.add_argument("--metadata", nargs="*", default=[], help="metadata columns/arrays the IDIs read")
    p.add_argument("--label-column", help="label column for CSV/Parquet data")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.set_defaults(func=run)


def format_report(report: dict[str, object]) -> str:
    lines = [f"{report['n']} predictions judged"]
    verdicts = report["verdicts"]
    assert isinstance(verdicts, dict)
    lines.append("verdicts: " + ", ".join(f"{k} {v}" for k, v in verdicts.items()))
    truth = report.get("truth")
    if isinstance(truth, dict):
        lines.append(f"true accuracy: {truth['accuracy']:.4f}")
    lines.append(f"{'estimator':<16}{'estimate':>10}{'95% interval':>22}" + ("  abs error" if truth else ""))
    estimates = report["estimates"]
    errors = report.get("abs_error", {})
    assert isinstance(estimates, dict) and isinstance(errors, dict)
    headline = report.get("headline")
    for name, e in sorted(estimates.items(), key=lambda kv: kv[0] != headline):  # headline first
        mark = " *" if name == report.get("headline") else ""
        row = f"{name + mark:<16}{e['value']:>10.4f}   [{e['lower']:.4f}, {e['upper']:.4f}]"
        if truth:
            row += f"{errors[name]:>11.4f}"
        lines.append(row)
    oracle = report.get("oracle")
    if isinstance(oracle, dict):
        lines.append(f"oracle: TPR {oracle['tpr']:.3f}  FPR {oracle['fpr']:.3f}  F1 {oracle['f1']:.3f}")
    trust = report.get("trust")
    if isinstance(trust, dict):
        where = "inside" if trust["calibrated"] else "OUTSIDE"
        lines.append(
            f"trust: distance {trust['distance']:.2f} ({where} the calibrated range; "
            f"{trust['weight']:.0%} of the learnt correction used)"
        )
    calibration = report.get("calibration")
    if isinstance(calibration, dict) and calibration.get("too_few_errors"):
        lines.append(
            f"warning: the bundle's calibration split held only {calibration['n_wrong']} wrong predictions; "
            "estimates near clean data rest on raw confidence"
        )
    lines.append("* headline estimator")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # lazy: keeps numpy out of CLI start-up
    from agent.data.files import load_data
    from agent.offline.check import check_report
    from invariants.bundle import Bundle

    model = load_model(args)
    bundle = Bundle.load(args.bundle, expected_model_sha256=model.sha256)
    data = load_data(args.data, label_column=args.label_column, metadata=args.metadata)
    report = check_report(model, bundle, data, args.metadata)
    print(json.dumps(report) if args.json else format_report(report))
    return 0
