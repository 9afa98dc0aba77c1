"""The mutation operators of Méndez et al. §4 (DEC, IMP, SGN, DIG) on single values, and
:func:`mutate`, which applies them to ``k`` cells of a data set and logs what it changed or skipped
(the "no change" cases of §5 raise :class:`NotApplicable` and are not counted)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from agent.audits.report import AuditError

OPERATORS: tuple[str, ...] = ("DEC", "IMP", "SGN", "DIG")


def cells_to_mutate(k: int | None, cell_share: float, cells: int) -> int:
    """``k`` when given, else ``cell_share`` of ``cells`` (at least one, at most all)."""
    if k is not None:
        if k < 1:
            raise AuditError(f"k must be >= 1, got {k}")
        return k
    if not 0 < cell_share <= 1:
        raise AuditError(f"cell_share must be in (0, 1], got {cell_share}")
    return max(1, min(cells, round(cell_share * cells)))


class NotApplicable(AuditError):
    """The operator cannot mutate this value (or its result equals the original).

    ``code`` is ``"not_applicable"`` (outside the operator's domain) or ``"no_effect"`` (the
    operator's result equals the original value).
    """

    def __init__(self, message: str, code: str = "not_applicable") -> None:
        super().__init__(message)
        self.code = code


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
    orig, labels, col_dtypes = _cells(data, columns)

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
            try:
                stored, detail = _mutated_cell(op, orig, cumsum, i, j, col_dtypes[j], rng)
            except NotApplicable as exc:
                log.skipped.append(SkippedCell(i, labels[j], op, exc.code, str(exc)))
                continue
            values[i, j] = stored
            used[i, j] = True
            done += 1
            log.applied.append(MutationRecord(i, labels[j], op, old, stored, detail))
    return _like(data, values, labels), log


def _cells(
    data: np.ndarray | pd.DataFrame, columns: Sequence[str] | None
) -> tuple[np.ndarray, list[int | str], list[np.dtype]]:
    """The mutable cells as float64 ``[rows, columns]``, each column's label and the dtype its values take."""
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
    return orig, labels, col_dtypes


def _mutated_cell(
    op: str,
    orig: np.ndarray,
    cumsum: np.ndarray | None,
    i: int,
    j: int,
    value_dtype: np.dtype,
    rng: np.random.Generator,
) -> tuple[float, str]:
    """The new value of cell ``(i, j)`` under ``op`` as ``value_dtype`` stores it, and how it was chosen;
    :class:`NotApplicable` when ``op`` cannot change it."""
    old = float(orig[i, j])
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
    return stored, detail


def _like(data: Data, values: np.ndarray, labels: list[int | str]) -> Data:
    """``values`` in the type and dtypes of ``data`` (integers stay integers while every value is whole)."""
    if isinstance(data, pd.DataFrame):
        out = data.copy()
        for j, col in enumerate(labels):
            column = values[:, j]
            src = data[col]
            if src.dtype.kind == "f" or (src.dtype.kind in "iu" and np.all(column == np.trunc(column))):
                out[col] = column.astype(src.dtype)
            else:
                out[col] = column
        return out  # type: ignore[return-value]
    arr = np.asarray(data)
    out_arr = values.reshape(arr.shape)
    if arr.dtype.kind == "f":
        out_arr = out_arr.astype(arr.dtype)
    elif np.all(values == np.trunc(values)):
        out_arr = out_arr.astype(arr.dtype)
    return out_arr  # type: ignore[return-value]
