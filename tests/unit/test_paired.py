"""The paired difference of two model versions: its sums, both estimators and the pair's calibration."""

from __future__ import annotations

import numpy as np
import pytest

from agent.estimation.pairs.calibration import P_EDGES, DisagreementModel, PairCalibration, pair_features
from agent.estimation.pairs.paired import (
    LABEL_FREE,
    WITH_LABELS,
    PairSums,
    best_of,
    differences,
    label_free,
    with_labels,
)
from agent.offline.calibration.pairs.fitting import PairedSet, fit_disagreement_model, fit_pair
from invariants.fit_params import CalibrationPlan


def _probs(rng: np.random.Generator, n: int, k: int = 4, sharp: float = 3.0) -> np.ndarray:
    z = rng.normal(size=(n, k)) * sharp
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _calibration(error: float = 0.1) -> PairCalibration:
    return PairCalibration(DisagreementModel((0.0,) * 5, (0.0,) * 5), (error,) * (len(P_EDGES) + 1))


def test_a_model_paired_with_itself_differs_by_exactly_nothing() -> None:
    p = _probs(np.random.default_rng(0), 500)
    s = PairSums.of_window(p, p, _calibration())
    assert (s.n, s.n_dis, s.agreement) == (500, 0, 1.0)
    d = label_free(s, _calibration())
    assert d is not None and (d.value, d.lower, d.upper) == (0.0, 0.0, 0.0)


def test_no_paired_prediction_no_estimate() -> None:
    assert label_free(PairSums(), _calibration()) is None
    assert with_labels(PairSums()) is None
    assert differences(PairSums(), _calibration()) == {}


def test_sums_add_across_windows_and_replicas() -> None:
    rng = np.random.default_rng(1)
    pa, pb = _probs(rng, 900), _probs(rng, 900)
    cal = PairCalibration(DisagreementModel((0.1, 1, 0, 0, 0), (0.2, 0, 1, 0, 0)), (0.05, 0.1, 0.2, 0.3))
    whole = PairSums.of_window(pa, pb, cal)
    parts = PairSums.of_window(pa[:400], pb[:400], cal) + PairSums.of_window(pa[400:], pb[400:], cal)
    for name, value in whole.to_dict().items():
        assert getattr(parts, name) == pytest.approx(value)
    assert PairSums.from_items(dict(whole.items())) == whole.label_free_part()
    assert PairSums.from_dict(whole.to_dict()) == whole
    copied = whole.copy()
    copied.add_in_place(whole)
    assert copied.n == 2 * whole.n and whole.n == 900


def test_the_label_free_interval_stays_within_the_worst_case_bracket() -> None:
    rng = np.random.default_rng(2)
    pa, pb = _probs(rng, 1000), _probs(rng, 1000)
    for error in (0.0, 0.3, 5.0):
        cal = _calibration(error)
        s = PairSums.of_window(pa, pb, cal)
        d = label_free(s, cal)
        assert d is not None
        p = s.n_dis / s.n
        assert -p - 1e-12 <= d.lower <= d.value <= d.upper <= p + 1e-12
    wide = label_free(s, _calibration(5.0))
    assert wide is not None and (wide.lower, wide.upper) == pytest.approx((-p, p))


def test_labels_on_every_disagreement_give_the_difference_exactly() -> None:
    rng = np.random.default_rng(3)
    pa, pb = _probs(rng, 800), _probs(rng, 800)
    y = rng.integers(0, 4, 800)
    cal = _calibration()
    dis = cal.disagreements(pa, pb)
    d = (pb.argmax(1) == y).astype(float) - (pa.argmax(1) == y).astype(float)
    s = PairSums.of_disagreements(800, dis) + PairSums.of_labeled(dis.g, d[dis.rows], np.ones(len(dis.rows)))
    e = with_labels(s)
    assert e is not None and e.n_labels == len(dis.rows)
    assert (e.value, e.lower, e.upper) == pytest.approx((d.mean(),) * 3)
    found = differences(s, cal)
    assert set(found) == {LABEL_FREE, WITH_LABELS}
    assert best_of(found) == (WITH_LABELS, found[WITH_LABELS])


def test_the_label_assisted_difference_is_design_unbiased_under_a_wrong_model() -> None:
    """The disagreement model says the champion always wins; the challenger wins two thirds of the
    disagreements. Drawn with unequal probabilities, the estimate's mean over draws is the true difference."""
    rng = np.random.default_rng(4)
    n, n_dis = 2000, 300
    g = np.full(n_dis, -0.9)
    d = np.where(rng.uniform(size=n_dis) < 2 / 3, 1.0, -1.0)
    pi = np.where(np.arange(n_dis) % 2 == 0, 0.5, 0.1)
    base = PairSums(n, n_dis, qa_sum=0.95 * n_dis, qb_sum=0.05 * n_dis, g_sq_sum=float((g * g).sum()))
    values, covered = [], 0
    for _ in range(400):
        drawn = rng.uniform(size=n_dis) < pi
        e = with_labels(base + PairSums.of_labeled(g[drawn], d[drawn], pi[drawn]))
        assert e is not None
        values.append(e.value)
        covered += e.lower <= d.sum() / n <= e.upper
    assert np.mean(values) == pytest.approx(d.sum() / n, abs=0.004)
    assert covered / 400 >= 0.9


def test_draw_probabilities_outside_the_unit_interval_are_refused() -> None:
    with pytest.raises(ValueError, match="draw probabilities"):
        PairSums.of_labeled(np.zeros(2), np.zeros(2), np.array([0.5, 0.0]))


def test_a_pair_calibration_round_trips_and_refuses_what_does_not_parse() -> None:
    cal = PairCalibration(
        DisagreementModel((0.1, 0.2, 0.3, 0.4, 0.5), (0.5, 0.4, 0.3, 0.2, 0.1)),
        (0.1, 0.2, 0.3, 0.4),
        (0.0, 0.9, 0.1, 0.0),
        "ab" * 32,
        0.99,
        88,
        1500,
        0.04,
    )
    assert PairCalibration.from_dict(cal.to_dict()) == cal
    broken = cal.to_dict()
    broken["error"] = [0.1]
    with pytest.raises(ValueError, match="error"):
        PairCalibration.from_dict(broken)
    with pytest.raises(ValueError, match="bins"):
        PairCalibration.from_dict({**cal.to_dict(), "p_edges": [0.1]})
    assert cal.model_error(0.01) == 0.1 and cal.model_error(0.2) == 0.3 and cal.model_error(0.9) == 0.4


def test_the_disagreement_model_learns_who_is_right() -> None:
    """On disagreements where the challenger is confident and the champion is not, the challenger is right;
    the fitted model says so, and the reverse."""
    rng = np.random.default_rng(5)
    pa, pb = _probs(rng, 4000, sharp=2.0), _probs(rng, 4000, sharp=2.0)
    dis = pa.argmax(1) != pb.argmax(1)
    pa, pb = pa[dis], pb[dis]
    conf_a, conf_b = pa.max(1), pb.max(1)
    winner = rng.uniform(size=len(pa)) < 1 / (1 + np.exp(-8 * (conf_b - conf_a)))
    d = np.where(winner, 1, -1)
    model = fit_disagreement_model(pair_features(pa, pb), d)
    qa, qb = model.predict(pair_features(pa, pb))
    sure_b = (conf_b - conf_a) > 0.4
    sure_a = (conf_a - conf_b) > 0.4
    assert (qb - qa)[sure_b].mean() > 0.5 and (qb - qa)[sure_a].mean() < -0.5
    assert np.all(qa + qb <= 1 + 1e-9)


def _shifted(rng: np.random.Generator, name: str, n: int, shift: float) -> PairedSet:
    """A labeled set on which the challenger wins more of the disagreements the stronger the shift."""
    y = rng.integers(0, 4, n)
    pa, pb = _probs(rng, n, sharp=2.0), _probs(rng, n, sharp=2.0)
    right_a = rng.uniform(size=n) < 0.9 - shift
    right_b = rng.uniform(size=n) < 0.9 - shift / 2
    for p, right in ((pa, right_a), (pb, right_b)):
        top = p.argmax(1)
        want = np.where(right, y, (y + 1 + rng.integers(0, 3, n)) % 4)
        p[np.arange(n), top], p[np.arange(n), want] = p[np.arange(n), want], p[np.arange(n), top].copy()
    return PairedSet.of(name, pa, pb, y)


def test_fit_pair_measures_its_error_out_of_kind_and_never_shrinks_it_with_more_disagreement() -> None:
    rng = np.random.default_rng(6)
    clean = _shifted(rng, "clean", 1500, 0.0)
    shifted = [_shifted(rng, f"kind{i % 6}", 1500, 0.05 * (1 + i % 6)) for i in range(24)]
    plan = CalibrationPlan(pair_windows_per_fold=80)
    cal = fit_pair(clean, shifted, seed=0, plan=plan, champion_sha256="cd" * 32)
    assert cal.corrupted_sets == 24 and cal.rows == 1500 and cal.champion_sha256 == "cd" * 32
    assert list(cal.error) == sorted(cal.error) and all(e >= 0 for e in cal.error)
    assert cal.level == plan.pair_error_level
    table_only = fit_pair(clean, [], seed=0, plan=plan)
    assert table_only.corrupted_sets == 0 and all(np.isfinite(table_only.error))
