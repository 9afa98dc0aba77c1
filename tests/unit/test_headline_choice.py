"""The headline chosen from evidence at ``fit``: simulated windows of held-out rows, every estimator's
error on them, the choice of the best worst case, and its evidence through the bundle and the reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent.cli import main
from agent.data.tables import resolve_columns
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.evidence import HeadlineEvidence
from agent.offline.calibration.estimators.headline_choice import choose_headline, measure
from agent.offline.calibration.judged import JudgedSet
from agent.offline.calibration.shift_windows import KINDS, WindowPlanner, tilt_coordinates
from agent.offline.tables import check_table_report
from bench.headline.nannyml_style import CAR_FEATURES, car_loan
from invariants.bundle import Bundle


def _perfect_oracle_set(n: int = 2000, seed: int = 0) -> tuple[JudgedSet, np.ndarray]:
    """Rows where the oracle fails exactly the wrong predictions and the confidence says nothing about
    them, with an accuracy that depends on the class and on a feature: ``icos`` is exact under every
    window, the confidence estimators follow no shift."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    feature = rng.normal(size=n) + y
    p_right = np.where(y == 0, 0.95, 0.55)
    correct = rng.uniform(size=n) < p_right
    verdicts = np.where(correct, 0, 1).astype(np.int8)
    conf = rng.uniform(0.6, 1.0, n)
    return JudgedSet("clean", verdicts, conf, correct, y), tilt_coordinates(feature[:, None])


def _calibrate(s: JudgedSet):  # type: ignore[no-untyped-def]
    return lambda rows: EstimatorCalibration.fit(s.confidences[rows], s.correct[rows], s.verdicts[rows] != 0)


def test_the_choice_picks_the_estimator_that_is_clearly_better() -> None:
    clean, coords = _perfect_oracle_set()
    ev = choose_headline(clean, [], coords, _calibrate(clean), seed=0)
    assert ev is not None
    assert ev.default == "cbpe"
    assert ev.chosen in ("icos", "icos_corrected") and ev.chosen == ev.best
    assert ev.support >= 0.95
    assert ev.errors[ev.chosen].worst_kind < 0.01 < ev.errors["cbpe"].worst_kind
    assert set(ev.kinds) == {"clean", "label", "feature", "direction", "subpopulation", "confidence", "mixture"}
    assert ev.chosen in ev.reason


def test_a_split_of_few_errors_keeps_the_default_headline() -> None:
    """The same exact oracle on a split holding 12 wrong predictions: it still errs least on the windows,
    but 12 errors (6 per fold) are too few to choose on, so the default stays and the reason says why."""
    clean, coords = _perfect_oracle_set()
    wrong = np.flatnonzero(~clean.correct)[:12]
    rows = np.sort(np.r_[wrong, np.flatnonzero(clean.correct)[:600]])
    few = clean.take(rows)
    ev = choose_headline(few, [], coords[rows], _calibrate(few), seed=0)
    assert ev is not None
    assert ev.best in ("icos", "icos_corrected") and ev.chosen == ev.default == "cbpe"
    assert ev.support == 0.0
    assert "only 12 wrong prediction(s)" in ev.reason and "cbpe stays" in ev.reason


def test_the_support_resamples_the_calibration_rows_too() -> None:
    """Enough errors (about 150 in 600 rows) and a clearly better exact oracle: it is chosen, its support
    measured over resamples that recalibrate the classic estimators on redrawn rows (whose windows'
    estimates then change, except an exact oracle's)."""
    clean, coords = _perfect_oracle_set(n=600)
    m = measure(clean, [], coords, _calibrate(clean), seed=0, windows_per_kind=10)
    assert m is not None and m.wrong == int((~clean.correct).sum()) >= 20
    assert m.bootstrap is not None
    again = m.bootstrap.values(["cbpe", "icos_corrected"], np.random.default_rng(0))
    assert not np.allclose(again["cbpe"], m.estimates["cbpe"])  # the confidence offsets redrawn
    np.testing.assert_allclose(again["icos_corrected"], m.estimates["icos_corrected"])  # TPR 1, FPR 0 in any draw
    ev = choose_headline(clean, [], coords, _calibrate(clean), seed=0)
    assert ev is not None and ev.chosen in ("icos", "icos_corrected") and ev.support >= 0.95


def test_a_noise_oracle_never_heads() -> None:
    """Confidence that is the probability of being right, an oracle that is noise: a confidence
    estimator heads (``avg_conf`` may beat ``cbpe``, whose offsets only add noise here)."""
    rng = np.random.default_rng(1)
    n = 2000
    conf = rng.uniform(0.5, 1.0, n)
    correct = rng.uniform(size=n) < conf
    y = rng.integers(0, 3, n)
    verdicts = (rng.uniform(size=n) < 0.2).astype(np.int8)
    clean = JudgedSet("clean", verdicts, conf, correct, y)
    ev = choose_headline(clean, [], tilt_coordinates(rng.normal(size=(n, 3))), _calibrate(clean), seed=0)
    assert ev is not None and ev.chosen in ("cbpe", "avg_conf")
    assert ev.errors["cbpe"].worst_kind < ev.errors["icos"].worst_kind
    assert ev.errors[ev.chosen].ratio <= ev.errors["icos"].ratio


def test_too_few_rows_give_no_evidence() -> None:
    clean, coords = _perfect_oracle_set(n=40)
    assert choose_headline(clean, [], coords, _calibrate(clean), seed=0) is None


def test_windows_are_out_of_sample_and_seeded() -> None:
    clean, coords = _perfect_oracle_set(n=600)
    a = measure(clean, [], coords, _calibrate(clean), seed=3, windows_per_kind=3)
    b = measure(clean, [], coords, _calibrate(clean), seed=3, windows_per_kind=3)
    assert a is not None and b is not None
    np.testing.assert_array_equal(a.truth, b.truth)
    assert a.window_size == 300 and a.rows == 600 and a.folds == 2


def test_planner_kinds_follow_what_the_rows_have() -> None:
    rng = np.random.default_rng(0)
    n = 200
    one_class = WindowPlanner(np.zeros((n, 0)), rng.uniform(size=n), np.zeros(n, dtype=np.int64))
    assert one_class.kinds == ("clean", "confidence")
    full = WindowPlanner(rng.normal(size=(n, 2)), rng.uniform(size=n), rng.integers(0, 2, n), n_shifted=2)
    assert full.kinds == KINDS
    windows = full.plan(np.arange(n), 16, 50, rng)
    assert all(w.size == 50 for w in windows)
    assert {w.kind for w in windows} == set(KINDS)


def test_wide_features_are_tilted_along_principal_components() -> None:
    z = tilt_coordinates(np.random.default_rng(0).normal(size=(300, 40)))
    assert z.shape == (300, 8)
    np.testing.assert_allclose(z.std(axis=0), 1.0, atol=1e-9)


def test_evidence_round_trips_through_the_calibration() -> None:
    clean, coords = _perfect_oracle_set(n=400)
    ev = choose_headline(clean, [], coords, _calibrate(clean), seed=0)
    assert ev is not None
    cal = EstimatorCalibration.fit(clean.confidences, clean.correct, clean.verdicts != 0).with_headline(ev)
    back = EstimatorCalibration.from_dict(cal.to_dict())
    assert back.headline == ev
    assert HeadlineEvidence.from_dict(ev.to_dict()) == ev
    # bundles fitted before the choice, or with unreadable evidence, load without it
    d = cal.to_dict()
    d["headline"] = {"chosen": "x"}
    assert EstimatorCalibration.from_dict(d).headline is None


@pytest.fixture(scope="module")
def table_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("headline")
    table = car_loan(n_reference=2000, n_analysis=2000, seed=5)
    ref, ana = d / "ref.parquet", d / "ana.parquet"
    table.period("reference").to_parquet(ref)
    table.period("analysis").to_parquet(ana)
    cols = ["--proba-columns", ",".join(table.proba), "--feature-columns", ",".join(CAR_FEATURES)]
    argv = ["fit", "--reference", str(ref), "--label-column", table.label, *cols, "--trees", "20"]
    assert main([*argv, "--out", str(d / "b"), "--json"]) == 0
    return d / "b", ana


def test_a_table_bundle_names_its_headline_from_the_evidence(table_bundle: tuple[Path, Path]) -> None:
    bundle_dir, ana = table_bundle
    bundle = Bundle.load(bundle_dir)
    ev = EstimatorCalibration.from_dict(bundle.estimator_calibration).headline
    assert ev is not None
    assert bundle.headline == ev.chosen
    assert "shift_aware" not in ev.errors and {"cbpe", "doc", "icos"} <= set(ev.errors)
    chosen = ev.errors[ev.chosen].worst_kind
    assert all(chosen <= e.worst_kind for e in ev.errors.values()) or ev.chosen == ev.default
    columns, _ = resolve_columns(ana, proba=("y_pred_proba",), label="repaid", features=CAR_FEATURES)
    report = check_table_report(bundle, ana, columns, chunk_rows=1000)
    assert report["headline"] == ev.chosen
    assert report["headline_evidence"] == ev.to_dict()


def test_check_labels_reveals_n_labels_per_chunk_of_a_table(table_bundle: tuple[Path, Path]) -> None:
    bundle_dir, ana = table_bundle
    bundle = Bundle.load(bundle_dir)
    columns, _ = resolve_columns(ana, proba=("y_pred_proba",), label="repaid", features=CAR_FEATURES)
    report = check_table_report(bundle, ana, columns, chunk_rows=1000, batch_rows=300, labels=200, seed=4)
    assert report["estimates"]["with_labels"]["n_labels"] == 200
    for c in report["chunks"]:
        e = c["estimates"]["with_labels"]
        assert e["n_labels"] == 200 and e["seed"] == 4
        assert e["lower"] <= c["truth"]["accuracy"] + 0.05 and c["truth"]["accuracy"] - 0.05 <= e["upper"]
    again = check_table_report(bundle, ana, columns, chunk_rows=1000, batch_rows=500, labels=200, seed=4)
    assert again["chunks"][0]["estimates"]["with_labels"]["n_labels"] == 200
    unlabeled = check_table_report(bundle, ana, columns, chunk_rows=1000)
    assert "with_labels" not in unlabeled["estimates"]


def test_the_label_reservoir_is_a_uniform_sample() -> None:
    from agent.offline.tables import _Reservoir

    picked = np.zeros(100)
    for seed in range(300):
        r = _Reservoir(10, seed, 0)
        for a in range(0, 100, 7):
            ids = np.arange(a, min(a + 7, 100))
            r.add(ids.astype(np.float64), np.ones(len(ids), dtype=bool))
        assert r.size == 10 and len(set(r.conf.tolist())) == 10
        picked[r.conf.astype(int)] += 1
    # each row is kept with probability 10/100: 30 times in 300 draws (binomial sd about 5)
    assert picked.min() > 10 and picked.max() < 50
    small = _Reservoir(10, 0, 0)
    small.add(np.array([0.9, 0.8]), np.array([True, False]))
    assert small.size == 2 and small.stats().lab_n == 2


def test_reports_say_why_a_headline_has_no_evidence() -> None:
    from agent.estimation.estimators.evidence import NO_EVIDENCE_MODEL, NO_EVIDENCE_TABLE, evidence_section

    assert evidence_section(None, shift_aware=True) == {"headline_evidence": None, "headline_note": NO_EVIDENCE_MODEL}
    assert evidence_section(None, shift_aware=False)["headline_note"] == NO_EVIDENCE_TABLE
    clean, coords = _perfect_oracle_set(n=400)
    ev = choose_headline(clean, [], coords, _calibrate(clean), seed=0)
    assert ev is not None and evidence_section(ev, shift_aware=False) == {"headline_evidence": ev.to_dict()}
