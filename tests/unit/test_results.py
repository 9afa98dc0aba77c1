"""Each result renders itself, and its renderings agree: the JSON, the metric points, the lines ``check``
prints and the flat row of a window, a segment table, the bundle and a challenger's pair; and a served
document reads back as the results it was written from."""

from __future__ import annotations

import numpy as np
import pytest

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.pairs.calibration import P_EDGES, DisagreementModel, PairCalibration
from agent.estimation.pairs.paired import PairSums
from agent.estimation.statistics.window import WindowStats
from agent.results.bundle import BundleSection
from agent.results.check_report import CheckReport
from agent.results.paired import paired_entry
from agent.results.served import NO_DROP, ServedEstimates, drop_text
from agent.results.window import WindowEntry, snapshot_points, window_entry
from tests.unit.test_segments import CLASSES, fitted, live


def _entry(seed: int = 0) -> tuple[WindowEntry, EstimatorCalibration]:
    rng = np.random.default_rng(seed)
    conf = np.clip(rng.normal(0.9, 0.05, 3000), 0.34, 1.0)
    verdicts = (rng.uniform(size=3000) < 0.05).astype(np.int64) * 2
    cal = EstimatorCalibration.fit(conf, rng.uniform(size=3000) < conf, verdicts != 0)
    stats = WindowStats.of_samples(verdicts[:400], np.clip(conf[:400] - 0.1, 0.34, 1), 0.5)
    return window_entry("5m", stats, cal, "cbpe", per_class_cap=10), cal


def test_a_windows_row_holds_what_its_json_and_points_hold() -> None:
    entry, cal = _entry()
    doc = entry.to_json(cal)
    row = entry.to_row(realized=0.8)
    head = doc["headline"]
    assert (row["window"], row["n"], row["estimator"]) == ("5m", doc["n"], head["estimator"])
    assert (row["value"], row["lower"], row["upper"]) == (head["value"], head["lower"], head["upper"])
    for name, e in entry.estimates.items():
        assert (row[f"{name}_value"], row[f"{name}_lower"], row[f"{name}_upper"]) == (e.value, e.lower, e.upper)
        assert doc["estimates"][name]["value"] == pytest.approx(e.value, abs=1e-6)
    assert row["realized"] == 0.8 and entry.to_row()["realized"] is None
    a = entry.assessment
    assert row["alert"] == (None if a is None else a.raised)
    assert all(isinstance(v, str | int | float | bool | type(None)) for v in row.values())
    points = entry.points()
    assert [(p.estimator, p.value) for p in points.estimates] == [(k, e.value) for k, e in entry.estimates.items()]
    assert points.headline is not None and points.headline.value == head["value"]
    assert snapshot_points([entry]).windows == [points.window]


def test_a_windows_text_is_the_lines_check_prints_of_the_same_figures() -> None:
    entry, cal = _entry()
    doc = entry.to_json(cal)
    lines = entry.to_text(cal)
    assert lines[0].startswith("estimator") and lines[1].startswith(f"{doc['headline']['estimator']} *")
    assert len([x for x in lines[1 : 1 + len(doc["estimates"])] if "[" in x]) == len(doc["estimates"])
    report = {"n": doc["n"], "verdicts": {"pass": doc["n"] - doc["fails"]}, "estimates": doc["estimates"]}
    report["headline"] = doc["headline"]["estimator"]
    text = CheckReport(report).to_text().splitlines()
    assert text[2 : 2 + len(doc["estimates"]) + 1] == lines[: len(doc["estimates"]) + 1]
    assert text[-1] == "* headline estimator"


def test_a_segment_table_renders_itself_and_reads_back_from_the_served_document() -> None:
    rng = np.random.default_rng(10)
    cal, data = fitted(rng)
    stats, _ = live(cal, data, rng, 2000, hurt="color=green")
    entry = window_entry("1h", stats, cal, "doc", CLASSES, per_class_cap=20)
    segments = entry.segment_result
    assert segments is not None
    row = segments.to_row()
    assert row["segment"] == "color=green" and row["alert"] is True
    assert row["contribution"] == pytest.approx(segments.points()[0].contribution)
    assert segments.to_text()[0].startswith("where the drop is (segments by evidence of a drop")
    assert "color=green" in segments.to_text()[1]
    body = {"headline": "doc", "windows": {"1h": entry.to_json(cal, {"realized": {"accuracy": {"value": 0.7}}})}}
    served = ServedEstimates.from_json(body).windows["1h"]
    assert served.n == stats.n and served.realized == 0.7
    assert served.drop is not None and served.drop.name == "color=green"
    assert served.drop.contribution == pytest.approx(row["contribution"], abs=1e-6)
    assert drop_text(served.drop).startswith("color=green (a column segment") and drop_text(None) == NO_DROP
    for name, e in entry.estimates.items():
        assert served.estimates[name].interval() == pytest.approx((e.value, e.lower, e.upper), abs=1e-6)


def test_the_bundle_section_says_the_same_in_json_points_and_row() -> None:
    _, cal = _entry()
    section = BundleSection("cbpe", cal)
    doc, points, row = section.to_json(), section.points(), section.to_row()
    assert doc["headline"] == row["headline"] == "cbpe"
    assert doc["oracle"] == {"tpr": points.oracle_tpr, "fpr": points.oracle_fpr}
    assert doc["reference"]["accuracy"] == points.reference_accuracy == row["reference"]


def test_a_pair_renders_itself_the_same_in_json_points_text_and_row() -> None:
    pair = PairCalibration(DisagreementModel((0.0,) * 5, (0.0,) * 5), (0.1,) * (len(P_EDGES) + 1))
    sums = PairSums(1000, 40, qa_sum=10.0, qb_sum=30.0, g_sq_sum=20.0)
    entry = paired_entry("1h", sums, pair)
    doc, point, row = entry.to_json(decimals=None), entry.points(), entry.to_row()
    best = doc["difference"]
    assert (row["estimator"], row["value"], row["lower"], row["upper"]) == (
        best["estimator"],
        best["value"],
        best["lower"],
        best["upper"],
    )
    assert row["alert"] == (best["lower"] > 0 or best["upper"] < 0)
    assert (point.n, point.agreement) == (doc["n"], doc["agreement"]) == (row["n"], row["agreement"])
    assert [d.value for d in point.differences] == [d["value"] for d in doc["differences"].values()]
    text = entry.to_text()
    assert text[0] == f"challenger: agrees with the model on {sums.agreement:.1%} of 1000 predictions"
    assert any(line.startswith("  difference") for line in text)


def test_checks_row_holds_the_headline_the_truth_and_the_flag_of_its_report() -> None:
    entry, cal = _entry()
    doc = entry.to_json(cal)
    report = {"n": doc["n"], "verdicts": {"pass": doc["n"] - doc["fails"]}, "estimates": doc["estimates"]}
    report.update(headline=doc["headline"]["estimator"], truth={"accuracy": 0.75})
    report["flag"] = {"raised": True, "reasons": ["confidence_shifted", "class_mix"]}
    row = CheckReport(report).to_row()
    e = doc["estimates"][report["headline"]]
    assert (row["value"], row["lower"], row["upper"]) == (e["value"], e["lower"], e["upper"])
    assert (row["n"], row["fails"], row["truth"]) == (doc["n"], doc["fails"], 0.75)
    assert (row["alert"], row["reasons"]) == (True, "confidence_shifted;class_mix")
    del report["flag"]
    assert CheckReport(report).to_row()["alert"] is None
