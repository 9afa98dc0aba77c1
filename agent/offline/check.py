"""Offline work behind ``icos-agent check``: judge a batch with a bundle and report verdicts and every
estimate (and, when the data has labels, the truth and the oracle's TPR/FPR/F1 as in the ICOS paper §5.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.data.files import Dataset, label_indices
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators import estimate_all, headline_estimator, window_trust
from agent.estimation.statistics import WindowStats
from agent.model.classifier import OnnxClassifier, Prediction
from agent.offline.fit import predict_with_progress
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
    #: the flattened inputs the oracle read
    features: np.ndarray | None = None


def judge(
    model: OnnxClassifier,
    bundle: Bundle,
    x: np.ndarray,
    metadata: dict[str, np.ndarray] | None = None,
    *,
    prepared: bool = False,
) -> Judged:
    xp = x if prepared else model.prepare_file(x)
    pred = predict_with_progress(model, xp, "predict")
    feats = model.features(xp)
    result, rules = CompiledOracle(bundle.oracle(), model.n_features, model.n_classes).judge_with_rules(
        feats,
        pred.probabilities,
        pred.labels,
        metadata=metadata or None,
        feature_names=bundle.feature_names,
    )
    return Judged(pred, result, rules, feats)


def calibration_summary(cal: EstimatorCalibration) -> dict[str, Any]:
    """What the bundle's estimator calibration rests on: the calibration split's wrong and right
    predictions and whether they are too few errors to calibrate a correction on (the estimators then
    fall back to raw confidence near clean data, see :mod:`agent.estimation.trust`)."""
    return {"n_wrong": cal.n_wrong, "n_right": cal.n_right, "too_few_errors": cal.too_few_errors}


def check_report(
    model: OnnxClassifier, bundle: Bundle, data: Dataset, metadata_fields: Sequence[str] = ()
) -> dict[str, Any]:
    """Verdicts and estimates for a batch; truth and oracle quality when labels are present."""
    meta = {k: data.metadata[k] for k in metadata_fields} if metadata_fields else dict(data.metadata)
    judged = judge(model, bundle, data.x, meta)
    cal = EstimatorCalibration.from_dict(bundle.estimator_calibration)
    stats = WindowStats.from_batch(
        judged.result.verdict,
        judged.prediction.confidences,
        cal,
        probabilities=judged.prediction.probabilities,
        labels=judged.prediction.labels,
        features=judged.features,
        tdi_rules=judged.tdi_rules,
    )
    estimates = estimate_all(stats, cal)
    report: dict[str, Any] = {
        "n": int(len(data)),
        "model": {"name": model.name, "sha256": model.sha256},
        "headline": headline_estimator(bundle.headline),
        "verdicts": judged.result.counts(),
        "estimates": {k: {"value": e.value, "lower": e.lower, "upper": e.upper} for k, e in estimates.items()},
        "calibration": calibration_summary(cal),
    }
    trust = window_trust(stats, cal)
    if trust is not None:
        report["trust"] = trust.to_dict()
    if data.y is not None:
        y = label_indices(data.y, model.classes)
        correct = judged.prediction.labels == y
        accuracy = float(correct.mean())
        oc = calibrate(judged.result, ~correct)
        report["truth"] = {"accuracy": accuracy}
        report["oracle"] = {
            "tpr": oc.tpr,
            "fpr": oc.fpr,
            "f1": oc.f1,
            "tp": oc.tp,
            "fp": oc.fp,
            "tn": oc.tn,
            "fn": oc.fn,
        }
        report["abs_error"] = {k: abs(e.value - accuracy) for k, e in estimates.items()}
    return report
