"""The mutation audit of a deployed classifier: the reference inputs are mutated (Méndez et al.
§4), the model stays fixed, and the relative change of its errors is reported per operator (§5)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agent.audits.mutation.operators import OPERATORS, mutate
from agent.audits.mutation.robustness import change_pct, probability_errors, seed_for, summarise
from agent.audits.report import AuditError, AuditResult, ProgressFn

PredictProba = Callable[[np.ndarray], np.ndarray]


def _predict(predict_proba: PredictProba, x: np.ndarray, batch_size: int | None) -> np.ndarray:
    if batch_size is None or len(x) <= batch_size:
        return np.asarray(predict_proba(x))
    return np.concatenate([np.asarray(predict_proba(x[i : i + batch_size])) for i in range(0, len(x), batch_size)])


def repeat_groups(
    data: Any,
    k: int,
    ops: tuple[str, ...],
    repetitions: int,
    seed: int,
    baseline: dict[str, float],
    evaluate: Callable[[Any], dict[str, float]],
    progress: ProgressFn | None,
) -> dict[str, list[dict[str, Any]]]:
    """For each operator alone and for all together (``ALL``), ``repetitions`` seeded runs: mutate
    ``data`` (``k`` mutations), ``evaluate`` the mutated data and record the relative change (%) of
    every error against ``baseline`` (paper §3, §5: averaged over repetitions by the callers)."""
    groups: list[tuple[str, tuple[str, ...]]] = [(op, (op,)) for op in ops] + [("ALL", ops)]
    runs: dict[str, list[dict[str, Any]]] = {}
    total, done = len(groups) * repetitions, 0
    for gi, (name, group_ops) in enumerate(groups):
        runs[name] = []
        for rep in range(repetitions):
            s = seed_for(seed, gi, rep)
            mutated, log = mutate(data, k, operators=group_ops, seed=s)
            applied = len(log.applied)
            after = evaluate(mutated) if applied else dict(baseline)
            runs[name].append(
                {
                    "repetition": rep,
                    "seed": s,
                    "applied": applied,
                    "after": after,
                    "change_pct": {m: change_pct(baseline[m], after[m]) for m in baseline},
                    "log": log.summary(),
                }
            )
            done += 1
            if progress is not None:
                progress(done, total)
    return runs


def run_mutation_audit(
    predict_proba: PredictProba,
    x: np.ndarray,
    y: np.ndarray | None,
    *,
    k: int,
    repetitions: int = 5,
    seed: int = 0,
    operators: Sequence[str] = OPERATORS,
    progress: ProgressFn | None = None,
    batch_size: int | None = 1024,
) -> AuditResult:
    """Robustness of a fixed classifier to ``k`` mutated cells of its reference inputs ``x``.

    For each operator alone (``k`` mutations of that operator) and for all operators together
    (``k`` split equally), ``repetitions`` seeded runs mutate ``x``, predict, and measure the
    relative change (%) of MAE, MSE, RMSE (probabilities vs one-hot truth) and of accuracy against
    the clean inputs; metrics are the mean and standard deviation (ddof = 1) over repetitions.
    Without labels (``y=None``) the truth is the model's own labels on the clean inputs.
    Metric keys: ``baseline_<m>``, ``<group>_<m>_change_pct_mean``/``_std`` with group ``dec``,
    ``imp``, ``sgn``, ``dig`` or ``all`` and m ``mae``, ``mse``, ``rmse``, ``accuracy``.
    """
    if repetitions < 1:
        raise AuditError(f"repetitions must be >= 1, got {repetitions}")
    x = np.asarray(x)
    clean = _predict(predict_proba, x, batch_size)
    if clean.ndim != 2 or len(clean) != len(x):
        raise AuditError(f"predict_proba must return [N, K] probabilities, got shape {list(clean.shape)}")
    label_free = y is None
    truth = clean.argmax(axis=1) if y is None else np.asarray(y)
    if len(truth) != len(x):
        raise AuditError(f"{len(x)} samples but {len(truth)} labels")
    baseline = probability_errors(clean, truth)
    ops = tuple(o.upper() for o in operators)

    def evaluate(mutated: Any) -> dict[str, float]:
        return probability_errors(_predict(predict_proba, mutated, batch_size), truth)

    runs = repeat_groups(x, k, ops, repetitions, seed, baseline, evaluate, progress)
    params = {
        "k": k,
        "repetitions": repetitions,
        "seed": seed,
        "operators": list(ops),
        "n_samples": len(x),
        "cells": int(np.prod(x.shape)),
        "label_free": label_free,
    }
    return summarise(
        "mutation",
        params,
        baseline,
        runs,
        {
            "label_free": label_free,
            "error_definition": "mean over N×K of |p - onehot(y)| (MAE), (p - onehot(y))² (MSE); RMSE = sqrt(MSE)",
            "mutated_share_of_cells": k / max(int(np.prod(x.shape)), 1),
        },
    )
