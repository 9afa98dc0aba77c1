"""Per-class precision, recall and F1 (macro and support-weighted) and binary ROC AUC: realized from
labels, or expected without them from the model's probabilities (confidence-based performance
estimation, CBPE).

CBPE (NannyML, "Confidence-based Performance Estimation", https://nannyml.readthedocs.io/en/stable/
how_it_works/performance_estimation.html#confidence-based-performance-estimation-cbpe): if the
probabilities are calibrated, a prediction of class ``j`` with probability vector ``p`` is truly of
class ``i`` with probability ``p_i``, so the *expected* confusion matrix is

    E[C[i, j]] = Σ_{samples predicted j} p_i(x)

and the metrics are computed from it as from a realized one (precision_c = E[TP_c] / E[TP_c + FP_c],
recall_c = E[TP_c] / E[TP_c + FN_c]). For ROC AUC (binary models), CBPE sorts the samples by the
positive-class probability ``s`` and takes at every threshold the expected true and false positives
Σ s and Σ (1 − s) above it: expected TPR and FPR, integrated by the trapezoid rule. Everything rests on
calibration: with miscalibrated probabilities (e.g. under covariate shift that the model is
overconfident on) the expectations are off; the ``with_labels`` figures (realized on labeled
predictions) are the check.

Everything per class needs only three additive vectors per window (so it works on streaming windows,
:class:`~agent.estimation.statistics.window.WindowStats`): predictions per predicted class, their top-class
probability sums (= E[TP] per class for argmax predictions) and the probability sum of every class
(= E[support] per class).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from agent.core.label_values import NONE_INDEX


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, k: int) -> np.ndarray:
    """Realized ``[k, k]`` counts: rows the true class, columns the predicted one."""
    t = np.asarray(y_true, dtype=np.int64).reshape(-1)
    p = np.asarray(y_pred, dtype=np.int64).reshape(-1)
    ok = (t >= 0) & (t < k) & (p >= 0) & (p < k)
    return np.bincount(t[ok] * k + p[ok], minlength=k * k).reshape(k, k).astype(np.float64)


def expected_confusion(probabilities: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """CBPE's expected ``[k, k]`` confusion matrix: ``E[C[i, j]] = Σ_{pred = j} p_i``."""
    p = np.asarray(probabilities, dtype=np.float64)
    p = p.reshape(len(p), -1)
    k = p.shape[1]
    pred = np.asarray(predicted, dtype=np.int64).reshape(-1)
    out = np.zeros((k, k))
    np.add.at(out.T, np.clip(pred, 0, k - 1), p)  # column j accumulates the probability vectors predicted j
    return out


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a / b`` with 0 where ``b`` is 0 (scikit-learn's ``zero_division=0``)."""
    out = np.zeros_like(a, dtype=np.float64)
    np.divide(a, b, out=out, where=b > 0)
    return out


def class_metrics(
    tp: np.ndarray, predicted: np.ndarray, support: np.ndarray, classes: Sequence[str] | None = None
) -> dict[str, Any]:
    """Precision, recall and F1 per class, their macro and support-weighted means, from true
    positives, predictions and true samples per class (realized counts or CBPE expectations)."""
    tp, predicted, support = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (tp, predicted, support))
    precision = _ratio(tp, predicted)
    recall = _ratio(tp, support)
    f1 = _ratio(2 * precision * recall, precision + recall)
    total = float(support.sum())
    w = support / total if total > 0 else np.zeros_like(support)
    names = list(classes) if classes is not None else [str(i) for i in range(len(tp))]
    return {
        "per_class": {
            name: {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": float(support[i]),
            }
            for i, name in enumerate(names)
        },
        "macro": {"precision": float(precision.mean()), "recall": float(recall.mean()), "f1": float(f1.mean())},
        "weighted": {
            "precision": float((w * precision).sum()),
            "recall": float((w * recall).sum()),
            "f1": float((w * f1).sum()),
        },
    }


def metrics_of_confusion(conf: np.ndarray, classes: Sequence[str] | None = None) -> dict[str, Any]:
    """:func:`class_metrics` of a (realized or expected) confusion matrix."""
    c = np.asarray(conf, dtype=np.float64)
    return class_metrics(np.diag(c), c.sum(axis=0), c.sum(axis=1), classes)


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """Realized ROC AUC of positive-class scores (the Mann–Whitney statistic, ties counting ½);
    None when either class is absent."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(positive, dtype=bool).reshape(-1)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_s, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def expected_roc_auc(scores: np.ndarray) -> float | None:
    """CBPE's expected ROC AUC from calibrated positive-class probabilities ``scores``: expected TPR
    and FPR at every threshold (cumulative Σ s and Σ (1 − s) over the samples above it), trapezoid
    rule. None when the expected positives or negatives are zero."""
    s = np.sort(np.asarray(scores, dtype=np.float64).reshape(-1))[::-1]
    pos, neg = float(s.sum()), float((1 - s).sum())
    if pos <= 0 or neg <= 0:
        return None
    # group equal scores: one ROC point per distinct threshold (ties form a diagonal segment)
    _, idx = np.unique(-s, return_index=True)
    ends = np.r_[idx[1:], len(s)] - 1
    tpr = np.r_[0.0, np.cumsum(s)[ends] / pos]
    fpr = np.r_[0.0, np.cumsum(1 - s)[ends] / neg]
    return float(np.sum((fpr[1:] - fpr[:-1]) * (tpr[1:] + tpr[:-1]) / 2.0))


def expected_class_metrics(
    counts: Sequence[float], top_sums: Sequence[float], prob_sums: Sequence[float], classes: Sequence[str] | None = None
) -> dict[str, Any]:
    """CBPE per class from a window's additive sums: predictions per predicted class ``counts``,
    their top-class probability sums ``top_sums`` (E[TP]) and every class's probability sum
    ``prob_sums`` (E[support])."""
    return class_metrics(np.asarray(top_sums), np.asarray(counts), np.asarray(prob_sums), classes)


def realized_class_metrics(
    y_true: np.ndarray, y_pred: np.ndarray, k: int, classes: Sequence[str] | None = None
) -> dict[str, Any]:
    """Per-class metrics of labeled predictions (as scikit-learn's ``precision_recall_fscore_support``
    with ``zero_division=0``). A true label of none of the model's classes
    (:data:`~agent.core.label_values.NONE_INDEX`) is a false positive of the class predicted, and no
    class's support."""
    conf = confusion_matrix(y_true, y_pred, k)
    t = np.asarray(y_true, dtype=np.int64).reshape(-1)
    p = np.asarray(y_pred, dtype=np.int64).reshape(-1)
    none = (t == NONE_INDEX) & (p >= 0) & (p < k)
    predicted = conf.sum(axis=0) + np.bincount(p[none], minlength=k)[:k]
    return class_metrics(np.diag(conf), predicted, conf.sum(axis=1), classes)


def window_class_metrics(
    predicted: Sequence[float],
    true_positive: Sequence[float],
    support: Sequence[float],
    classes: Sequence[str],
    *,
    per_class: bool = True,
) -> dict[str, Any] | None:
    """A live window's CBPE figures from its additive per-class sums (``WindowStats.cbpe_*``): None
    when the window has none or they do not match the model's classes; ``per_class=False`` keeps only
    the macro and weighted means (models with more classes than the metrics' cap)."""
    k = len(classes)
    if not k or not (len(predicted) == len(true_positive) == len(support) == k) or sum(predicted) <= 0:
        return None
    out = expected_class_metrics(predicted, true_positive, support, classes)
    if not per_class:
        del out["per_class"]
    return out
