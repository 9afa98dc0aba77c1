"""Prediction-powered accuracy (PPI / PPI++): point estimate and interval coverage on simulated windows."""

from __future__ import annotations

import numpy as np
import pytest

from agent.estimation.estimators.prediction_powered import (
    LabeledEstimate,
    prediction_powered_accuracy,
    rectifier_variance,
    rectifier_variance_of_sums,
)

REPS = 400  # seeded repetitions per coverage check (bounded)


def _window(rng: np.random.Generator, n: int, bias: float) -> tuple[np.ndarray, np.ndarray]:
    """``n`` predictions: confidences ``f`` and correctness drawn with P(correct) = f − bias (so ``f``
    is overconfident by ``bias``: the label-free mean misses the accuracy by about that much)."""
    f = rng.beta(6, 2, size=n)
    correct = rng.random(n) < np.clip(f - bias, 0.0, 1.0)
    return f, correct


def _ppi(f: np.ndarray, correct: np.ndarray, idx: np.ndarray, tuned: bool = True) -> LabeledEstimate:
    est = prediction_powered_accuracy(len(f), float(f.sum()), float((f * f).sum()), f[idx], correct[idx], tuned=tuned)
    assert est is not None
    return est


def test_plain_ppi_is_mean_plus_rectifier() -> None:
    rng = np.random.default_rng(3)
    f = rng.uniform(0.5, 1.0, size=400)
    correct = rng.random(400) < f
    idx = np.arange(0, 400, 4)
    est = _ppi(f, correct, idx, tuned=False)
    expected = f.mean() + (correct[idx] - f[idx]).mean()
    assert est.value == pytest.approx(expected)
    assert est.power == 1.0
    assert est.n == 400 and est.n_labels == 100
    # the rectifier's variance with z²/2 pseudo-labels right and z²/2 wrong (Agresti–Coull)
    w = 1.959963984540054**2 / 2
    r = np.r_[correct[idx] - f[idx], 1 - f[idx].mean(), -f[idx].mean()]
    weights = np.r_[np.ones(100), w, w]
    mean = (weights * r).sum() / weights.sum()
    var = f.var(ddof=1) / 400 + ((weights * (r - mean) ** 2).sum() / (weights.sum() - 1)) / 100
    assert est.upper - est.lower == pytest.approx(2 * 1.959963984540054 * np.sqrt(var))
    assert est.to_dict()["n_labels"] == 100


def test_no_labels_no_estimate() -> None:
    assert prediction_powered_accuracy(100, 80.0, 70.0, np.zeros(0), np.zeros(0, bool)) is None
    assert prediction_powered_accuracy(0, 0.0, 0.0, np.ones(1), np.ones(1, bool)) is None


def test_all_right_labels_give_a_non_degenerate_interval() -> None:
    est = prediction_powered_accuracy(1000, 900.0, 820.0, np.full(50, 0.9), np.ones(50, bool))
    assert est is not None
    assert est.upper == 1.0 and 0.9 < est.lower < 0.99


@pytest.mark.parametrize(("bias", "tuned"), [(0.0, True), (0.0, False), (0.3, True), (0.3, False)])
def test_interval_covers_the_window_accuracy(bias: float, tuned: bool) -> None:
    """95% intervals cover the window's true accuracy in ≥ 92% of seeded repetitions, also when the
    label-free predictor is badly biased (there the label-free mean's own interval almost never covers)."""
    rng = np.random.default_rng(20231)
    covered = label_free_covered = 0
    errors = []
    for _ in range(REPS):
        n, m = int(rng.integers(1000, 3001)), 200
        f, correct = _window(rng, n, bias)
        truth = float(correct.mean())
        idx = rng.choice(n, size=m, replace=False)
        est = _ppi(f, correct, idx, tuned)
        covered += est.lower <= truth <= est.upper
        errors.append(abs(est.value - truth))
        half = 1.96 * f.std(ddof=1) / np.sqrt(n)
        label_free_covered += f.mean() - half <= truth <= f.mean() + half
    assert covered / REPS >= 0.92
    assert float(np.quantile(errors, 0.95)) < 0.07
    if bias:
        assert label_free_covered / REPS < 0.05  # the label-free interval misses; PPI covers


def test_power_tuning_narrows_an_informative_predictor_and_ignores_a_useless_one() -> None:
    rng = np.random.default_rng(7)
    n, m = 3000, 100
    f = rng.beta(5, 2, size=n)
    correct = rng.random(n) < f  # calibrated: f is informative
    idx = rng.choice(n, size=m, replace=False)
    ppi, classical_width = _ppi(f, correct, idx), 2 * 1.96 * correct[idx].std(ddof=1) / np.sqrt(m)
    assert ppi.upper - ppi.lower < classical_width
    assert ppi.power > 0.5
    noise = rng.random(n)  # f independent of correctness: λ goes towards 0
    useless = _ppi(noise, correct, idx)
    assert useless.power < 0.5
    assert useless.upper - useless.lower < 1.15 * classical_width


def test_with_labels_is_a_registered_estimator_on_the_window_statistics() -> None:
    """The labeled sample's additive sums in a window's statistics give, through the one estimator
    registry, exactly the estimate of the arrays; they add across parts of the window; without labels
    the estimator is absent."""
    from agent.estimation.calibration import EstimatorCalibration
    from agent.estimation.estimators.registry import estimate_all, estimator_names
    from agent.estimation.statistics.window import WindowStats

    rng = np.random.default_rng(11)
    f, correct = _window(rng, 2_000, bias=0.1)
    verdicts = np.zeros(len(f), dtype=np.int8)
    cal = EstimatorCalibration(
        tpr=0.6, fpr=0.1, n_wrong=100, n_right=900, accuracy=0.8, avg_conf=0.75, atc_threshold=0.6
    )
    window = WindowStats.of_samples(verdicts, f, cal.atc_threshold)
    assert "with_labels" not in estimate_all(window, cal)
    idx = rng.choice(len(f), size=150, replace=False)
    halves = [WindowStats.of_labeled_sample(f[part], correct[part]) for part in (idx[:70], idx[70:])]
    est = estimate_all(window + halves[0] + halves[1], cal)["with_labels"]
    expected = _ppi(f, correct, idx)
    assert isinstance(est, LabeledEstimate)
    assert (est.value, est.lower, est.upper, est.n_labels) == pytest.approx(
        (expected.value, expected.lower, expected.upper, expected.n_labels), abs=1e-12
    )
    assert "with_labels" in estimator_names() and "with_labels" not in estimator_names(label_free=True)


def test_inputs_of_any_shape_and_float32_are_read_as_flat_float64() -> None:
    """ONNX models give float32 probabilities, and a caller may hold them as a column: the estimate is the
    one of the flat float64 values, power-tuned (PPI++) by default, at 95% unless ``z`` says otherwise."""
    rng = np.random.default_rng(7)
    f = rng.uniform(0.5, 1.0, size=300).astype(np.float32)
    correct = rng.random(300) < f
    idx = np.arange(0, 300, 3)
    f64 = f.astype(np.float64)
    want = prediction_powered_accuracy(
        300, float(f64.sum()), float((f64 * f64).sum()), f64[idx], correct[idx], tuned=True
    )
    assert want is not None and want.power < 1.0  # tuned: λ estimated, not plain PPI's 1
    for f_lab, y in ((f[idx], correct[idx]), (f[idx].reshape(-1, 1), correct[idx].reshape(-1, 1))):
        got = prediction_powered_accuracy(300, float(f64.sum()), float((f64 * f64).sum()), f_lab, y)
        assert got == want  # exactly: the sums of the float32 values in float64
    narrow = prediction_powered_accuracy(300, float(f64.sum()), float((f64 * f64).sum()), f64[idx], correct[idx], z=1.0)
    assert narrow is not None and narrow.value == want.value
    # z = 1 instead of 1.96 (and fewer pseudo-labels): about half the width
    assert narrow.upper - narrow.lower < 0.55 * (want.upper - want.lower)


def test_the_rectifier_variance_of_residuals_is_that_of_their_sums() -> None:
    """:func:`rectifier_variance` (residuals in hand) and its additive form agree, with the z²/2
    pseudo-labels at 1 − shift and −shift (here 10 residuals, shift 0.5, z 2: two pseudo-labels each)."""
    r = np.r_[np.full(8, 0.1), np.full(2, -0.9)]
    got = rectifier_variance(r, 0.5, z=2.0)
    assert got == pytest.approx(rectifier_variance_of_sums(10, float(r.sum()), float((r * r).sum()), 0.5, z=2.0))
    full = np.r_[r, 0.5, 0.5, -0.5, -0.5]
    assert got == pytest.approx(float(np.var(full, ddof=1)))
    # at the default 95%: z²/2 = 1.92 pseudo-labels each
    w = 1.959963984540054**2 / 2
    weights = np.r_[np.ones(10), w, w]
    vals = np.r_[r, 0.5, -0.5]
    mean = (weights * vals).sum() / weights.sum()
    expected = (weights * (vals - mean) ** 2).sum() / (weights.sum() - 1)
    assert rectifier_variance(r, 0.5) == pytest.approx(expected)


def _ppi_plus_plus_by_hand(f: np.ndarray, f_lab: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """PPI++ written out from its definition (module docstring): λ̂ = Cov̂(Y, f) / ((1 + m/N) Var̂(f))
    clipped to [0, 1], θ̂ = Ȳ + λ̂ (f̄_N − f̄_m), half-width z √(λ̂² Var̂(f)/N + Var̂(Y − λ̂ f)/m) with the
    rectifier's pseudo-labels. Returns (λ̂, θ̂, lower, upper) before clipping to [0, 1]."""
    n, m = len(f), len(y)
    var_f = float(np.var(f, ddof=1))
    cov = float(np.cov(y, f_lab, ddof=1)[0, 1])
    denom = (1 + m / n) * var_f
    lam = min(max(cov / denom, 0.0), 1.0) if denom > 0 else 0.0
    theta = y.mean() + lam * (f.mean() - f_lab.mean())
    half = 1.959963984540054 * np.sqrt(lam**2 * var_f / n + rectifier_variance(y - lam * f_lab, lam * f_lab.mean()) / m)
    return lam, float(theta), float(theta - half), float(theta + half)


@pytest.mark.parametrize(
    ("f", "lab", "y", "expected_lambda"),
    [
        # three labels that follow f weakly: λ = 0.637
        (np.r_[0.9, 0.8, 0.6, 0.7, 0.95, 0.85, 0.5, 0.9, 0.75, 0.8], [0, 1, 2], [0.0, 1.0, 0.0], 0.637),
        # the labels follow f more than f varies: λ clipped to 1 (plain PPI)
        (np.r_[0.9, 0.8, 0.6, 0.7, 0.95, 0.85, 0.5, 0.9, 0.75, 0.8], [0, 2, 6], [1.0, 1.0, 0.0], 1.0),
        # f without spread says nothing: λ = 0, the labels' mean
        (np.full(6, 0.8), [1, 2, 3], [1.0, 0.0, 1.0], 0.0),
        # a window of two predictions, both labeled
        (np.r_[0.9, 0.6], [0, 1], [1.0, 0.0], 1.0),
    ],
)
def test_power_tuned_estimate_and_interval_by_hand(
    f: np.ndarray, lab: list[int], y: list[float], expected_lambda: float
) -> None:
    f_lab, yy = f[lab], np.asarray(y)
    lam, theta, lo, hi = _ppi_plus_plus_by_hand(f, f_lab, yy)
    est = prediction_powered_accuracy(len(f), float(f.sum()), float((f * f).sum()), f_lab, yy.astype(bool))
    assert est is not None
    assert est.power == pytest.approx(lam, abs=1e-12)
    assert lam == pytest.approx(expected_lambda, abs=1e-3)
    assert (est.value, est.lower, est.upper) == pytest.approx(
        (min(max(theta, 0.0), 1.0), max(lo, 0.0), min(hi, 1.0)), abs=1e-12
    )
    assert est.to_dict() == {
        "value": est.value,
        "lower": est.lower,
        "upper": est.upper,
        "n": len(f),
        "n_labels": len(lab),
        "lambda": est.power,
        "predictor": "confidence",
        "weighted": False,
    }


def test_residuals_without_spread_get_the_pseudo_labels_spread_only() -> None:
    """Ten labels all right at f = 0.9 (residuals 0.1, no spread of their own), shift 0.5, z 2: the
    variance is that of the residuals with the four pseudo-labels, far below 1."""
    r = np.full(10, 0.1)
    got = rectifier_variance_of_sums(10, float(r.sum()), float((r * r).sum()), 0.5, z=2.0)
    assert got == pytest.approx(float(np.var(np.r_[r, 0.5, 0.5, -0.5, -0.5], ddof=1)), abs=1e-12)
    assert got < 0.2
