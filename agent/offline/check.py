"""Offline work behind ``icos-agent check``: judge a batch with a bundle and report verdicts and every
estimate (and, when the data has labels, the truth and the oracle's TPR/FPR/F1 as in the ICOS paper §5.3; a label
``__none__``, an input of none of the model's classes, counts as wrong and its share is reported).

Per-class precision, recall and F1 (and ROC AUC for two classes) are reported label-free (CBPE,
:mod:`agent.estimation.statistics.class_metrics`) and, with labels, realized. ``labels=N`` reveals the true labels
of ``N`` predictions drawn uniformly at random (``seed``), as a labeling sample would in production:
``estimates.with_labels`` is the prediction-powered accuracy from them
(:mod:`agent.estimation.estimators.prediction_powered`) and ``classes.with_labels`` their realized per-class metrics.
With a challenger (``check --challenger``), the report's ``challenger`` section compares it with the model on
the same data (:mod:`agent.offline.paired_check`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.core.label_values import NONE_INDEX
from agent.data.files import Dataset, label_indices
from agent.errors import UserError
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.evidence import evidence_section
from agent.estimation.estimators.registry import NEEDS_LABELS, estimate_window, headline_estimator
from agent.estimation.intervals import Estimate
from agent.estimation.segments.realized import SegmentLabels, with_realized
from agent.estimation.segments.segmentation import truth_counts
from agent.estimation.segments.table import segment_table
from agent.estimation.statistics.class_metrics import (
    expected_confusion,
    expected_roc_auc,
    metrics_of_confusion,
    roc_auc,
)
from agent.estimation.statistics.class_metrics import realized_class_metrics as realized_classes
from agent.estimation.statistics.window import WindowStats
from agent.model.classifier import Batch, OnnxClassifier, Prediction
from agent.model.inputs import Inputs, rule_values
from agent.model.views import view_of_bundle
from agent.offline.check_companions import CheckCompanion, CheckedBatch
from agent.offline.viewing import predict_and_view, source_of
from agent.results.estimate import estimates_json
from agent.results.paired import PairedModel
from agent.results.segments import segments_json
from agent.results.window import flag_sections
from invariants.bundle import Bundle
from invariants.compiled import CompiledOracle
from invariants.oracle import OracleResult, calibrate


@dataclass
class Judged:
    """A judged batch: the model's prediction and the oracle's verdicts."""

    prediction: Prediction
    result: OracleResult
    #: TDI rule (leaf) index of every sample, or None without TDIs
    tdi_rules: np.ndarray | None = None
    #: the feature view the oracle read
    features: np.ndarray | None = None


def judge(
    model: OnnxClassifier,
    bundle: Bundle,
    x: Batch | Any,
    metadata: dict[str, np.ndarray] | None = None,
    *,
    prepared: bool = False,
) -> Judged:
    """Predict and judge a batch with the bundle's oracle, reading the bundle's feature view (the model is
    given that view when it does not read it yet)."""
    signature = model.signature
    view = view_of_bundle(bundle.feature_view, bundle.feature_names, signature)
    if view != model.view:
        model = model.with_view(view)
    xp = source_of(model, x)  # in memory, or read from files a batch at a time
    if bundle.idi is not None and bundle.idi.input_fields and isinstance(xp, Inputs):
        metadata = {**(metadata or {}), **rule_values(xp, bundle.idi.input_fields)}
    viewed = predict_and_view(model, xp, "predict")
    pred, feats = viewed.prediction, viewed.features
    result, rules = CompiledOracle(bundle.oracle(), model.n_features, model.n_classes).judge_with_rules(
        feats,
        pred.probabilities,
        pred.predicted,
        metadata=metadata or None,
        feature_names=bundle.feature_names,
    )
    return Judged(pred, result, rules, feats)


def none_of_the_classes(y: np.ndarray) -> dict[str, float]:
    """How many labels say "none of the model's classes" (counted as wrong), and their share."""
    n = int(np.count_nonzero(np.asarray(y) == NONE_INDEX))
    return {"n": n, "share": n / len(y) if len(y) else 0.0}


def calibration_summary(cal: EstimatorCalibration) -> dict[str, Any]:
    """What the bundle's estimator calibration rests on: the calibration split's wrong and right
    predictions and whether they are too few errors to calibrate a correction on (the estimators then
    fall back to raw confidence near clean data, see :mod:`agent.estimation.estimators.trust`)."""
    return {"n_wrong": cal.n_wrong, "n_right": cal.n_right, "too_few_errors": cal.too_few_errors}


def class_report(
    probabilities: np.ndarray, predicted: np.ndarray, classes: Sequence[str], y: np.ndarray | None
) -> dict[str, Any]:
    """``classes`` of the report: CBPE's expected per-class metrics, and realized ones when ``y`` is
    given; ``roc_auc`` (of the second class's probability) for two classes."""
    p = np.asarray(probabilities, dtype=np.float64).reshape(len(predicted), -1)
    out: dict[str, Any] = {
        "names": list(classes),
        "estimated": metrics_of_confusion(expected_confusion(p, predicted), classes),
    }
    binary = p.shape[1] == 2
    if binary:
        out["estimated"]["roc_auc"] = expected_roc_auc(p[:, 1])
    if y is not None:
        out["realized"] = realized_classes(y, predicted, p.shape[1], classes)
        if binary:
            out["realized"]["roc_auc"] = roc_auc(p[:, 1], y == 1)
    return out


def labeled_sections(
    accuracy: float, none: dict[str, float], confusion: tuple[int, int, int, int], estimates: dict[str, Estimate]
) -> dict[str, Any]:
    """``truth``, ``oracle`` and ``abs_error`` of a labeled report, whatever was checked: the accuracy and
    the labels of none of the classes (:func:`none_of_the_classes`), the oracle's fail against the model's
    wrong predictions (``confusion``: tp, fp, tn, fn; rates as :func:`invariants.oracle.calibrate` gives
    them) and every estimate's error."""
    tp, fp, tn, fn = confusion
    return {
        "truth": {"accuracy": accuracy, "none_of_the_classes": none},
        "oracle": {
            "tpr": tp / (tp + fn) if tp + fn else 0.0,
            "fpr": fp / (fp + tn) if fp + tn else 0.0,
            "f1": 2 * tp / (2 * tp + fn + fp) if tp + fn + fp else 0.0,
            "tp": tp,
            "fp": fp,
            "tn": tn,
            "fn": fn,
        },
        "abs_error": {k: abs(e.value - accuracy) for k, e in estimates.items()},
    }


def _labels_asked(data: Dataset, labels: int) -> None:
    """``--labels`` reveals labels the data has, at most one per sample."""
    if labels and data.y is None:
        raise UserError("--labels reveals true labels of the data: the data has none (give y or --label-column)")
    if labels < 0 or labels > len(data):
        raise UserError(f"--labels must be between 1 and the {len(data)} samples of the data; got {labels}")


def _window_stats(judged: Judged, cal: EstimatorCalibration) -> WindowStats:
    """The statistics of the judged batch, as a window of the agent would hold them."""
    return WindowStats.from_batch(
        judged.result.verdict,
        judged.prediction.confidences,
        cal,
        probabilities=judged.prediction.probabilities,
        labels=judged.prediction.predicted,
        features=judged.features,
        tdi_rules=judged.tdi_rules,
    )


def _revealed(
    pred: Prediction, y: np.ndarray | None, stats: WindowStats, labels: int, seed: int
) -> tuple[WindowStats, np.ndarray | None]:
    """The statistics with ``labels`` revealed labels joined as a labeling sample would (``with_labels`` is
    then one estimator among the others), and the samples revealed (None: none)."""
    if y is None or not labels:
        return stats, None
    idx = np.random.default_rng(seed).choice(len(y), size=labels, replace=False)
    conf = np.asarray(pred.confidences, dtype=np.float64)
    return stats + WindowStats.of_labeled_sample(conf[idx], (pred.predicted == y)[idx]), idx


def _classes(pred: Prediction, classes: Sequence[str], y: np.ndarray | None, idx: np.ndarray | None) -> dict[str, Any]:
    """``classes`` of the report (:func:`class_report`), and the realized metrics of the revealed labels
    (``with_labels``) when some were revealed."""
    out = class_report(pred.probabilities, pred.predicted, classes, y)
    if y is not None and idx is not None:
        out["with_labels"] = class_report(pred.probabilities[idx], pred.predicted[idx], classes, y[idx])["realized"]
    return out


def _truth(judged: Judged, y: np.ndarray, estimates: dict[str, Estimate]) -> dict[str, Any]:
    """The truth, the oracle's quality and every estimate's error on labeled data."""
    correct = judged.prediction.predicted == y
    oc = calibrate(judged.result, ~correct)
    return labeled_sections(float(correct.mean()), none_of_the_classes(y), (oc.tp, oc.fp, oc.tn, oc.fn), estimates)


def check_report(
    model: OnnxClassifier,
    bundle: Bundle,
    data: Dataset,
    metadata_fields: Sequence[str] = (),
    *,
    labels: int = 0,
    seed: int = 0,
    companions: Sequence[CheckCompanion] = (),
) -> dict[str, Any]:
    """Verdicts and estimates for a batch; truth and oracle quality when labels are present; with
    ``labels`` > 0 also the label-assisted estimate from that many randomly revealed labels; the
    ``companions``' sections (a challenger's comparison with the model, ``labels`` of its disagreements
    revealed)."""
    _labels_asked(data, labels)
    meta = {k: data.metadata[k] for k in metadata_fields} if metadata_fields else dict(data.metadata)
    judged = judge(model, bundle, data.x, meta)
    cal = EstimatorCalibration.from_dict(bundle.estimator_calibration)
    stats = _window_stats(judged, cal)
    pred = judged.prediction
    y = label_indices(data.y, model.classes, allow_none=True) if data.y is not None else None
    beside: dict[str, Any] = {}
    champion = (pred, stats, PairedModel(cal, headline_estimator(bundle.headline)))
    batch = CheckedBatch(judge, data.x, meta, champion, model.sha256, y, labels, seed)
    for companion in companions:
        beside.update(companion.sections(batch))
    stats, idx = _revealed(pred, y, stats, labels, seed)
    window = estimate_window(stats, cal)
    estimates = window.estimates
    headline = headline_estimator(bundle.headline)
    report: dict[str, Any] = {
        "n": int(len(data)),
        "model": {"name": model.name, "sha256": model.sha256},
        "headline": headline,
        **evidence_section(cal.headline, shift_aware=cal.shift is not None),
        "verdicts": judged.result.counts(),
        "estimates": estimates_json(estimates, cal, decimals=None),
        "calibration": calibration_summary(cal),
    }
    for name in (n for n in estimates if n in NEEDS_LABELS):  # the revealed labels' seed with their estimate
        report["estimates"][name]["seed"] = seed
    report.update(flag_sections(window, report["headline"], cal))
    report["classes"] = _classes(pred, model.classes, y, idx)
    report.update(beside)
    if y is not None:
        report.update(_truth(judged, y, estimates))
    report.update(_segments(judged, stats, cal, estimates, y, idx))
    return report


def _segments(
    judged: Judged,
    stats: WindowStats,
    cal: EstimatorCalibration,
    estimates: dict[str, Estimate],
    y: np.ndarray | None,
    revealed: np.ndarray | None = None,
) -> dict[str, Any]:
    """``segments`` and ``segment_drop`` of the report (none without segments in the bundle), with every
    segment's true accuracy when the data is labeled, and its realized accuracy with its interval from the
    ``revealed`` labels (``--labels``)."""
    seg = cal.segments
    if seg is None:
        return {}
    pred = judged.prediction
    truth = None
    table = None
    if y is not None:
        ids = seg.ids(judged.features, pred.predicted, judged.tdi_rules, len(pred.predicted))
        truth = truth_counts(ids, seg.size, pred.predicted == y)
        table = segment_table(stats, cal, estimates, truth=truth)
        if table is not None and revealed is not None:
            table = with_realized(table, SegmentLabels.of(ids[:, revealed], seg.size, (pred.predicted == y)[revealed]))
    else:
        table = segment_table(stats, cal, estimates)
    return segments_json(table, decimals=None) if table is not None else {}
