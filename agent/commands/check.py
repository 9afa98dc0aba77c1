"""``icos-agent check``: judge a batch offline and print verdicts and every estimate."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from agent.commands.data_args import add_limit_arguments, data_limits, image_reading, metadata_to_read
from agent.commands.model_args import add_model_arguments, load_model, split_columns
from agent.errors import UserError

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


def format_chunks(report: dict[str, object]) -> list[str]:
    """One line per chunk: rows, headline estimate with its interval, the truth when known."""
    chunks = report.get("chunks")
    if not isinstance(chunks, list):
        return []
    headline = str(report.get("headline"))
    lines = [f"per chunk of {report.get('chunk_size')} rows ({headline}):"]
    lines.append(f"{'rows':>17}{'estimate':>10}{'95% interval':>22}{'truth':>9}{'fails':>8}  flag")
    for c in chunks:
        e = c.get("headline_estimate") or c["estimates"].get(headline)
        est = f"{e['value']:>10.4f}   [{e['lower']:.4f}, {e['upper']:.4f}]" if e else f"{'-':>10}{'':>22}"
        truth = f"{c['truth']['accuracy']:>9.4f}" if "truth" in c else f"{'-':>9}"
        fails = c["n"] - c["verdicts"].get("pass", 0)
        trust = c.get("trust") or {}
        flag = f"  RAISED: {', '.join(trust['reasons'])}" if trust.get("calibrated") is False else ""
        lines.append(f"{c['start']:>8}..{c['end']:<7}{est}{truth}{fails:>8}{flag}")
    return lines


def format_trust(report: dict[str, object]) -> list[str]:
    """Is the headline right: the flag (raised, with its reasons and the widened interval, or down), and the
    trust distance it rests on."""
    trust, head = report.get("trust"), report.get("headline_estimate")
    if not isinstance(trust, dict):
        return []
    lines = []
    reasons = [str(r).replace("_", " ") for r in trust.get("reasons", [])]
    if trust.get("basis") == "flag":
        if not trust["calibrated"] and isinstance(head, dict):
            own = head.get("own_interval")
            interval = f"[{head['lower']:.3f}, {head['upper']:.3f}]"
            widened = (
                f"its interval is widened to {interval} (its own [{own['lower']:.3f}, {own['upper']:.3f}])"
                if own
                else f"its own interval {interval} is already as wide as the flag asks"
            )
            lines.append(
                f"FLAG RAISED: the headline may be off by more than {trust['tolerance']:.2f} (estimated probability "
                f"{trust['probability']:.0%}): {', '.join(reasons)}; {widened}"
            )
        else:
            text = (
                f"flag down: the headline is expected within {trust['tolerance']:.2f} of the truth (estimated "
                f"probability of a larger error {trust['probability']:.0%})"
            )
            if "class_mix" in trust and trust["class_mix"].get("only"):
                text += "; the class mix changed and nothing else did (label shift): confidence-based estimates hold"
            lines.append(text + (f"; notes: {', '.join(reasons)}" if reasons else ""))
    if "distance" in trust:
        where = "inside" if trust["in_calibrated_range"] else "outside"
        lines.append(
            f"trust: distance {trust['distance']:.2f} ({where} the calibrated range; "
            f"{trust['weight']:.0%} of the learnt correction used)"
        )
    if trust.get("basis") != "flag" and trust.get("note"):
        lines.append(f"note: {trust['note']}")
    return lines


#: Segments ``check`` names in words (``--json`` lists them all).
SEGMENTS_SHOWN = 3


def format_segments(report: dict[str, object]) -> list[str]:
    """Where the drop is, in words: the segments that lost the most accuracy beyond noise (their share now
    and at reference, the estimate against the reference, the truth when known), and the changes of mix."""
    rows = report.get("segments")
    drop = report.get("segment_drop")
    if not isinstance(rows, list) or not isinstance(drop, dict):
        return []
    lost = [r for r in rows if r["contribution"] > 0][:SEGMENTS_SHOWN]
    if not lost:
        lines = ["where the drop is: no segment lost accuracy beyond noise against its reference"]
    else:
        lines = [f"where the drop is (segments by accuracy lost, {drop['estimator']} per segment):"]
    for r in lost:
        e = r["estimate"]
        truth = f", true {r['truth_accuracy']:.3f}" if "truth_accuracy" in r else ""
        if "realized" in r:
            z = r["realized"]
            truth += f", {z['n']} labels drawn: {z['value']:.3f} [{z['lower']:.3f}, {z['upper']:.3f}]"
        lines.append(
            f"  {r['name']}: {r['share']:.0%} of predictions (reference {r['reference_share']:.0%}), estimated "
            f"{e['value']:.3f} [{e['lower']:.3f}, {e['upper']:.3f}] against {r['reference_accuracy']:.3f} at "
            f"reference{truth}: {r['contribution']:.3f} of the accuracy"
        )
    moved = [(name, d["mix"]) for name, d in drop["dimensions"].items() if abs(d["mix"]) >= 0.01]
    for name, mix in moved:
        way = "costs" if mix > 0 else "gains"
        lines.append(f"  the change of mix of {name} alone {way} {abs(mix):.3f} of the accuracy")
    return lines


def format_report(report: dict[str, object]) -> str:
    lines = [f"{report['n']} predictions judged"]
    verdicts = report["verdicts"]
    assert isinstance(verdicts, dict)
    lines.append("verdicts: " + ", ".join(f"{k} {v}" for k, v in verdicts.items()))
    evidence = report.get("headline_evidence")
    if isinstance(evidence, dict):
        lines.append(f"headline {evidence['chosen']} (chosen at fit on simulated shifts): {evidence['reason']}")
    truth = report.get("truth")
    if isinstance(truth, dict):
        none = truth.get("none_of_the_classes") or {}
        extra = (
            f" ({none['n']} labels, {none['share']:.1%}, say none of the model's classes: counted as wrong)"
            if none.get("n")
            else ""
        )
        lines.append(f"true accuracy: {truth['accuracy']:.3f}{extra}")
    lines.append(f"{'estimator':<16}{'estimate':>9}{'95% interval':>18}" + ("  abs error" if truth else ""))
    estimates = report["estimates"]
    errors = report.get("abs_error", {})
    assert isinstance(estimates, dict) and isinstance(errors, dict)
    headline = report.get("headline")
    for name, e in sorted(estimates.items(), key=lambda kv: kv[0] != headline):  # headline first
        mark = " *" if name == report.get("headline") else ""
        row = f"{name + mark:<16}{e['value']:>9.3f}   [{e['lower']:.3f}, {e['upper']:.3f}]"
        if truth:
            row += f"{errors[name]:>11.3f}"
        if "n_labels" in e:
            row += f"  ({e['n_labels']} labels)"
        if "unreliable" in e:
            row += f"  unreliable: {e['unreliable']}"
        lines.append(row)
    classes = report.get("classes")
    if isinstance(classes, dict):
        for kind in ("estimated", "realized", "with_labels"):
            block = classes.get(kind)
            if isinstance(block, dict):
                macro, weighted = block["macro"], block["weighted"]
                auc = f"  ROC AUC {block['roc_auc']:.4f}" if block.get("roc_auc") is not None else ""
                caveat = (
                    "  (label-free: the expected F1 if the model's probabilities are calibrated)"
                    if kind == "estimated"
                    else ""
                )
                lines.append(f"F1 {kind}: macro {macro['f1']:.3f}  weighted {weighted['f1']:.3f}{auc}{caveat}")
    oracle = report.get("oracle")
    if isinstance(oracle, dict):
        lines.append(f"oracle: TPR {oracle['tpr']:.3f}  FPR {oracle['fpr']:.3f}  F1 {oracle['f1']:.3f}")
    lines.extend(format_trust(report))
    calibration = report.get("calibration")
    if isinstance(calibration, dict) and calibration.get("too_few_errors"):
        lines.append(
            f"warning: the bundle's calibration split held only {calibration['n_wrong']} wrong predictions; "
            "estimates near clean data rest on raw confidence"
        )
    lines.extend(format_segments(report))
    lines.append("* headline estimator")
    lines.extend(format_chunks(report))
    lines.extend(format_challenger(report.get("challenger")))
    return "\n".join(lines)


def format_challenger(section: object) -> list[str]:
    """The ``challenger`` section in a few lines: the agreement, the difference and what it decides, each
    version's headline, and the truth when known."""
    if not isinstance(section, dict):
        return []
    lines = [f"challenger: agrees with the model on {section['agreement']:.1%} of {section['n']} predictions"]
    for role in ("champion", "challenger"):
        h = section.get(role)
        if isinstance(h, dict):
            lines.append(f"  {role:<11}{h['value']:>9.3f}   [{h['lower']:.3f}, {h['upper']:.3f}]  ({h['estimator']})")
    for name, d in section.get("differences", {}).items():
        verdict = "better" if d["lower"] > 0 else "worse" if d["upper"] < 0 else "undecided"
        labels = f", {d['n_labels']} labels" if "n_labels" in d else ""
        lines.append(
            f"  difference {d['value']:>+8.3f}   [{d['lower']:+.3f}, {d['upper']:+.3f}]  ({name}{labels}): "
            f"challenger {verdict}" + (" with 95% confidence" if verdict != "undecided" else "")
        )
        if "unreliable" in d:
            lines.append(f"    unreliable: {d['unreliable']}")
    truth = section.get("truth")
    if isinstance(truth, dict):
        lines.append(
            f"  true difference {truth['difference']:+.3f} (champion {truth['champion']:.3f}, "
            f"challenger {truth['challenger']:.3f})"
        )
    return lines


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
        print(json.dumps(report) if args.json else format_report(report))
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
    print(json.dumps(report) if args.json else format_report(report))
    return 0
