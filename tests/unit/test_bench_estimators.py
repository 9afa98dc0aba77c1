"""The estimator benchmark's scenario generators and report rows (its quick run end to end:
tests/integration/test_bench_estimators_run.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.estimators.__main__ import main
from bench.estimators.scenarios import (
    ImageSpec,
    TabularSpec,
    image_scenarios,
    resample_images,
    tabular_scenarios,
)


def test_scenarios_keep_shapes_ranges_and_are_seeded() -> None:
    x = np.random.default_rng(0).uniform(0, 16, (20, 1, 8, 8)).astype(np.float32)
    names = []
    for sc in image_scenarios(ImageSpec(16.0)):
        names.append(sc.name)
        if sc.transform is None:
            continue
        a = sc.transform(x, np.random.default_rng(1))
        b = sc.transform(x, np.random.default_rng(1))
        assert a.shape == x.shape and a.min() >= 0 and a.max() <= 16
        np.testing.assert_array_equal(a, b)
    assert len(names) == 23 and "mixture" in names and "label_shift_strong" in names
    for family in ("stroke", "speckle", "flip", "invert"):  # families of no kind in the calibration
        assert {f"{family}_mild", f"{family}_strong"} <= set(names)
    kin = {sc.name: sc.calibration_kin for sc in image_scenarios(ImageSpec(16.0))}
    assert kin["blur_strong"] == ("audit:blur",) and kin["label_shift_mild"] == ()
    assert kin["invert_mild"] == ("invert",) and "far_brightness" in kin["brightness_contrast_strong"]
    mixed = {k for n, v in kin.items() for k in v if n != "mixture" and not n.startswith("invert")}
    assert set(kin["mixture"]) == mixed  # the mixture is of the calibration's kinds; inversions are no part of it
    t = np.random.default_rng(0).normal(size=(30, 5)).astype(np.float32)
    for sc in tabular_scenarios(TabularSpec(t.mean(axis=0), t.std(axis=0))):
        if sc.transform is not None:
            assert sc.transform(t, np.random.default_rng(2)).shape == t.shape


def test_new_scenario_kinds_natural_subpopulation_and_clean_or_shifted_windows() -> None:
    other = (np.zeros((3, 1, 28, 28), np.float32), np.arange(3))
    image = {sc.name: sc for sc in image_scenarios(ImageSpec(16.0), lambda: other)}
    assert image["other_dataset"].pool is not None and image["other_dataset"].pool()[1].tolist() == [0, 1, 2]
    mixed = image["clean_or_shifted"]
    assert mixed.segments[0] is None and len(mixed.segments) == 5 and mixed.transform is None
    up = resample_images(np.full((2, 1, 8, 8), 16.0, np.float32), 28, 255.0)
    assert up.shape == (2, 1, 28, 28) and float(up.max()) == pytest.approx(255.0)
    t = np.arange(40, dtype=np.float32).reshape(20, 2)
    table = {sc.name: sc for sc in tabular_scenarios(TabularSpec(t.mean(axis=0), t.std(axis=0)), informative=1)}
    keep = table["subpopulation_strong"].select(t)  # type: ignore[misc]
    assert keep.sum() == 4 and keep[-4:].all()
    assert {"unit_change_strong", "saturation_mild", "outlier_rows_strong", "clean_or_shifted"} <= set(table)


def test_calibration_seed_rows_and_names() -> None:
    from bench.estimators.harness import Record, seed_of, seeded_name
    from bench.estimators.report import seed_rows, summarise

    assert seed_of(seeded_name(7)) == 7 and seed_of("shift_aware") is None and seed_of("shift_aware_seedx") is None
    recs = [
        Record("m", "none", sc, 0, est, value, value - 0.1, value + 0.1, 0.5)
        for sc, est, value in [
            ("a", "shift_aware", 0.52),
            ("b", "shift_aware", 0.6),
            ("a", seeded_name(3), 0.5),
            ("b", seeded_name(3), 0.45),
            ("a", seeded_name(1), 0.9),
            ("b", seeded_name(1), 0.5),
        ]
    ]
    rows = seed_rows(summarise(recs), "m", shipped_seed=0)
    assert [s for s, _, _ in rows] == [0, 1, 3]  # shipped first, then the others in order
    shipped, one, three = (o for _, o, _ in rows)
    assert np.isclose(shipped.mean_mae, 0.06) and np.isclose(shipped.worst_scenario_mae, 0.1)
    assert [w for _, _, w in rows] == ["b", "a", "b"]
    assert np.isclose(one.worst_scenario_mae, 0.4) and one.coverage == 0.5 and three.coverage == 1.0


def test_window_size_rows_and_names() -> None:
    from bench.estimators.harness import Record, size_of, sized_name
    from bench.estimators.report import size_rows, summarise

    assert size_of(sized_name(100)) == 100 and size_of("shift_aware") is None and size_of(sized_name(3)[:-1]) is None
    recs = [
        Record("m", "none", sc, 0, est, value, value - half, value + half, 0.5)
        for sc, est, value, half in [
            ("a", "shift_aware", 0.52, 0.05),
            ("b", "shift_aware", 0.6, 0.05),
            ("a", sized_name(3000), 0.51, 0.02),
            ("b", sized_name(3000), 0.49, 0.02),
            ("a", sized_name(100), 0.8, 0.2),
            ("b", sized_name(100), 0.5, 0.1),
            ("a", "avg_conf", 0.9, 0.3),  # other estimators are not window sizes
        ]
    ]
    rows = size_rows(recs, summarise(recs), "m", main_size=1000)
    assert [n for n, _, _ in rows] == [100, 1000, 3000]  # smallest first, the tables' size among them
    small, main_, large = (o for _, o, _ in rows)
    assert np.isclose(small.mean_mae, 0.15) and np.isclose(small.worst_scenario_mae, 0.3) and small.coverage == 0.5
    assert np.isclose(main_.mean_mae, 0.06) and np.isclose(large.worst_scenario_mae, 0.01)
    assert np.allclose([h for _, _, h in rows], [0.15, 0.05, 0.02])


@pytest.mark.parametrize("spec", ["100,x", "0", "300,-5"])
def test_bad_window_sizes_are_refused(spec: str, capsys: object) -> None:
    assert main(["--quick", "--window-sizes", spec, "--out", "-"]) == 2
    assert "--window-sizes" in capsys.readouterr().err  # type: ignore[attr-defined]


@pytest.mark.parametrize("spec", ["1,x", "-1"])
def test_bad_calibration_seeds_are_refused(spec: str, capsys: object) -> None:
    assert main(["--quick", "--calibration-seeds", spec, "--out", "-"]) == 2
    assert "--calibration-seeds" in capsys.readouterr().err  # type: ignore[attr-defined]


def test_targets_compare_with_the_baselines_of_the_run_and_rate_the_flag() -> None:
    """10 in-distribution windows (exact, flag down) and 10 shifted ones (off by 0.2): flagged on the shipped
    calibration, left down on the held-out one (silent misses), plus one right window flagged in each."""
    from bench.estimators.harness import HELD_OUT, Record
    from bench.estimators.report import all_targets, flag_rates, summarise

    recs = []
    for rep in range(10):
        for sc, truth in (("in_distribution", 0.95), ("flip_strong", 0.4)):
            recs.append(Record("digits", "none", sc, rep, "avg_conf", 0.95, 0.94, 0.96, truth))
            recs.append(Record("digits", "none", sc, rep, "cbpe", 0.95, 0.94, 0.96, truth))
            far = sc != "in_distribution"
            for est in ("shift_aware", HELD_OUT):
                value = 0.95 if not far else 0.6  # off by 0.2 on the shifted scenario
                down = (not far) if est == "shift_aware" else True
                down = down and not (sc == "in_distribution" and rep == 0)  # one right window flagged
                distance = 2.0 if far else 0.3
                recs.append(Record("digits", "none", sc, rep, est, value, 0.3, 1.0, truth, distance, not down))
    shipped = flag_rates(recs, "digits", "shift_aware")
    assert shipped is not None
    assert (shipped.down_within, shipped.n_down, shipped.right_flagged, shipped.n_right) == (1.0, 9, 0.1, 10)
    assert (shipped.in_distribution, shipped.bad_flagged, shipped.n_bad) == (0.1, 1.0, 10)
    assert (shipped.silent, shipped.n_all) == (0.0, 20)
    held = flag_rates(recs, "digits", HELD_OUT)
    assert held is not None and held.down_within == 9 / 19 and held.bad_flagged == 0.0
    assert held.silent == 0.5  # the 10 shifted windows, off by 0.2 with the flag down
    got = {(m, t.text): t for m, t in all_targets(summarise(recs), recs)}
    assert got[("digits (shipped)", "flag down: headline within 0.05 in ≥ 95%")].ok
    assert not got[("digits (kind held out)", "flag down: headline within 0.05 in ≥ 95%")].ok
    assert got[("digits (shipped)", "off by > 0.10 with the flag down: ≤ 2% of windows")].ok
    assert not got[("digits (kind held out)", "off by > 0.10 with the flag down: ≤ 2% of windows")].ok
    assert got[("digits (shipped)", "headline within 0.03: flagged on ≤ 25%")].ok
    assert not got[("digits (shipped)", "in distribution: flagged on ≤ 5%")].ok  # 1 of 10
    assert not got[("digits (shipped)", "mean MAE ≤ 0.03")].ok  # (0 + 0.2) / 2
    assert got[("digits (shipped)", "no scenario worse than avg_conf by > 0.02")].ok  # 0.2 < avg_conf's 0.55
