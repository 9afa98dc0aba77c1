"""Data-mutation robustness: the DEC, IMP, SGN and DIG operators and the audits built on them.

Implements §4 of Méndez, Benito-Parejo and Merayo, "Testing the Robustness of Machine Learning
Models Through Mutations" (ICCCI 2024), with the robustness measure of §3/§5: the relative change
(in %) of MAE and MSE — here also RMSE — of the model before vs after mutating the data, averaged
over repetitions with its standard deviation.

Operators (on one value ``x`` of a numeric cell; ``α``/``β`` are the lengths of the whole and the
fractional part of ``|x|`` in its shortest decimal representation, e.g. 18.27 → α = 2, β = 2, and
0.23 → α = 1 (the whole part "0"), β = 2):

* **DEC** (misplaced or omitted decimal point): ``x' = x·10^e`` with ``e`` drawn uniformly from the
  integers ``−(α−1) ≤ e ≤ β``, ``e ≠ 0``; only for numbers with a decimal part (β ≥ 1). 18.27 can
  become 1.827, 182.7 or 1827; a number with ``|x| > 1`` never drops below 1.
* **IMP** (imputed missing value): ``x'`` drawn uniformly from ``0``, the previous value of the same
  column ``x_{i−1,j}``, and the mean of all previous values of the column; the first row has only 0.
* **SGN** (sign error): ``x' = −x``.
* **DIG** (wrong digit in the whole part): a position ``1 ≤ s ≤ α`` (``d_1`` least significant) and a
  digit ``m ≠ d_s`` are drawn uniformly; ``x' = x − d_s·10^{s−1} + m·10^{s−1}`` for ``x ≥ 0`` and
  ``x' = x + d_s·10^{s−1} − m·10^{s−1}`` for ``x < 0``. (The paper prints the negative case as
  ``−x + d_s·10^{s−1} − m·10^{s−1}``, which would flip the sign; we keep the sign, as the text
  intends: the digit of ``|x|`` is replaced.)

An operator that cannot apply to a value (DEC on a whole number, SGN on 0, any operator on NaN/inf,
IMP whose drawn value equals the original — the "no change" cases of §5) raises
:class:`NotApplicable`; :func:`mutate` logs such cells and does not count them as mutations.

Probabilistic errors of a classifier follow BenchMetrics Prob (the robust instruments MAE, MSE,
RMSE; never LogLoss, MAPE or median variants): the mean over all ``N × K`` entries of
``|p − onehot(y)|`` (MAE) and ``(p − onehot(y))²`` (MSE), RMSE = sqrt(MSE). For two classes these
equal the binary definitions on the positive-class score.
"""

from __future__ import annotations

import importlib
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from agent.audits.report import AuditError, AuditResult, ProgressFn
from agent.data.files import DataError

__all__ = [
    "ALLOWED_ESTIMATORS",
    "OPERATORS",
    "MutationLog",
    "MutationRecord",
    "NotApplicable",
    "SkippedCell",
    "dec",
    "dig",
    "imp",
    "mutate",
    "probability_errors",
    "regression_errors",
    "run_mutation_audit",
    "run_retrain_audit",
    "sgn",
]

OPERATORS: tuple[str, ...] = ("DEC", "IMP", "SGN", "DIG")

PredictProba = Callable[[np.ndarray], np.ndarray]


class NotApplicable(AuditError):
    """The operator cannot mutate this value (or its result equals the original).

    ``code`` is ``"not_applicable"`` (outside the operator's domain) or ``"no_effect"`` (the
    operator's result equals the original value).
    """

    def __init__(self, message: str, code: str = "not_applicable") -> None:
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------------------------
# Operators on values (§4)
# ----------------------------------------------------------------------------------------------


def _decimal_text(value: float, dtype: np.dtype | type = np.float64) -> str:
    """Shortest positional decimal text of ``|value|`` in ``dtype``, e.g. ``18.27`` or ``5``."""
    scalar = np.dtype(dtype).type(abs(value))
    return str(np.format_float_positional(scalar, unique=True, trim="-"))


def decimal_parts(value: float, dtype: np.dtype | type = np.float64) -> tuple[str, str]:
    """Digits of the whole and of the fractional part of ``|value|`` (``"0"`` whole part below 1)."""
    text = _decimal_text(value, dtype)
    whole, _, frac = text.partition(".")
    return whole or "0", frac.rstrip("0")


def _finite(value: float, op: str) -> None:
    if not math.isfinite(value):
        raise NotApplicable(f"{op} needs a finite number, got {value}")


def _dec(
    value: float, rng: np.random.Generator, alpha: int | None, beta: int | None, dtype: np.dtype | type
) -> tuple[float, str]:
    _finite(value, "DEC")
    whole, frac = decimal_parts(value, dtype)
    a = len(whole) if alpha is None else int(alpha)
    b = len(frac) if beta is None else int(beta)
    if b < 1:
        raise NotApplicable(f"DEC applies only to numbers with a decimal part, got {value}")
    exponents = [e for e in range(-(a - 1), b + 1) if e != 0]
    e = int(rng.choice(exponents))
    sign = "-" if value < 0 else ""
    return float(Decimal(sign + _decimal_text(value, dtype)).scaleb(e)), f"e={e}"


def dec(
    value: float,
    rng: np.random.Generator,
    alpha: int | None = None,
    beta: int | None = None,
    *,
    dtype: np.dtype | type = np.float64,
) -> float:
    """DEC: ``value·10^e`` with ``−(α−1) ≤ e ≤ β``, ``e ≠ 0`` (see module docstring).

    ``alpha``/``beta`` default to the lengths of the whole/fractional part of the value's shortest
    decimal representation in ``dtype`` (use ``np.float32`` for float32 data so 18.27 is "18.27").
    """
    return _dec(value, rng, alpha, beta, dtype)[0]


def _imp_options(column: Sequence[float] | np.ndarray, i: int) -> list[tuple[float, str]]:
    options: list[tuple[float, str]] = [(0.0, "zero")]
    if i >= 1:
        prev = np.asarray(column[:i], dtype=np.float64)
        options += [(float(prev[-1]), "previous"), (float(prev.mean()), "mean_of_previous")]
    return options


def _imp_pick(value: float, options: list[tuple[float, str]], rng: np.random.Generator) -> tuple[float, str]:
    new, which = options[int(rng.integers(len(options)))]
    if new == value or (math.isnan(new) and math.isnan(value)):
        raise NotApplicable(f"IMP ({which}) leaves the value {value} unchanged", "no_effect")
    return new, which


def imp(column: Sequence[float] | np.ndarray, i: int, rng: np.random.Generator) -> float:
    """IMP for row ``i`` (0-based) of ``column``: 0, ``column[i−1]`` or ``mean(column[:i])``."""
    if not 0 <= i < len(column):
        raise IndexError(f"row {i} outside the column of length {len(column)}")
    return _imp_pick(float(column[i]), _imp_options(column, i), rng)[0]


def sgn(value: float) -> float:
    """SGN: ``−value`` (not applicable to 0, whose sign change is no change)."""
    _finite(value, "SGN")
    if value == 0:
        raise NotApplicable("SGN leaves 0 unchanged", "no_effect")
    return -value


def _dig(value: float, rng: np.random.Generator, dtype: np.dtype | type) -> tuple[float, str]:
    _finite(value, "DIG")
    whole, _ = decimal_parts(value, dtype)
    alpha = len(whole)
    s = int(rng.integers(1, alpha + 1))
    d = int(whole[alpha - s])
    m = int(rng.choice([digit for digit in range(10) if digit != d]))
    exact = Decimal(("-" if value < 0 else "") + _decimal_text(value, dtype))
    step = Decimal(m - d).scaleb(s - 1)
    new = exact + step if value >= 0 else exact - step
    return float(new), f"s={s} d={d} m={m}"


def dig(value: float, rng: np.random.Generator, *, dtype: np.dtype | type = np.float64) -> float:
    """DIG: replace one digit of the whole part of ``|value|`` by another digit, keeping the sign."""
    return _dig(value, rng, dtype)[0]


# ----------------------------------------------------------------------------------------------
# Mutating a data set
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MutationRecord:
    """One applied mutation: cell (row, column), operator, old and new value, operator detail."""

    row: int
    column: int | str
    operator: str
    old: float
    new: float
    detail: str


@dataclass(frozen=True)
class SkippedCell:
    """A drawn cell the operator could not mutate (not counted as a mutation).

    ``reason`` is :attr:`NotApplicable.code`; ``message`` says what happened.
    """

    row: int
    column: int | str
    operator: str
    reason: str
    message: str


@dataclass
class MutationLog:
    """What :func:`mutate` changed and what it could not.

    ``requested``: mutations asked per operator (``k`` split equally); ``applied``: the mutations
    made; ``skipped``: drawn cells where the operator did not apply; ``ineligible``: numeric cells
    the operator can never apply to (e.g. DEC on whole numbers), never drawn for it.
    """

    requested: dict[str, int]
    numeric_cells: int
    seed: int
    applied: list[MutationRecord] = field(default_factory=list)
    skipped: list[SkippedCell] = field(default_factory=list)
    ineligible: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        c = Counter(r.operator for r in self.applied)
        return {op: int(c.get(op, 0)) for op in self.requested}

    def shortfall(self) -> dict[str, int]:
        """Requested minus applied, per operator (non-zero when the data ran out of eligible cells)."""
        got = self.counts()
        return {op: self.requested[op] - got[op] for op in self.requested}

    def summary(self) -> dict[str, Any]:
        reasons = Counter((s.operator, s.reason) for s in self.skipped)
        return {
            "requested": dict(self.requested),
            "applied": self.counts(),
            "shortfall": self.shortfall(),
            "skipped": {f"{op}:{why}": int(n) for (op, why), n in sorted(reasons.items())},
            "ineligible_cells": dict(self.ineligible),
            "numeric_cells": self.numeric_cells,
            "seed": self.seed,
        }

    def to_dict(self, max_records: int | None = 200) -> dict[str, Any]:
        """Summary plus (up to ``max_records``) applied and skipped cells."""
        cut = slice(None) if max_records is None else slice(0, max_records)
        return {
            **self.summary(),
            "mutations": [vars(r) for r in self.applied[cut]],
            "skipped_cells": [vars(s) for s in self.skipped[cut]],
        }


def _quotas(k: int, operators: Sequence[str]) -> dict[str, int]:
    """``k`` split equally over the operators; the first ``k mod m`` get one more."""
    base, extra = divmod(k, len(operators))
    return {op: base + (1 if i < extra else 0) for i, op in enumerate(operators)}


def _eligible(op: str, values: np.ndarray) -> np.ndarray:
    """Cells the operator can apply to at all (vectorised pre-check of the operator's domain)."""
    finite = np.isfinite(values)
    if op == "DEC":
        return finite & (values != np.trunc(np.where(finite, values, 0.0)))
    if op == "SGN":
        return finite & (values != 0)
    if op == "IMP":
        ok = finite.copy()
        ok[0] &= values[0] != 0  # first row: the only option is 0
        return ok
    return finite  # DIG


def _draw_without_replacement(size: int, quota: int, rng: np.random.Generator) -> Iterator[int]:
    """Random indices of ``range(size)``, each at most once, in random order.

    Small pools are permuted; from a large pool (``quota`` much smaller than ``size``) indices
    are drawn one by one with rejection, switching to a permutation of the rest if half of the
    pool gets used up.
    """
    if size <= 4 * quota + 64:
        yield from (int(v) for v in rng.permutation(size))
        return
    drawn: set[int] = set()
    while len(drawn) < size // 2:
        pick = int(rng.integers(size))
        if pick in drawn:
            continue
        drawn.add(pick)
        yield pick
    rest = np.setdiff1d(np.arange(size), np.fromiter(drawn, dtype=np.int64, count=len(drawn)))
    yield from (int(v) for v in rng.permutation(rest))


Data = TypeVar("Data", np.ndarray, pd.DataFrame)


def mutate(
    data: Data,
    k: int,
    *,
    operators: Sequence[str] = OPERATORS,
    seed: int = 0,
    columns: Sequence[str] | None = None,
) -> tuple[Data, MutationLog]:
    """Apply ``k`` mutations (equal counts per operator) to distinct random numeric cells.

    ``data`` is a DataFrame (numeric columns, or ``columns``) or an array ``[N, ...]`` whose rows
    are observations (every value of a sample is a cell; for images, pixel values; IMP's "column"
    is the same position across samples). IMP reads the *original* column, so earlier mutations do
    not leak into its previous value or mean. Cells where an operator does not apply are logged
    and another cell is drawn, so ``k`` mutations are made unless the data runs out of eligible
    cells (see :meth:`MutationLog.shortfall`). Integer data comes back as float64 when a mutated
    value is not a whole number.
    """
    ops = tuple(o.upper() for o in operators)
    unknown = [o for o in ops if o not in OPERATORS]
    if unknown or not ops:
        raise AuditError(f"unknown mutation operator(s) {unknown or ops}; choose from {', '.join(OPERATORS)}")
    if len(set(ops)) != len(ops):
        raise AuditError(f"operators listed twice: {list(ops)}")
    if k < 0:
        raise AuditError(f"k must be >= 0, got {k}")
    if isinstance(data, pd.DataFrame):
        cols = list(columns) if columns is not None else list(data.select_dtypes(include="number").columns)
        bad = [c for c in cols if c not in data.columns or not pd.api.types.is_numeric_dtype(data[c])]
        bad += [c for c in cols if c in data.columns and pd.api.types.is_bool_dtype(data[c])]
        if bad:
            raise AuditError(f"columns not numeric or missing: {bad}")
        orig = data[cols].to_numpy(dtype=np.float64, copy=True)
        labels: list[int | str] = list(cols)
        col_dtypes = [data[c].dtype if data[c].dtype.kind == "f" else np.dtype(np.float64) for c in cols]
    else:
        arr = np.asarray(data)
        if arr.dtype.kind not in "fiu" or arr.ndim == 0:
            raise AuditError(f"cannot mutate an array of dtype {arr.dtype} and shape {arr.shape}")
        orig = arr.reshape(len(arr), -1).astype(np.float64)
        labels = list(range(orig.shape[1]))
        col_dtypes = [arr.dtype if arr.dtype.kind == "f" else np.dtype(np.float64)] * orig.shape[1]
    if orig.shape[0] == 0 or orig.shape[1] == 0:
        raise AuditError("no numeric cells to mutate")

    rng = np.random.default_rng(seed)
    values = orig.copy()
    log = MutationLog(_quotas(k, ops), int(np.isfinite(orig).sum()), int(seed))
    used = np.zeros(orig.shape, dtype=bool)
    cumsum = np.cumsum(orig, axis=0) if "IMP" in ops else None
    n_cols = orig.shape[1]

    for op in ops:
        quota = log.requested[op]
        eligible = _eligible(op, orig)
        log.ineligible[op] = int(np.isfinite(orig).sum() - eligible.sum())
        if quota == 0:
            continue
        pool = np.flatnonzero(eligible & ~used)
        done = 0
        for pick in _draw_without_replacement(len(pool), quota, rng):
            if done >= quota:
                break
            i, j = divmod(int(pool[pick]), n_cols)
            old = float(orig[i, j])
            value_dtype = col_dtypes[j]
            try:
                if op == "DEC":
                    new, detail = _dec(old, rng, None, None, value_dtype)
                elif op == "SGN":
                    new, detail = sgn(old), ""
                elif op == "DIG":
                    new, detail = _dig(old, rng, value_dtype)
                else:
                    assert cumsum is not None
                    options = [(0.0, "zero")]
                    if i >= 1:
                        options += [
                            (float(orig[i - 1, j]), "previous"),
                            (float(cumsum[i - 1, j] / i), "mean_of_previous"),
                        ]
                    new, detail = _imp_pick(old, options, rng)
                stored = float(np.asarray(new, dtype=value_dtype))
                if stored == old:
                    raise NotApplicable(f"{op} result {new} equals the value in {value_dtype}", "no_effect")
            except NotApplicable as exc:
                log.skipped.append(SkippedCell(i, labels[j], op, exc.code, str(exc)))
                continue
            values[i, j] = stored
            used[i, j] = True
            done += 1
            log.applied.append(MutationRecord(i, labels[j], op, old, stored, detail))

    if isinstance(data, pd.DataFrame):
        out = data.copy()
        for j, col in enumerate(labels):
            column = values[:, j]
            src = data[col]
            if src.dtype.kind == "f" or (src.dtype.kind in "iu" and np.all(column == np.trunc(column))):
                out[col] = column.astype(src.dtype)
            else:
                out[col] = column
        return out, log  # type: ignore[return-value]
    arr = np.asarray(data)
    out_arr = values.reshape(arr.shape)
    if arr.dtype.kind == "f":
        out_arr = out_arr.astype(arr.dtype)
    elif np.all(values == np.trunc(values)):
        out_arr = out_arr.astype(arr.dtype)
    return out_arr, log  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------
# Error instruments
# ----------------------------------------------------------------------------------------------


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


def _change_pct(before: float, after: float) -> float:
    """Relative change in % (§3: "percentage variability"); inf when the baseline is 0 and it moved."""
    if before == 0:
        return 0.0 if after == 0 else math.copysign(math.inf, after)
    return 100.0 * (after - before) / before


def _mean_std(values: list[float]) -> tuple[float, float]:
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=np.float64)
    if len(arr) == 0:
        return math.nan, math.nan
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def _seed_for(seed: int, group: int, rep: int) -> int:
    return int(np.random.SeedSequence([seed, group, rep]).generate_state(1)[0])


def _summarise(
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


# ----------------------------------------------------------------------------------------------
# Audit of a deployed classifier (reference inputs mutated, model fixed)
# ----------------------------------------------------------------------------------------------


def _predict(predict_proba: PredictProba, x: np.ndarray, batch_size: int | None) -> np.ndarray:
    if batch_size is None or len(x) <= batch_size:
        return np.asarray(predict_proba(x))
    return np.concatenate([np.asarray(predict_proba(x[i : i + batch_size])) for i in range(0, len(x), batch_size)])


def _repeat_groups(
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
            s = _seed_for(seed, gi, rep)
            mutated, log = mutate(data, k, operators=group_ops, seed=s)
            applied = len(log.applied)
            after = evaluate(mutated) if applied else dict(baseline)
            runs[name].append(
                {
                    "repetition": rep,
                    "seed": s,
                    "applied": applied,
                    "after": after,
                    "change_pct": {m: _change_pct(baseline[m], after[m]) for m in baseline},
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

    runs = _repeat_groups(x, k, ops, repetitions, seed, baseline, evaluate, progress)
    params = {
        "k": k,
        "repetitions": repetitions,
        "seed": seed,
        "operators": list(ops),
        "n_samples": len(x),
        "cells": int(np.prod(x.shape)),
        "label_free": label_free,
    }
    return _summarise(
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


# ----------------------------------------------------------------------------------------------
# Paper-faithful audit: mutate the training set, retrain, evaluate on the clean test set
# ----------------------------------------------------------------------------------------------

#: Estimators a retrain spec may name (class path → constructor), nothing else is imported.
ALLOWED_ESTIMATORS: frozenset[str] = frozenset(
    {
        "sklearn.linear_model.LinearRegression",
        "sklearn.linear_model.Ridge",
        "sklearn.linear_model.Lasso",
        "sklearn.linear_model.ElasticNet",
        "sklearn.linear_model.LogisticRegression",
        "sklearn.ensemble.RandomForestRegressor",
        "sklearn.ensemble.RandomForestClassifier",
        "sklearn.ensemble.ExtraTreesRegressor",
        "sklearn.ensemble.ExtraTreesClassifier",
        "sklearn.ensemble.GradientBoostingRegressor",
        "sklearn.ensemble.GradientBoostingClassifier",
        "sklearn.tree.DecisionTreeRegressor",
        "sklearn.tree.DecisionTreeClassifier",
        "sklearn.neighbors.KNeighborsRegressor",
        "sklearn.neighbors.KNeighborsClassifier",
        "sklearn.naive_bayes.GaussianNB",
    }
)

_PARAM_TYPES = (str, int, float, bool, type(None))


def _check_param(name: str, value: Any) -> None:
    if isinstance(value, _PARAM_TYPES):
        return
    if isinstance(value, (list, tuple)) and all(isinstance(v, _PARAM_TYPES) for v in value):
        return
    raise AuditError(f"estimator parameter {name!r} must be a number, string, boolean, null or a list of them")


def build_estimator(spec: Mapping[str, Any], seed: int | None = None) -> Any:
    """A scikit-learn estimator from ``{"estimator": "<allowed class path>", "params": {...}}``.

    ``random_state`` is set to ``seed`` when the estimator has one and the spec does not.
    """
    if not isinstance(spec, Mapping):
        raise AuditError("the estimator spec must be a mapping with keys 'estimator' and 'params'")
    extra = set(spec) - {"estimator", "params"}
    if extra:
        raise AuditError(f"unknown key(s) in the estimator spec: {sorted(extra)}; use 'estimator' and 'params'")
    path = spec.get("estimator")
    if not isinstance(path, str) or path not in ALLOWED_ESTIMATORS:
        allowed = ", ".join(sorted(ALLOWED_ESTIMATORS))
        raise AuditError(f"estimator {path!r} is not allowed; choose one of: {allowed}")
    params = spec.get("params") or {}
    if not isinstance(params, Mapping):
        raise AuditError("'params' must be a mapping of parameter names to values")
    for name, value in params.items():
        _check_param(str(name), value)
    module, _, cls_name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), cls_name)
    try:
        est = cls(**dict(params))
        if seed is not None and "random_state" in est.get_params() and "random_state" not in params:
            est.set_params(random_state=seed)
    except (TypeError, ValueError) as exc:
        raise AuditError(f"invalid parameters for {path}: {exc}") from exc
    return est


def run_retrain_audit(
    spec: Mapping[str, Any],
    train_df: pd.DataFrame,
    test_df: pd.DataFrame,
    target: str,
    *,
    k: int,
    repetitions: int = 5,
    seed: int = 0,
    operators: Sequence[str] = OPERATORS,
    progress: ProgressFn | None = None,
) -> AuditResult:
    """The paper's procedure (§4-5): mutate ``k`` predictor cells of the training set, retrain,
    evaluate on the clean test set; repeat, per operator and for all operators together.

    Regression estimators are scored by MAE/MSE/RMSE of their predictions; classifiers by the
    probabilistic MAE/MSE/RMSE of ``predict_proba`` against one-hot truth, plus accuracy.
    """
    from sklearn.base import clone, is_classifier

    if repetitions < 1:
        raise AuditError(f"repetitions must be >= 1, got {repetitions}")
    for name, df in (("training", train_df), ("test", test_df)):
        if target not in df.columns:
            raise AuditError(f"target column {target!r} is not in the {name} data")
    predictors = [c for c in train_df.columns if c != target]
    missing = [c for c in predictors if c not in test_df.columns]
    if missing:
        raise AuditError(f"test data lacks predictor columns {missing}")
    non_numeric = [
        c
        for c in predictors
        if not pd.api.types.is_numeric_dtype(train_df[c]) or pd.api.types.is_bool_dtype(train_df[c])
    ]
    if non_numeric:
        raise AuditError(f"predictor columns must be numeric; not numeric: {non_numeric}")
    template = build_estimator(spec, seed)
    classification = bool(is_classifier(template))
    x_train, y_train = train_df[predictors], train_df[target].to_numpy()
    x_test, y_test = test_df[predictors], test_df[target].to_numpy()

    def evaluate(x_fit: pd.DataFrame) -> dict[str, float]:
        est = clone(template)
        est.fit(x_fit, y_train)
        if classification:
            proba = est.predict_proba(x_test)
            index = {c: i for i, c in enumerate(est.classes_.tolist())}
            labels = np.array([index.get(v, -1) for v in y_test.tolist()], dtype=np.int64)
            return probability_errors(proba, labels)
        return regression_errors(est.predict(x_test), y_test)

    baseline = evaluate(x_train)
    ops = tuple(o.upper() for o in operators)
    runs = _repeat_groups(x_train, k, ops, repetitions, seed, baseline, evaluate, progress)
    params = {
        "estimator": spec.get("estimator"),
        "estimator_params": dict(spec.get("params") or {}),
        "task": "classification" if classification else "regression",
        "k": k,
        "repetitions": repetitions,
        "seed": seed,
        "operators": list(ops),
        "n_train": len(train_df),
        "n_test": len(test_df),
        "predictor_cells": int(x_train.size),
    }
    return _summarise(
        "mutation_retrain",
        params,
        baseline,
        runs,
        {"mutated_share_of_cells": k / max(int(x_train.size), 1), "target": target},
    )


def read_table(path: str | Path) -> pd.DataFrame:
    """A CSV or Parquet table of retrain mode; unreadable files raise :class:`DataError`."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file not found: {p}")
    try:
        return pd.read_parquet(p) if p.suffix.lower() in (".parquet", ".pq") else pd.read_csv(p)
    except Exception as exc:  # pandas raises many parser error types
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{p}: cannot read table ({reason})") from None
