"""Rows of a table already in memory (a pandas frame: one the user holds, or one batch of a Parquet or CSV
file) as a model's inputs, read exactly as ``check`` reads the same rows from a file
(:func:`agent.data.files.load_table`): the label, timestamp and metadata columns are set aside; a model whose
inputs are named like columns reads each input from its column (``[N, 1]``, numbers or text), any other model
reads every remaining column as float32 features, in the table's order."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from agent.data.files import parse_labels
from agent.data.limits import DataError

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class FrameRows:
    """One batch of rows: the model's inputs, the labels (None: not given), the timestamps as nanoseconds
    since the epoch in UTC (None: not given) and the metadata columns the IDI rules read."""

    x: np.ndarray | dict[str, np.ndarray]
    y: np.ndarray | None = None
    timestamps: np.ndarray | None = None
    metadata: dict[str, np.ndarray] = field(default_factory=dict)
    #: the columns the inputs were read from, as :func:`agent.data.files.load_table` names them (None: not a table)
    feature_names: list[str] | None = None

    def __len__(self) -> int:
        if isinstance(self.x, dict):
            return len(next(iter(self.x.values()))) if self.x else 0
        return len(self.x)


def timestamps_ns(values: object, where: str) -> np.ndarray:
    """Timestamps (datetimes, strings pandas parses, or numbers of seconds since the epoch) as int64
    nanoseconds since the epoch in UTC; naive datetimes are read as UTC."""
    import pandas as pd

    if isinstance(values, pd.Series) and pd.api.types.is_datetime64_any_dtype(values.dtype):
        # a column of datetimes converted whole: np.asarray of a zoned one would build a Timestamp per row
        values = pd.DatetimeIndex(values)
    arr = values if isinstance(values, pd.DatetimeIndex) else np.asarray(values)
    try:
        if isinstance(arr, pd.DatetimeIndex):
            ts = arr.tz_localize("UTC") if arr.tz is None else arr.tz_convert("UTC")
        elif arr.dtype.kind in "iuf":
            ts = pd.to_datetime(arr, unit="s", utc=True)
        elif arr.dtype.kind == "M":
            ts = pd.to_datetime(arr, utc=True)
        else:
            ts = pd.to_datetime(pd.Series(np.asarray(values, dtype=object)), utc=True)
    except (ValueError, TypeError) as exc:
        raise DataError(f"{where}: timestamps cannot be read as dates ({str(exc).splitlines()[0]})") from None
    out = np.asarray(pd.DatetimeIndex(ts).as_unit("ns").asi8, dtype=np.int64)
    if pd.DatetimeIndex(ts).hasnans:
        raise DataError(f"{where}: a timestamp is missing")
    return out


def frame_rows(
    df: pd.DataFrame,
    inputs: Sequence[str],
    *,
    label_column: str | None = None,
    timestamp_column: str | None = None,
    metadata: Sequence[str] = (),
    where: str = "data",
) -> FrameRows:
    """The rows of ``df`` as the inputs of a model whose inputs are named ``inputs`` (see the module)."""
    import pandas as pd

    set_aside = [c for c in (label_column, timestamp_column, *metadata) if c is not None]
    missing = [c for c in set_aside if c not in df.columns]
    if missing:
        raise DataError(
            f"{where}: column(s) not found: {', '.join(missing)} (columns: {', '.join(map(str, df.columns))})"
        )
    y = parse_labels(df[label_column].to_numpy(), where) if label_column is not None else None
    ts = timestamps_ns(df[timestamp_column], where) if timestamp_column is not None else None
    meta = {m: df[m].to_numpy() for m in metadata}
    named = len(inputs) > 1 or (len(inputs) == 1 and inputs[0] not in ("x", "input"))
    if named and all(name in df.columns for name in inputs):
        x: np.ndarray | dict[str, np.ndarray] = {}
        for name in inputs:
            col = df[name]
            values = col.to_numpy() if pd.api.types.is_numeric_dtype(col) else col.astype(str).to_numpy(dtype=object)
            x[name] = values.reshape(-1, 1)
        return FrameRows(x, y, ts, meta, list(inputs))
    features = [c for c in df.columns if c not in set_aside]
    non_numeric = [str(c) for c in features if not pd.api.types.is_numeric_dtype(df[c])]
    if non_numeric:
        raise DataError(
            f"{where}: non-numeric feature column(s): {', '.join(non_numeric)}; name them as metadata or the label"
        )
    return FrameRows(df[features].to_numpy(dtype=np.float32), y, ts, meta, [str(c) for c in features])


def _take(rows: FrameRows, part: slice) -> FrameRows:
    x = {k: v[part] for k, v in rows.x.items()} if isinstance(rows.x, dict) else rows.x[part]
    return FrameRows(
        x,
        None if rows.y is None else rows.y[part],
        None if rows.timestamps is None else rows.timestamps[part],
        {k: v[part] for k, v in rows.metadata.items()},
    )


def _joined(parts: Sequence[FrameRows]) -> FrameRows:
    """Batches of the same columns as one; labels and timestamps kept only where every batch has them (a
    :class:`DataError` where some have them and others not)."""
    if len(parts) == 1:
        return parts[0]
    for name in ("y", "timestamps"):
        given = [getattr(p, name) is not None for p in parts]
        if any(given) and not all(given):
            raise DataError(f"some batches have {'labels' if name == 'y' else name} and others not")
    first = parts[0]
    if isinstance(first.x, dict):
        x: np.ndarray | dict[str, np.ndarray] = {
            k: np.concatenate([p.x[k] for p in parts])  # type: ignore[index]
            for k in first.x
        }
    else:
        x = np.concatenate([np.asarray(p.x) for p in parts])
    return FrameRows(
        x,
        None if first.y is None else np.concatenate([p.y for p in parts if p.y is not None]),
        None if first.timestamps is None else np.concatenate([p.timestamps for p in parts if p.timestamps is not None]),
        {k: np.concatenate([p.metadata[k] for p in parts]) for k in first.metadata},
    )


def rebatched(batches: Iterable[FrameRows], rows: int) -> Iterator[FrameRows]:
    """The same rows in the same order, regrouped into batches of ``rows`` (the last one shorter): however the
    data was cut (files, row groups, partitions), the model sees batches of the same sizes, and memory holds at
    most one batch."""
    held: list[FrameRows] = []
    n = 0
    for batch in batches:
        start = 0
        while start < len(batch):
            take = min(rows - n, len(batch) - start)
            held.append(batch if take == len(batch) else _take(batch, slice(start, start + take)))
            n += take
            start += take
            if n == rows:
                yield _joined(held)
                held, n = [], 0
    if held:
        yield _joined(held)
