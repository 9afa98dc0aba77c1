"""The robustness measure of Méndez et al. §3/§5: errors before and after mutation (MAE, MSE,
RMSE; probabilistic errors per BenchMetrics Prob for classifiers), their relative change in % and its
mean and standard deviation over repetitions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from agent.audits.report import AuditResult


def probability_errors(proba: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """MAE, MSE, RMSE of class probabilities ``[N, K]`` against one-hot truth, plus accuracy.

    Labels outside ``0..K−1`` get an all-zero one-hot row (every class counts as wrong).
    """
    p = np.asarray(proba, dtype=np.float64)
    labels = np.asarray(y).astype(np.int64)
    onehot = np.zeros_like(p)
    ok = (labels >= 0) & (labels < p.shape[1])
    onehot[np.flatnonzero(ok), labels[ok]] = 1.0
    diff = p - onehot
    mse = float(np.mean(diff**2))
    return {
        "mae": float(np.mean(np.abs(diff))),
        "mse": mse,
        "rmse": math.sqrt(mse),
        "accuracy": float(np.mean(p.argmax(axis=1) == labels)),
    }


def regression_errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """MAE, MSE, RMSE of predictions (§3 of the mutation paper)."""
    diff = np.asarray(pred, dtype=np.float64).ravel() - np.asarray(y, dtype=np.float64).ravel()
    mse = float(np.mean(diff**2))
    return {"mae": float(np.mean(np.abs(diff))), "mse": mse, "rmse": math.sqrt(mse)}


def change_pct(before: float, after: float) -> float:
    """Relative change in % (§3: "percentage variability"); inf when the baseline is 0 and it moved."""
    if before == 0:
        return 0.0 if after == 0 else math.copysign(math.inf, after)
    return 100.0 * (after - before) / before


def _mean_std(values: list[float]) -> tuple[float, float]:
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=np.float64)
    if len(arr) == 0:
        return math.nan, math.nan
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def seed_for(seed: int, group: int, rep: int) -> int:
    return int(np.random.SeedSequence([seed, group, rep]).generate_state(1)[0])


def summarise(
    kind: str,
    params: dict[str, Any],
    baseline: dict[str, float],
    runs: dict[str, list[dict[str, Any]]],
    extra_details: dict[str, Any],
) -> AuditResult:
    metrics: dict[str, float] = {f"baseline_{m}": v for m, v in baseline.items()}
    summary: dict[str, Any] = {}
    for group, reps in runs.items():
        g = group.lower()
        summary[group] = {}
        for m in baseline:
            mean, std = _mean_std([r["change_pct"][m] for r in reps if r["applied"] > 0])
            metrics[f"{g}_{m}_change_pct_mean"] = mean
            metrics[f"{g}_{m}_change_pct_std"] = std
            summary[group][m] = {"change_pct_mean": mean, "change_pct_std": std}
        applied = [r["applied"] for r in reps]
        summary[group]["applied_mean"] = float(np.mean(applied)) if applied else 0.0
        if not any(applied):
            summary[group]["note"] = "operator not applicable to these data; no mutation made"
    details = {"baseline": baseline, "summary": summary, "runs": runs, **extra_details}
    return AuditResult(kind, params, metrics, details)
