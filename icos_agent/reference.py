"""Bundles fitted from a model's logged predictions rather than from the model: a reference data frame of
features, the model's predicted probabilities and the labels (NannyML's reference data), fitted as ``icos-agent fit
--reference`` fits a table, and its logged rows (features and probabilities, no model to run) read in batches for an
estimate, as ``icos-agent check`` reads a table with such a bundle."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from agent.api import (
    TableBatch,
    TableColumns,
    UserError,
    columns_of_schema,
    table_batch,
    timestamps_ns,
)


def _is_frame(obj: object) -> bool:
    import pandas as pd

    return isinstance(obj, pd.DataFrame)


def reference_columns(
    frame: Any,
    proba_columns: Sequence[str],
    label_column: str,
    feature_columns: Sequence[str] | None,
    metadata: Sequence[str],
    exclude: Sequence[str],
) -> tuple[TableColumns, list[str]]:
    """Which columns of the reference frame hold what, as ``fit --reference`` resolves a table's: without
    ``feature_columns``, every other numeric column but ``exclude`` is a feature; the non-numeric ones left out."""
    import pandas as pd

    if not proba_columns:
        raise UserError("name the predicted probability column(s): proba_columns=['y_pred_proba']")
    schema = {str(c): bool(pd.api.types.is_numeric_dtype(frame[c])) for c in frame.columns if c not in set(exclude)}
    return columns_of_schema(
        schema, "reference", list(proba_columns), label_column, feature_columns, list(metadata), True
    )


def table_batches(
    data: Any,
    columns: TableColumns,
    *,
    labels: str | None,
    timestamp: str | None,
    batch_rows: int,
) -> Iterator[tuple[TableBatch, np.ndarray | None]]:
    """Logged rows (a data frame, or an iterator of them) ``batch_rows`` at a time, each batch with its timestamps
    (None without ``timestamp``): the bundle's feature and probability columns, the ``labels`` column if named."""
    if labels is not None and not isinstance(labels, str) or timestamp is not None and not isinstance(timestamp, str):
        raise UserError("with a bundle fitted from a reference table, labels and timestamp name columns")
    wanted = TableColumns(columns.proba, columns.features, labels, columns.metadata)
    frames: Iterable[Any] = [data] if _is_frame(data) else data
    if not _is_frame(data) and not isinstance(data, Iterable):
        raise UserError(f"a bundle fitted from a reference table reads data frames; got {type(data).__name__}")
    for frame in frames:
        if not _is_frame(frame):
            raise UserError(f"a bundle fitted from a reference table reads data frames; got {type(frame).__name__}")
        missing = [c for c in (*wanted.read(), *([timestamp] if timestamp else [])) if c not in frame.columns]
        if missing:
            raise UserError(f"column(s) not found: {', '.join(map(str, missing))}")
        for start in range(0, len(frame), batch_rows):
            part = frame.iloc[start : start + batch_rows]
            where = f"rows {start + 1}..{start + len(part)}"
            ts = timestamps_ns(part[timestamp], where) if timestamp is not None else None
            yield table_batch(part, wanted, where), ts
