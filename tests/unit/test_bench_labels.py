"""The label benchmark (``python -m bench.labels``): with every prediction of a window labeled,
the prediction-powered estimate is the window's true accuracy exactly; with fewer labels the summary
has one row per model, label count and estimate, and the command line refuses bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

from agent.estimation.estimators.strata import strata_of
from bench.estimators.harness import Config
from bench.labels.__main__ import (
    ACTIVE,
    ACTIVE_GRID,
    METHODS,
    STRATIFIED,
    main,
    needs_table,
    run_model,
    summary,
    table,
    targets,
)
from bench.labels.draws import stratified_ceiling


def test_all_labels_give_the_truth_and_the_summary_has_every_row() -> None:
    results = run_model("digits", Config(reps=2, size=60, pool_min=400), (10, 60), say=lambda _s: None)
    full = [r for r in results if r.labels == 60]
    assert full and all(r.value == pytest.approx(r.truth, abs=1e-12) for r in full)
    rows = summary(results)
    assert {(r[1], r[2]) for r in rows} == {(0, "avg_conf"), (10, "with_labels"), (10, "labels_only")} | {
        (60, "with_labels"),
        (60, "labels_only"),
    } | {(n, d) for n in {10, 60, *ACTIVE_GRID} for d in (ACTIVE, STRATIFIED)}
    assert {r[2] for r in rows} == set(METHODS)
    for _model, n, method, mae, worst, cover, lowest, half in rows:
        assert 0 <= mae <= worst <= 1
        if method != "avg_conf":
            assert 0 <= lowest <= cover <= 1 and half >= 0
        if n >= 60:  # every prediction labeled (active: drawn with probability 1)
            assert mae == pytest.approx(0, abs=1e-12) and lowest == 1
    assert table(rows).count("\n") == len(rows) + 1


def test_targets_name_pass_or_fail_per_model() -> None:
    results = run_model("digits", Config(reps=2, size=300, pool_min=400), (200,), say=lambda _s: None)
    lines = targets(summary(results)).splitlines()
    assert len(lines) == 3 and lines[2].startswith("| digits |")
    assert lines[2].count("PASS") + lines[2].count("FAIL") == 2


def test_needs_table_names_pass_or_fail_per_model() -> None:
    results = run_model("digits", Config(reps=2, size=300, pool_min=400), (100, 200), say=lambda _s: None)
    lines = needs_table(summary(results), results).splitlines()
    assert len(lines) == 6 and all(line.startswith("| digits |") for line in lines[2:])
    assert [line.split(" | ")[1] for line in lines[2:]] == [ACTIVE, ACTIVE, STRATIFIED, STRATIFIED]
    assert all("±" in line and line.count("PASS") + line.count("FAIL") >= 1 for line in lines[2:])


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--models", "nope"]) == 2
    assert main(["--labels", "0"]) == 2
    assert "error:" in capsys.readouterr().err


def test_the_ceiling_saves_labels_only_where_a_stratum_holds_the_errors() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    f = np.full(n, 0.9)
    segment = (np.arange(n) < n // 10).astype(np.int64)  # a tenth of the window in segment 1
    calibrated = rng.random(n) < f  # every row right 90% of the time, as f says
    strata = strata_of(f, segment[None, :])
    # errors spread as the predictor says: no stratum differs, no design saves a label
    assert stratified_ceiling(f, calibrated, strata, 0.5) == pytest.approx(1.0, abs=0.03)
    # the segment broken (right 30% of the time): its rows carry most of the squared residual
    broken = np.where(segment == 1, rng.random(n) < 0.3, calibrated)
    at_floor, no_floor = stratified_ceiling(f, broken, strata, 0.5), stratified_ceiling(f, broken, strata, 1e-9)
    assert no_floor < at_floor < 1.0
    # Neyman's share by hand: (Σ W m)² / Σ W m², m the root mean squared residual of each segment
    sq = (broken - f) ** 2
    w = np.array([np.mean(segment == k) for k in (0, 1)])
    m = np.array([np.sqrt(sq[segment == k].mean()) for k in (0, 1)])
    assert no_floor == pytest.approx(float((w @ m) ** 2 / (w @ m**2)), rel=1e-6)
