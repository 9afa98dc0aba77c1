"""What ``icos-agent check`` reports of a data set, as a result: the report :mod:`agent.offline` assembles
(verdicts, every estimate, the flag, the truth when the data are labeled, the segments, the chunks of a
table and the challenger's section) printed as one JSON object or as the lines a person reads — each part
in the words of the result that owns it (:mod:`agent.results.window`, :mod:`agent.results.bundle`,
:mod:`agent.results.segments`, :mod:`agent.results.paired`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.results.bundle import evidence_lines
from agent.results.paired import challenger_lines
from agent.results.segments import segment_lines
from agent.results.window import class_lines, estimate_lines, flag_lines


def chunk_lines(report: Mapping[str, Any]) -> list[str]:
    """One line per chunk of a table: rows, headline estimate with its interval, the truth when known, the
    failed predictions and the flag when raised."""
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
        flag = c.get("flag") or {}
        raised = f"  RAISED: {', '.join(flag['reasons'])}" if flag.get("raised") is True else ""
        lines.append(f"{c['start']:>8}..{c['end']:<7}{est}{truth}{fails:>8}{raised}")
    return lines


def _truth_lines(truth: Mapping[str, Any]) -> list[str]:
    none = truth.get("none_of_the_classes") or {}
    extra = (
        f" ({none['n']} labels, {none['share']:.1%}, say none of the model's classes: counted as wrong)"
        if none.get("n")
        else ""
    )
    return [f"true accuracy: {truth['accuracy']:.3f}{extra}"]


def _calibration_lines(calibration: object) -> list[str]:
    if not isinstance(calibration, dict) or not calibration.get("too_few_errors"):
        return []
    return [
        f"warning: the bundle's calibration split held only {calibration['n_wrong']} wrong predictions; "
        "estimates near clean data rest on raw confidence"
    ]


@dataclass(frozen=True)
class CheckReport:
    """The ``check`` report of one data set (as :mod:`agent.offline` assembled it)."""

    report: Mapping[str, Any]

    def to_json(self) -> Mapping[str, Any]:
        """The one JSON object ``check --json`` prints (every digit: programs compute from it)."""
        return self.report

    def to_row(self) -> dict[str, Any]:
        """One flat row: the predictions judged and the failed ones, the headline's ``estimator``, ``value``,
        ``lower`` and ``upper`` (its interval widened where the flag is raised), the ``truth`` when the data
        are labeled, ``alert`` (the flag raised; None: no flag) and its ``reasons`` (joined by ``;``)."""
        r = self.report
        headline = r.get("headline")
        e = r.get("headline_estimate") or r["estimates"].get(headline) or {}
        flag = r.get("flag") or {}
        truth = r.get("truth") or {}
        raised = flag.get("raised")
        return {
            "n": r["n"],
            "fails": r["n"] - r["verdicts"].get("pass", 0),
            "estimator": headline,
            "value": e.get("value"),
            "lower": e.get("lower"),
            "upper": e.get("upper"),
            "truth": truth.get("accuracy"),
            "alert": raised,
            "reasons": None if raised is None else ";".join(flag.get("reasons", [])),
        }

    def to_text(self) -> str:
        """The lines ``check`` prints: the counts and verdicts, the headline's choice, the truth, every
        estimate, the per-class figures, the oracle, the flag, the calibration's warning, where the drop is,
        the chunks and the challenger."""
        r = self.report
        truth = r.get("truth")
        verdicts = r["verdicts"]
        lines = [f"{r['n']} predictions judged", "verdicts: " + ", ".join(f"{k} {v}" for k, v in verdicts.items())]
        lines.extend(evidence_lines(r))
        if isinstance(truth, dict):
            lines.extend(_truth_lines(truth))
        lines.extend(estimate_lines(r["estimates"], r.get("headline"), r.get("abs_error", {}) if truth else None))
        lines.extend(class_lines(r.get("classes")))
        oracle = r.get("oracle")
        if isinstance(oracle, dict):
            lines.append(f"oracle: TPR {oracle['tpr']:.3f}  FPR {oracle['fpr']:.3f}  F1 {oracle['f1']:.3f}")
        lines.extend(flag_lines(r.get("flag"), r.get("headline_estimate")))
        lines.extend(_calibration_lines(r.get("calibration")))
        lines.extend(segment_lines(r))
        lines.append("* headline estimator")
        lines.extend(chunk_lines(r))
        lines.extend(challenger_lines(r.get("challenger")))
        return "\n".join(lines)
