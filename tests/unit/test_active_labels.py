"""Active labeling on a real model (the skl2onnx digits MLP of the estimator benchmark): the calibrated
correctness predictor, draw probabilities, and the inverse-probability-weighted ``with_labels`` —
unbiased and covering over repeated non-uniform draws, and wrong when the weights are ignored."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from pydantic import ValidationError

from agent.config.settings import LabelsConfig
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.active import active_accuracy, draw_probabilities, rate_for, uncertainty
from agent.estimation.estimators.correctness import CorrectnessModel
from agent.estimation.estimators.prediction_powered import WITH_LABELS, LabeledEstimate
from agent.estimation.estimators.registry import estimate_all
from agent.estimation.statistics.window import WindowStats
from agent.labels.active_draws import ActiveBudget
from bench.estimators.harness import Config
from bench.estimators.subjects import digits
from bench.labels.__main__ import fit_predictor

REPS = 400  # seeded repetitions per check (bounded)


@dataclass(frozen=True)
class Window:
    confidence: np.ndarray
    verdict: np.ndarray
    correct: np.ndarray
    f: np.ndarray
    model: CorrectnessModel


@pytest.fixture(scope="module")
def window() -> Window:
    """The digits test split as one window: its predictions, oracle verdicts and calibrated predictor."""
    subject = digits()
    oracle, model = fit_predictor(subject, Config())
    m = subject.model
    x = m.prepare_array(subject.test_x)
    pred = m.predict_batched(x)
    verdict = oracle.judge(m.features(x), pred.probabilities, pred.predicted).verdict
    conf = pred.confidences.astype(np.float64)
    return Window(conf, verdict, pred.predicted == subject.test_y, model.predict(conf, verdict != 0), model)


def test_predictor_is_calibrated_and_round_trips(window: Window) -> None:
    w = window
    assert 0 < w.f.min() and w.f.max() < 1
    assert abs(float(w.f.mean()) - float(w.correct.mean())) < 0.03
    # flagged predictions are predicted less often right than passed ones of the same confidence
    flagged = w.model.predict(np.array([0.9]), np.array([True]))[0]
    passed = w.model.predict(np.array([0.9]), np.array([False]))[0]
    assert flagged < passed
    back = CorrectnessModel.from_dict(w.model.to_dict())
    assert np.allclose(back.predict(w.confidence, w.verdict != 0), w.f)
    with pytest.raises(ValueError):
        CorrectnessModel.from_dict({"kind": "other", "coef": [0, 0, 0, 0, 0]})


def test_bundles_without_a_predictor_fall_back_to_confidence(window: Window) -> None:
    cal = EstimatorCalibration.fit(window.confidence, window.correct, window.verdict != 0)
    assert cal.predictor == "calibrated"
    again = EstimatorCalibration.from_dict(cal.to_dict())
    assert again.correctness == cal.correctness
    old = {k: v for k, v in cal.to_dict().items() if k != "correctness"}
    legacy = EstimatorCalibration.from_dict(old)
    assert legacy.predictor == "confidence"
    assert np.array_equal(legacy.predicted_correct(window.confidence, window.verdict), window.confidence)


def test_draw_probabilities_keep_the_floor_and_the_mean_rate(window: Window) -> None:
    f = window.f
    u = uncertainty(f)
    pi = draw_probabilities(f, 0.1, float(u.mean()), floor=0.2)
    assert pi.min() >= 0.1 * 0.2 - 1e-12 and pi.max() <= 1.0
    assert float(pi.mean()) == pytest.approx(0.1, rel=0.05)
    assert pi[np.argmax(u)] > pi[np.argmin(u)]  # more uncertain predictions are drawn more often
    rate = rate_for(f, 0.4, float(u.mean()))  # high rates clip some at 1: the rate rises to keep the mean
    assert float(draw_probabilities(f, rate, float(u.mean())).mean()) == pytest.approx(0.4, rel=1e-3)


def _estimates(w: Window, f: np.ndarray, pi: np.ndarray, weights: np.ndarray, seed: int) -> list[LabeledEstimate]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(REPS):
        s = np.flatnonzero(rng.random(len(f)) < pi)
        est = active_accuracy(f, s, w.correct[s], weights[s])
        assert est is not None
        out.append(est)
    return out


def test_weighted_estimate_is_unbiased_and_covers(window: Window) -> None:
    w = window
    truth = float(w.correct.mean())
    for f in (w.f, np.clip(w.confidence - 0.15, 0.0, 1.0)):  # calibrated, and a badly biased predictor
        pi = draw_probabilities(f, 0.15, float(uncertainty(f).mean()))
        est = _estimates(w, f, pi, pi, seed=11)
        values = np.array([e.value for e in est])
        se = values.std(ddof=1) / np.sqrt(REPS)
        assert abs(values.mean() - truth) < 4 * se + 1e-3
        covered = np.mean([e.lower <= truth <= e.upper for e in est])
        assert covered >= 0.9


def test_ignoring_the_weights_is_biased(window: Window) -> None:
    """Draws concentrated on uncertain predictions over-represent errors: weighting them as uniform
    draws (π replaced by its mean) misses the accuracy by far more than sampling noise."""
    w = window
    truth = float(w.correct.mean())
    pi = draw_probabilities(w.f, 0.15, float(uncertainty(w.f).mean()), floor=0.05)
    flat = np.full_like(pi, float(pi.mean()))
    weighted = np.array([e.value for e in _estimates(w, w.f, pi, pi, seed=5)])
    ignored = np.array([e.value for e in _estimates(w, w.f, pi, flat, seed=5)])
    se = ignored.std(ddof=1) / np.sqrt(REPS)
    assert abs(weighted.mean() - truth) < 4 * se + 1e-3
    assert abs(ignored.mean() - truth) > 10 * se


def test_window_sums_give_the_weighted_with_labels(window: Window) -> None:
    w = window
    cal = EstimatorCalibration.fit(w.confidence, w.correct, w.verdict != 0).with_shift(None)
    stats = WindowStats.from_batch(w.verdict, w.confidence, cal)
    f = cal.predicted_correct(w.confidence, w.verdict)
    assert stats.pcorrect_n == len(f) and stats.pcorrect_sum == pytest.approx(float(f.sum()))
    pi = draw_probabilities(f, 0.2, float(uncertainty(f).mean()))
    s = np.flatnonzero(np.random.default_rng(2).random(len(f)) < pi)
    half = len(s) // 2
    parts = [
        WindowStats.of_labeled_sample(w.confidence[i], w.correct[i], predicted_correct=f[i], draw_probability=pi[i])
        for i in (s[:half], s[half:])
    ]
    est = estimate_all(stats + parts[0] + parts[1], cal)[WITH_LABELS]
    direct = active_accuracy(f, s, w.correct[s], pi[s])
    assert isinstance(est, LabeledEstimate) and direct is not None
    assert est.value == pytest.approx(direct.value) and est.upper == pytest.approx(direct.upper)
    assert est.to_dict()["predictor"] == "calibrated" and est.to_dict()["weighted"] is True
    # a labeled prediction without its draw probability (stored before they were kept): unweighted PPI++
    unknown = pi[s].copy()
    unknown[0] = np.nan
    legacy = WindowStats.of_labeled_sample(
        w.confidence[s], w.correct[s], predicted_correct=f[s], draw_probability=unknown
    )
    old = estimate_all(stats + legacy, cal)[WITH_LABELS]
    assert isinstance(old, LabeledEstimate) and not old.weighted and old.predictor == "confidence"


def test_budget_meets_the_labels_per_window_on_average_and_keeps_the_floor(window: Window) -> None:
    """Steady traffic of the digits predictions (20 a second for three hours, a window of one hour):
    after the first window the expected draws per window are the budget, every probability at least
    the floor's share of the rate, and a boost spends the budget faster."""
    f = window.f
    budget = ActiveBudget(per_window=200, window_seconds=3600.0, floor=0.2, start=0.0)
    rng = np.random.default_rng(4)
    expected: list[float] = []
    lowest = np.inf
    for second in range(1, 3 * 3600 + 1):  # bounded: 10800 batches
        batch = f[rng.integers(0, len(f), 20)]
        pi = budget.probabilities(batch, float(second))
        expected.append(float(pi.sum()))
        if second > 3600:
            lowest = min(lowest, float(pi.min()))
    per_window = [sum(expected[h * 3600 : (h + 1) * 3600]) for h in (1, 2)]
    assert per_window == pytest.approx([200.0, 200.0], rel=0.1)
    assert lowest >= 0.2 * 200 / (20 * 3600) * 0.95  # the floor's share of the mean rate
    boosted = sum(
        float(budget.probabilities(f[rng.integers(0, len(f), 20)], 3 * 3600.0 + s, 2.0).sum()) for s in range(1, 61)
    )
    assert boosted == pytest.approx(2 * 200 / 60, rel=0.2)


def test_sampling_defaults_to_active_unless_a_rate_is_set() -> None:
    assert LabelsConfig().sampling == "active"
    assert LabelsConfig(sample_rate=0.2).sampling == "uniform"
    assert LabelsConfig(sample_rate=0.2, sampling="active").sampling == "active"
    assert LabelsConfig(budget_window="5m").budget_seconds == 300.0
    with pytest.raises(ValidationError, match="active_floor"):
        LabelsConfig(active_floor=0.0)
    # the setting's default is the estimator's: a defensive floor that caps every weight at twice uniform's
    from agent.estimation.estimators.active import DEFAULT_FLOOR

    assert LabelsConfig().active_floor == DEFAULT_FLOOR == 0.5
