"""Recalibration weighted by the inverse draw probability: a calibration refitted from the labels of active
draws (which favour uncertain predictions) is as close to the traffic's own calibration as one refitted from
uniform draws of as many labels, and it is the weighting that makes it so."""

from __future__ import annotations

import numpy as np
import pytest

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.active import draw_probabilities, rate_for, uncertainty
from agent.estimation.estimators.correctness import CorrectnessModel
from agent.labels.recalibration import label_weights

FIELDS = ("tpr", "fpr", "accuracy", "avg_conf", "atc_threshold")


def _traffic(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    conf = np.clip(rng.beta(6, 1.2, n), 0.2, 1.0)
    correct = rng.random(n) < np.clip(conf - 0.08, 0, 1)  # over-confident, as a shifted window is
    failed = np.where(correct, rng.random(n) < 0.05, rng.random(n) < 0.45)
    return conf, correct, failed


def _distance(a: EstimatorCalibration, b: EstimatorCalibration, conf: np.ndarray, failed: np.ndarray) -> np.ndarray:
    assert a.correctness is not None and b.correctness is not None
    pa, pb = a.correctness.predict(conf, failed), b.correctness.predict(conf, failed)
    return np.array(
        [abs(getattr(a, k) - getattr(b, k)) for k in FIELDS]
        + [float(np.abs(np.asarray(a.conf_offsets) - np.asarray(b.conf_offsets)).mean())]
        + [float(np.abs(pa - pb).mean())]
    )


def test_a_refit_from_active_labels_is_as_close_to_the_truth_as_one_from_uniform_labels() -> None:
    rng = np.random.default_rng(5)
    conf, correct, failed = _traffic(rng, 20_000)
    truth = EstimatorCalibration.fit(conf, correct, failed)
    # the bundle's predictor, fitted on clean data: it thinks the traffic better than it is
    c0, ok0, f0 = _traffic(np.random.default_rng(6), 5000)
    predictor = CorrectnessModel.fit(c0, ok0 | (np.random.default_rng(7).random(5000) < 0.5), f0)
    f = predictor.predict(conf, failed)
    mean_u = float(uncertainty(f).mean())
    target = 400 / len(conf)
    pi = draw_probabilities(f, rate_for(f, target, mean_u, 0.3), mean_u, 0.3)
    uniform, weighted, unweighted = [], [], []
    for _ in range(40):
        u = np.flatnonzero(rng.random(len(conf)) < target)
        uniform.append(_distance(EstimatorCalibration.fit(conf[u], correct[u], failed[u]), truth, conf, failed))
        a = np.flatnonzero(rng.random(len(conf)) < pi)
        w = label_weights(pi[a])
        assert w is not None
        weighted.append(_distance(EstimatorCalibration.fit(conf[a], correct[a], failed[a], w), truth, conf, failed))
        unweighted.append(_distance(EstimatorCalibration.fit(conf[a], correct[a], failed[a]), truth, conf, failed))
    uni, wei, unw = (np.mean(v, axis=0) for v in (uniform, weighted, unweighted))
    # every refitted figure as close as uniform draws get it (a little sampling slack), and ignoring the
    # weights is clearly farther on the figures the design distorts
    assert (wei <= 1.3 * uni + 0.003).all(), (wei, uni)
    assert unw[FIELDS.index("accuracy")] > 2 * wei[FIELDS.index("accuracy")], (unw, wei)
    assert unw[FIELDS.index("avg_conf")] > 2 * wei[FIELDS.index("avg_conf")], (unw, wei)


def test_label_weights() -> None:
    assert label_weights(None) is None
    assert label_weights(np.array([np.nan, np.nan])) is None
    assert label_weights(np.array([0.2, 0.2, np.nan])) is None  # equal: unweighted
    w = label_weights(np.array([0.5, 0.25, np.nan]))
    assert w is not None and w.tolist() == pytest.approx([2.0, 4.0, 1 / 0.375])
