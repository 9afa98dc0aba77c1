"""The demo reads ``GET /v1/estimates`` through the served results: a phase's estimates, unreliable marks,
realized accuracy and drop, the trace, and the lines the demo prints of them."""

from __future__ import annotations

import numpy as np

from agent.demo.live import phase_line, table_lines
from agent.demo.record import DemoRecord, PhaseStats
from tests.unit.test_segments import CLASSES, fitted, live


def test_a_served_window_becomes_the_phases_reading_and_its_lines() -> None:
    from agent.results.window import window_entry

    rng = np.random.default_rng(10)
    cal, data = fitted(rng)
    stats, _ = live(cal, data, rng, 2000, hurt="color=green")
    entry = window_entry("count", stats, cal, "doc", CLASSES, per_class_cap=20)
    doc = entry.to_json(cal, {"realized": {"accuracy": {"value": 0.71, "lower": 0.6, "upper": 0.8, "n": 40}}})
    doc["estimates"]["doc"]["unreliable"] = "too few predictions"
    record = DemoRecord("count", 4)
    record.phases = [PhaseStats("a", "in distribution", "clean", 4)]
    record.add_predictions(0, np.array([1, 1, 0, 1]), np.array([1, 1, 1, 1]), ["pass"] * 4)
    record.read_estimates(0, {"headline": "doc", "windows": {"count": doc, "1h": {}}})
    p = record.phases[0]
    assert record.headline == "doc" and record.estimators[0] == "doc"
    assert set(record.estimators) == set(doc["estimates"])
    marked = {k: e["unreliable"] for k, e in doc["estimates"].items() if e.get("unreliable")}
    assert p.realized == 0.71 and p.window_n == stats.n and p.unreliable == marked and "doc" in marked
    assert p.drop is not None and p.drop.name == "color=green"
    head = doc["estimates"]["doc"]
    assert p.to_dict()["estimates"]["doc"] == {k: float(v) for k, v in head.items() if isinstance(v, int | float)}
    assert p.to_dict()["drop"]["name"] == "color=green"
    assert record.trace[0].truth == 0.75
    assert record.trace[0].estimates["doc"] == (head["value"], head["lower"], head["upper"])
    line = phase_line(record, 0)
    assert f"doc* {head['value']:.3f} [{head['lower']:.3f}, {head['upper']:.3f}] (unreliable)" in line
    assert "where the drop is: color=green (a column segment" in line
    assert "realized (labels) 0.710" in line
    record.current = 0
    assert any(x.startswith("|err| doc") and f"{abs(head['value'] - 0.75):.3f}" in x for x in table_lines(record, 200))
    record.read_estimates(0, {"headline": "doc", "windows": {}})
    assert record.phases[0].realized == 0.71 and len(record.trace) == 1
