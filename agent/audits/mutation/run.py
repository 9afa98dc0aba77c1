"""The mutation audit of a deployed classifier: the reference inputs are mutated (Méndez et al.
§4), the model stays fixed, and the relative change of its errors is reported per operator (§5).

The operators change numbers, so a model of several inputs has its numeric ones mutated (a table's
columns, images) as one table of cells, and its text, categories and token ids left as they are: the
result names the inputs it skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from agent.audits.mutation.operators import OPERATORS, cells_to_mutate, mutate
from agent.audits.mutation.robustness import change_pct, probability_errors, seed_for, summarise
from agent.audits.params import DEFAULT_CELL_SHARE
from agent.audits.report import AuditError, AuditResult, ProgressFn
from agent.model.inputs import Inputs

PredictProba = Callable[[Any], np.ndarray]


def _predict(predict_proba: PredictProba, x: np.ndarray | Inputs, batch_size: int | None) -> np.ndarray:
    n = x.n if isinstance(x, Inputs) else len(x)
    if batch_size is None or n <= batch_size:
        return np.asarray(predict_proba(x))
    if isinstance(x, Inputs):
        return np.concatenate([np.asarray(predict_proba(b)) for b in x.batches(batch_size)])
    return np.concatenate([np.asarray(predict_proba(x[i : i + batch_size])) for i in range(0, n, batch_size)])


def table_of(batch: Inputs, names: Sequence[str]) -> pd.DataFrame:
    """The numeric inputs ``names`` as one table: a column per input of one value per sample
    (``age``), else one per value (``pixels[3]``)."""
    cols: dict[str, np.ndarray] = {}
    for name in names:
        arr = np.asarray(batch[name]).reshape(batch.n, -1)
        if arr.shape[1] == 1:
            cols[name] = arr[:, 0]
        else:
            cols.update({f"{name}[{j}]": arr[:, j] for j in range(arr.shape[1])})
    return pd.DataFrame(cols)


def inputs_of(table: pd.DataFrame, batch: Inputs, names: Sequence[str]) -> Inputs:
    """``batch`` with the inputs ``names`` read back from ``table`` (:func:`table_of`), in their own
    shapes and dtypes (integer inputs rounded)."""
    out = batch
    start = 0
    for name in names:
        like = np.asarray(batch[name])
        width = like.reshape(batch.n, -1).shape[1]
        values = table.iloc[:, start : start + width].to_numpy(dtype=np.float64).reshape(like.shape)
        start += width
        if like.dtype.kind != "f":
            info = np.iinfo(like.dtype)
            values = np.clip(np.rint(values), info.min, info.max)
        out = out.replace(name, np.ascontiguousarray(values.astype(like.dtype)))
    return out


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


@dataclass(frozen=True)
class MutationPlan:
    """How a mutation audit mutates, whether the cells are a fixed model's inputs or a training set (retrain
    mode): ``k`` cells per repetition (``cell_share`` of them when ``k`` is None) by each of ``operators``
    alone and by all together, ``repetitions`` times from ``seed``."""

    k: int | None = None
    cell_share: float = DEFAULT_CELL_SHARE
    repetitions: int = 5
    seed: int = 0
    operators: Sequence[str] = OPERATORS

    def __post_init__(self) -> None:
        if self.repetitions < 1:
            raise AuditError(f"repetitions must be >= 1, got {self.repetitions}")

    def repeat(
        self,
        data: np.ndarray | pd.DataFrame,
        baseline: dict[str, float],
        evaluate: Callable[[Any], dict[str, float]],
        progress: ProgressFn | None,
    ) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
        """The runs of :func:`repeat_groups` on ``data``, after the plan as the result records it (``k``
        counted for ``data``; ``cell_share`` only where it set ``k``)."""
        ops = tuple(o.upper() for o in self.operators)
        k = cells_to_mutate(self.k, self.cell_share, int(np.prod(data.shape)))
        runs = repeat_groups(data, k, ops, self.repetitions, self.seed, baseline, evaluate, progress)
        recorded = {
            "k": k,
            "cell_share": None if self.k is not None else self.cell_share,
            "repetitions": self.repetitions,
            "seed": self.seed,
            "operators": list(ops),
        }
        return recorded, runs


def _cells_of(
    x: np.ndarray | Inputs, mutable: Sequence[str] | None
) -> tuple[Inputs | None, list[str], np.ndarray | pd.DataFrame]:
    """What is mutated: ``x`` itself (one array), or the table of ``x``'s ``mutable`` inputs (with their names)."""
    batch = x if isinstance(x, Inputs) else None
    names = list(mutable) if mutable is not None else list(batch) if batch is not None else []
    if batch is not None and not names:
        raise AuditError("no numeric input to mutate")
    data: np.ndarray | pd.DataFrame = table_of(batch, names) if batch is not None else np.asarray(x)
    return batch, names, data


def _truth_and_baseline(clean: np.ndarray, y: np.ndarray | None, n: int) -> tuple[np.ndarray, dict[str, float]]:
    """The labels the errors are measured against (the model's own on the ``n`` clean inputs when ``y`` is
    None) and the clean inputs' errors."""
    if clean.ndim != 2 or len(clean) != n:
        raise AuditError(f"predict_proba must return [N, K] probabilities, got shape {list(clean.shape)}")
    truth = clean.argmax(axis=1) if y is None else np.asarray(y)
    if len(truth) != n:
        raise AuditError(f"{n} samples but {len(truth)} labels")
    return truth, probability_errors(clean, truth)


def run_mutation_audit(
    predict_proba: PredictProba,
    x: np.ndarray | Inputs,
    y: np.ndarray | None,
    plan: MutationPlan,
    *,
    progress: ProgressFn | None = None,
    batch_size: int | None = 1024,
    mutable: Sequence[str] | None = None,
    skipped: Mapping[str, str] | None = None,
) -> AuditResult:
    """Robustness of a fixed classifier to the mutated cells of its reference inputs ``x`` (``plan``: ``k``
    cells, ``cell_share`` of the mutable cells when ``k`` is None).

    ``x`` is one numeric array, or a model's :class:`Inputs` of which the ``mutable`` ones (numeric) are
    mutated together as one table (:func:`table_of`); ``skipped`` names the others with their kind, for
    the result (``params.skipped_inputs``, ``details.skipped_inputs``).

    For each operator alone (``k`` mutations of that operator) and for all operators together
    (``k`` split equally), ``repetitions`` seeded runs mutate ``x``, predict, and measure the
    relative change (%) of MAE, MSE, RMSE (probabilities vs one-hot truth) and of accuracy against
    the clean inputs; metrics are the mean and standard deviation (ddof = 1) over repetitions.
    Without labels (``y=None``) the truth is the model's own labels on the clean inputs.
    Metric keys: ``baseline_<m>``, ``<group>_<m>_change_pct_mean``/``_std`` with group ``dec``,
    ``imp``, ``sgn``, ``dig`` or ``all`` and m ``mae``, ``mse``, ``rmse``, ``accuracy``.
    """
    batch, names, data = _cells_of(x, mutable)
    n = batch.n if batch is not None else len(data)
    clean = _predict(predict_proba, batch if batch is not None else data, batch_size)
    truth, baseline = _truth_and_baseline(clean, y, n)
    label_free = y is None

    def evaluate(mutated: Any) -> dict[str, float]:
        moved = inputs_of(mutated, batch, names) if batch is not None else mutated
        return probability_errors(_predict(predict_proba, moved, batch_size), truth)

    cells = int(np.prod(data.shape))
    recorded, runs = plan.repeat(data, baseline, evaluate, progress)
    params: dict[str, Any] = {
        **recorded,
        "n_samples": n,
        "cells": cells,
        "label_free": label_free,
    }
    extra: dict[str, Any] = {}
    if batch is not None:
        params["inputs"] = names
        params["skipped_inputs"] = list(skipped or {})
        extra["skipped_inputs"] = dict(skipped or {})
    return summarise(
        "mutation",
        params,
        baseline,
        runs,
        {
            "label_free": label_free,
            "error_definition": "mean over N×K of |p - onehot(y)| (MAE), (p - onehot(y))² (MSE); RMSE = sqrt(MSE)",
            "mutated_share_of_cells": recorded["k"] / max(cells, 1),
            **extra,
        },
    )
