"""Tables of a model's predictions (NannyML/Evidently style), read in bounded batches.

One row per prediction: feature columns, the predicted probability columns and, when known, the label
column. Parquet files are read with pyarrow's batch reader, CSV files with pandas' chunked reader, so
a file of any length costs at most one batch of rows in memory.

A single probability column is a binary model's probability of class 1 (NannyML's ``y_pred_proba``);
several columns are one probability per class, in class order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from agent.data.files import parse_labels
from agent.data.limits import DataError, DataLimits
from agent.data.table_files import TABLE_SUFFIXES, first_line, frames, parquet_rows, sniff_schema

if TYPE_CHECKING:
    import pandas as pd

#: Rows read at once by default: bounds memory whatever the file's length.
DEFAULT_BATCH_ROWS = 16384
#: How far a row of probabilities may sum away from 1 before the table is refused.
SUM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class TableColumns:
    """Which columns of a table hold what."""

    proba: tuple[str, ...]
    features: tuple[str, ...]
    label: str | None = None
    metadata: tuple[str, ...] = ()

    def read(self) -> list[str]:
        """Every column to read, each once."""
        cols = [*self.features, *self.proba, *self.metadata, *([self.label] if self.label else [])]
        return list(dict.fromkeys(cols))


@dataclass
class TableBatch:
    """One batch of rows: features ``[N, D]`` float32, probabilities ``[N, K]`` float32 (K ≥ 2),
    labels ``[N]`` (indices or class names) or None, metadata columns."""

    x: np.ndarray
    probabilities: np.ndarray
    y: np.ndarray | None = None
    metadata: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.x)


def _check_path(path: Path) -> None:
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise DataError(f"{path}: a table of predictions must be .csv or .parquet, not {path.suffix!r}")


def table_schema(path: str | Path, limits: DataLimits | None = None) -> dict[str, bool]:
    """Column name → whether it is numeric, read from the Parquet schema or the first CSV rows, once
    the table's columns passed ``limits``."""
    p = Path(path)
    _check_path(p)
    return sniff_schema(p, limits or DataLimits())


def resolve_columns(
    path: str | Path,
    *,
    proba: Sequence[str],
    label: str | None,
    features: Sequence[str] | None = None,
    metadata: Sequence[str] = (),
    require_label: bool = False,
    limits: DataLimits | None = None,
) -> tuple[TableColumns, list[str]]:
    """The columns to read from ``path`` and the non-numeric columns left out of the features.

    Without ``features``, every other numeric column is a feature (non-numeric ones are skipped and
    returned, so the caller can say so); named features must exist and be numeric.
    """
    return columns_of_schema(table_schema(path, limits), str(path), proba, label, features, metadata, require_label)


def columns_of_schema(
    schema: dict[str, bool],
    where: str,
    proba: Sequence[str],
    label: str | None,
    features: Sequence[str] | None,
    metadata: Sequence[str],
    require_label: bool,
) -> tuple[TableColumns, list[str]]:
    """:func:`resolve_columns` over a table's columns (name → numeric), read from a file or a data frame."""
    path = where
    wanted = [*proba, *metadata, *([label] if label else []), *(features or [])]
    missing = [c for c in wanted if c not in schema]
    if label and require_label is False and label in missing:
        missing.remove(label)
        label = None
    if missing:
        raise DataError(f"{path}: column(s) not found: {', '.join(missing)} (columns: {', '.join(schema)})")
    if not proba:
        raise DataError("name the predicted probability column(s) (--proba-columns)")
    skipped: list[str] = []
    if features is None:
        taken = {*proba, *metadata, *([label] if label else [])}
        features = [c for c in schema if c not in taken and schema[c]]
        skipped = [c for c in schema if c not in taken and not schema[c]]
    bad = [c for c in [*features, *proba] if not schema[c]]
    if bad:
        raise DataError(f"{path}: non-numeric column(s): {', '.join(bad)}; features and probabilities must be numbers")
    if not features:
        raise DataError(f"{path}: no numeric feature column left (name them with --feature-columns)")
    return TableColumns(tuple(proba), tuple(features), label, tuple(metadata)), skipped


def _probabilities(df: pd.DataFrame, cols: Sequence[str], where: str) -> np.ndarray:
    p = df[list(cols)].to_numpy(dtype=np.float64)
    if not np.isfinite(p).all():
        raise DataError(f"{where}: probability column(s) {', '.join(cols)} hold empty, NaN or infinite values")
    if (p < 0).any() or (p > 1).any():
        raise DataError(f"{where}: probability column(s) {', '.join(cols)} hold values outside [0, 1]")
    if p.shape[1] == 1:
        p = np.concatenate([1.0 - p, p], axis=1)
    sums = p.sum(axis=1)
    worst = int(np.argmax(np.abs(sums - 1.0))) if len(sums) else 0
    if len(sums) and abs(sums[worst] - 1.0) > SUM_TOLERANCE:
        raise DataError(
            f"{where}: the probabilities of a row must sum to 1 (one row sums to {sums[worst]:.4f}); "
            "--proba-columns must name one column per class, or the probability of class 1 of a binary model"
        )
    return (p / sums[:, None]).astype(np.float32)


def iter_table(
    path: str | Path,
    columns: TableColumns,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    desc: str = "read",
    limits: DataLimits | None = None,
    whole: bool = False,
) -> Iterator[TableBatch]:
    """The table's rows in batches of at most ``batch_rows`` (fewer when a batch would pass
    ``limits.max_bytes``), with a progress bar on stderr (hidden for short runs). ``whole``: the
    caller keeps every row, so the whole table counts against ``limits.max_bytes``.

    Every row's features must be finite numbers (a NaN or infinity is refused wherever it is), its
    probabilities a distribution."""
    from tqdm import tqdm

    p = Path(path)
    _check_path(p)
    start = 0
    reader = frames(p, columns.read(), batch_rows, limits or DataLimits(), whole=whole)
    with tqdm(total=parquet_rows(p), desc=desc, unit="row", leave=False, mininterval=0.5, delay=1.0) as bar:
        for df in reader:
            where = f"{p} (rows {start + 1}..{start + len(df)})"
            yield table_batch(df, columns, where)
            start += len(df)
            bar.update(len(df))


def table_batch(df: pd.DataFrame, columns: TableColumns, where: str) -> TableBatch:
    """The rows of ``df`` (a batch of a table, or a frame in memory) as features, probabilities, labels and
    metadata, checked as a table file's rows are."""
    feats = df[list(columns.features)]
    try:
        x = feats.to_numpy(dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: feature columns must be numeric ({first_line(exc)})") from exc
    finite = np.isfinite(x)
    if not finite.all():
        bad = [c for c, ok in zip(columns.features, finite.all(axis=0), strict=True) if not ok]
        raise DataError(f"{where}: empty, NaN or infinite values in feature column(s): {', '.join(bad)}")
    y = None
    if columns.label is not None:
        if df[columns.label].isna().any():
            raise DataError(f"{where}: empty values in the label column {columns.label!r}")
        y = parse_labels(df[columns.label].to_numpy(), where)
    meta = {m: df[m].to_numpy() for m in columns.metadata}
    return TableBatch(x, _probabilities(df, columns.proba, where), y, meta)


def default_classes(proba: Sequence[str]) -> list[str]:
    """Class names from the probability columns: ``0``/``1`` for a single binary column, else the
    column names without their common prefix (``y_pred_proba_upmarket_card`` → ``upmarket_card``)."""
    if len(proba) == 1:
        return ["0", "1"]
    prefix = _common_prefix(proba)
    names = [c[len(prefix) :] for c in proba]
    return names if all(names) and len(set(names)) == len(names) else list(proba)


def _common_prefix(names: Sequence[str]) -> str:
    first, last = min(names), max(names)
    i = 0
    while i < min(len(first), len(last)) and first[i] == last[i]:
        i += 1
    return first[:i]
