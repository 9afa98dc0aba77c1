"""Per-class precision/recall/F1 and ROC AUC: realized ones pinned against scikit-learn, CBPE's expected
ones close to the truth when the probabilities are calibrated (labels drawn from them)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import precision_recall_fscore_support, roc_auc_score

from agent.estimation.statistics.class_metrics import (
    confusion_matrix,
    expected_class_metrics,
    expected_confusion,
    expected_roc_auc,
    metrics_of_confusion,
    realized_class_metrics,
    roc_auc,
)


def _calibrated(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Probabilities, argmax predictions and true labels drawn from the probabilities (calibrated)."""
    p = rng.dirichlet(np.full(k, 0.6), n)
    y = (p.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    return p, p.argmax(axis=1), y


@pytest.mark.parametrize("k", [2, 4, 7])
def test_realized_metrics_equal_scikit_learn(k: int) -> None:
    rng = np.random.default_rng(k)
    y_true = rng.integers(0, k, 500)
    y_pred = np.where(rng.random(500) < 0.6, y_true, rng.integers(0, k, 500))
    y_pred[y_pred == k - 1] = 0  # one class never predicted: zero division
    got = realized_class_metrics(y_true, y_pred, k)
    p, r, f, s = precision_recall_fscore_support(y_true, y_pred, labels=range(k), zero_division=0)
    for c in range(k):
        row = got["per_class"][str(c)]
        assert (row["precision"], row["recall"], row["f1"], row["support"]) == pytest.approx((p[c], r[c], f[c], s[c]))
    for avg in ("macro", "weighted"):
        p, r, f, _ = precision_recall_fscore_support(y_true, y_pred, labels=range(k), average=avg, zero_division=0)
        assert (got[avg]["precision"], got[avg]["recall"], got[avg]["f1"]) == pytest.approx((p, r, f))


def test_realized_roc_auc_equals_scikit_learn_with_ties() -> None:
    rng = np.random.default_rng(1)
    scores = np.round(rng.random(400), 1)  # many ties
    y = rng.random(400) < scores
    assert roc_auc(scores, y) == pytest.approx(roc_auc_score(y, scores))
    assert roc_auc(scores, np.ones(400, bool)) is None


@pytest.mark.parametrize("k", [2, 3, 6])
def test_cbpe_expected_metrics_match_the_truth_on_calibrated_data(k: int) -> None:
    rng = np.random.default_rng(10 + k)
    p, pred, y = _calibrated(rng, 40_000, k)
    expected = metrics_of_confusion(expected_confusion(p, pred))
    true = realized_class_metrics(y, pred, k)
    for c in map(str, range(k)):
        for m in ("precision", "recall", "f1"):
            assert expected["per_class"][c][m] == pytest.approx(true["per_class"][c][m], abs=0.02), (c, m)
    for avg in ("macro", "weighted"):
        assert expected[avg]["f1"] == pytest.approx(true[avg]["f1"], abs=0.015)
    # the same from the window's additive sums
    counts = np.bincount(pred, minlength=k)
    top = np.bincount(pred, weights=p.max(axis=1), minlength=k)
    sums = p.sum(axis=0)
    from_sums = expected_class_metrics(counts, top, sums)
    for key in ("macro", "weighted"):
        for m in ("precision", "recall", "f1"):
            assert from_sums[key][m] == pytest.approx(expected[key][m])


def test_cbpe_expected_roc_auc_matches_the_truth_on_calibrated_data() -> None:
    rng = np.random.default_rng(3)
    s = rng.beta(2, 3, 50_000)
    y = rng.random(50_000) < s
    assert expected_roc_auc(s) == pytest.approx(roc_auc_score(y, s), abs=0.01)
    assert expected_roc_auc(np.zeros(10)) is None


def test_expected_confusion_cells() -> None:
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.5, 0.4, 0.1]])
    c = expected_confusion(p, p.argmax(axis=1))
    assert c[:, 0] == pytest.approx([1.2, 0.6, 0.2])  # two samples predicted 0
    assert c[:, 1] == pytest.approx([0.1, 0.6, 0.3])
    assert c[:, 2] == pytest.approx([0, 0, 0])
    assert confusion_matrix(np.array([0, 1, 1]), np.array([0, 0, 1]), 3)[1] == pytest.approx([1, 1, 0])


def test_window_sums_give_the_expected_metrics_of_the_whole_window_whatever_the_split() -> None:
    """A live window's CBPE figures come from additive sums: summed over batches (and bucket
    differences) they equal the figures of the expected confusion matrix of all its samples."""
    from agent.estimation.statistics.class_metrics import window_class_metrics
    from agent.estimation.statistics.items import stat_items, stats_from_items
    from agent.estimation.statistics.window import WindowStats

    rng = np.random.default_rng(3)
    p, pred, _ = _calibrated(rng, 900, 4)
    pred[:50] = (pred[:50] + 1) % 4  # thresholded predictions need not be the most probable class
    parts = []
    for lo, hi in ((0, 1), (1, 300), (300, 900)):
        s = WindowStats()
        s.add_class_sums(p[lo:hi], pred[lo:hi])
        parts.append(s)
    total = parts[0] + parts[1] + parts[2]
    assert total.cbpe_n == 900 and sum(total.cbpe_predicted) == 900
    names = ["a", "b", "c", "d"]
    got = window_class_metrics(total.cbpe_predicted, total.cbpe_true_positive, total.cbpe_support, names)
    want = metrics_of_confusion(expected_confusion(p, pred), names)
    assert got is not None
    for c in names:
        assert got["per_class"][c] == pytest.approx(want["per_class"][c])
    for mean in ("macro", "weighted"):
        assert got[mean] == pytest.approx(want[mean])
    less = total - parts[2]
    assert less.cbpe_predicted == (parts[0] + parts[1]).cbpe_predicted
    # above the class cap only the means; the class names must match the sums; nothing when empty
    means = window_class_metrics(
        total.cbpe_predicted, total.cbpe_true_positive, total.cbpe_support, names, per_class=False
    )
    assert means is not None and set(means) == {"macro", "weighted"}
    assert window_class_metrics(total.cbpe_predicted, total.cbpe_true_positive, total.cbpe_support, names[:3]) is None
    assert window_class_metrics([], [], [], names) is None
    # exported for the fleet (up to the class cap): the fleet rebuilds the same sums, so the same figures
    rebuilt = stats_from_items(dict(stat_items(total)))
    assert (rebuilt.cbpe_n, rebuilt.cbpe_predicted) == (total.cbpe_n, total.cbpe_predicted)
    assert rebuilt.cbpe_true_positive == pytest.approx(total.cbpe_true_positive)
    assert rebuilt.cbpe_support == pytest.approx(total.cbpe_support)
    assert not any(name.startswith("cbpe_") and ":" in name for name, _ in stat_items(total, classes=False))
    assert WindowStats.from_dict(total.to_dict()) == total


def test_from_batch_gives_the_offline_expected_figures_of_the_same_samples() -> None:
    """A live batch's statistics (:meth:`WindowStats.from_batch`) give the figures ``check --json``
    reports for the same samples (expected confusion matrix), and those of
    :func:`expected_class_metrics` on the per-class sums computed by hand."""
    from agent.estimation.calibration import EstimatorCalibration
    from agent.estimation.statistics.class_metrics import window_class_metrics
    from agent.estimation.statistics.window import WindowStats

    cal = EstimatorCalibration(
        tpr=0.6, fpr=0.05, n_wrong=50, n_right=950, accuracy=0.95, avg_conf=0.93, atc_threshold=0.7
    )
    rng = np.random.default_rng(11)
    p, pred, _ = _calibrated(rng, 700, 5)
    pred[::9] = (pred[::9] + 2) % 5
    conf = p[np.arange(700), pred]
    names = list("abcde")
    halves = [
        WindowStats.from_batch(np.zeros(n, np.int8), conf[sl], cal, probabilities=p[sl], labels=pred[sl])
        for sl, n in ((slice(0, 300), 300), (slice(300, 700), 400))
    ]
    s = halves[0] + halves[1]
    got = window_class_metrics(s.cbpe_predicted, s.cbpe_true_positive, s.cbpe_support, names)
    offline = metrics_of_confusion(expected_confusion(p, pred), names)
    by_hand = expected_class_metrics(
        np.bincount(pred, minlength=5), np.bincount(pred, weights=conf, minlength=5), p.sum(axis=0), names
    )
    assert got is not None
    for want in (offline, by_hand):
        for c in names:
            assert got["per_class"][c] == pytest.approx(want["per_class"][c], rel=1e-12)
        for mean in ("macro", "weighted"):
            assert got[mean] == pytest.approx(want[mean], rel=1e-12)
    # subtracting a batch gives the other one's sums back
    back = s - halves[0]
    assert back.cbpe_predicted == halves[1].cbpe_predicted
    assert back.cbpe_support == pytest.approx(halves[1].cbpe_support, rel=1e-12)
    assert back.cbpe_true_positive == pytest.approx(halves[1].cbpe_true_positive, rel=1e-12)
