"""What a notebook hands ``fit`` and ``estimate``, turned into what the agent reads: data sets for a fit (a data
frame and its label column, arrays, or a file as ``icos-agent fit`` reads it) and batches of rows for an estimate
(a data frame, an array, a file, a directory or glob of Parquet files, or an iterator of batches), read a bounded
number of rows at a time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.api import (
    DataLimits,
    Dataset,
    FrameRows,
    OnnxClassifier,
    UserError,
    frame_rows,
    frames,
    image_reading,
    lake_batches,
    lake_files,
    load_data,
    timestamps_ns,
)

#: Rows turned into model inputs (and judged) at once.
BATCH_ROWS = 16384


def _is_frame(obj: object) -> bool:
    import pandas as pd

    return isinstance(obj, pd.DataFrame)


def fit_dataset(
    data: Any, model: OnnxClassifier, label_column: str | None, metadata: Sequence[str], limits: DataLimits
) -> Dataset:
    """A labeled data set for ``fit``: ``(frame, "label")``, a frame with ``label_column``, ``(x, y)`` arrays, or a
    path (``.npz``, ``.csv``, ``.parquet``, an image folder) read as ``icos-agent fit`` reads it."""
    if isinstance(data, tuple) and len(data) == 2 and _is_frame(data[0]) and isinstance(data[1], str):
        data, label_column = data
    if _is_frame(data):
        if label_column is None:
            raise UserError("a data frame for fit needs its label column: (frame, 'label') or label_column='label'")
        rows = frame_rows(data, model.signature.names, label_column=label_column, metadata=metadata, where="frame")
        return Dataset(rows.x, rows.y, rows.metadata, rows.feature_names, "frame")
    if isinstance(data, tuple) and len(data) == 2:
        x, y = data
        return Dataset(np.asarray(x), np.asarray(y))
    if isinstance(data, (str, Path)):
        return load_data(
            data,
            label_column=label_column,
            metadata=list(metadata),
            require_metadata=False,
            limits=limits,
            inputs=model.signature.names,
            image=image_reading(model, None),
            classes=model.classes,
        )
    raise UserError(f"fit reads a data frame and its label column, (x, y) arrays or a path; got {type(data).__name__}")


def _column_or_array(frame: Any, given: Any, name: str) -> tuple[str | None, np.ndarray | None]:
    """A frame's column named by ``given``, or an array given beside the data (one value per row)."""
    if given is None:
        return None, None
    if isinstance(given, str):
        if frame is None:
            raise UserError(f"{name}={given!r} names a column: give the data as a data frame or a table file")
        return given, None
    return None, np.asarray(given)


class Batches:
    """The rows of one ``estimate``'s data, as batches of model inputs with their labels and timestamps; ``n`` the
    rows when known in advance (None: an iterator)."""

    def __init__(
        self,
        data: Any,
        model: OnnxClassifier,
        *,
        labels: Any = None,
        timestamp: Any = None,
        metadata: Sequence[str] = (),
        batch_rows: int = BATCH_ROWS,
        limits: DataLimits | None = None,
    ) -> None:
        if batch_rows < 1:
            raise UserError("batch_rows must be at least 1")
        self.data, self.model, self.labels, self.timestamp = data, model, labels, timestamp
        self.metadata, self.batch_rows, self.limits = list(metadata), batch_rows, limits or DataLimits()
        self.n: int | None = len(data) if _is_frame(data) or isinstance(data, np.ndarray) else None

    def __iter__(self) -> Iterator[FrameRows]:
        data = self.data
        if _is_frame(data) or isinstance(data, np.ndarray):
            yield from self._sliced(data)
        elif isinstance(data, (str, Path)):
            yield from self._path(data)
        elif isinstance(data, Iterable):
            for batch in data:
                yield from Batches(
                    batch,
                    self.model,
                    labels=self.labels if isinstance(self.labels, str) else None,
                    timestamp=self.timestamp if isinstance(self.timestamp, str) else None,
                    metadata=self.metadata,
                    batch_rows=self.batch_rows,
                    limits=self.limits,
                )._one(batch)
        else:
            raise UserError(
                f"estimate reads a data frame, an array, a path or an iterator of batches; got {type(data).__name__}"
            )

    def _one(self, batch: Any) -> Iterator[FrameRows]:
        """One batch of an iterator: a frame, an array, or ``(x, labels)`` / ``(x, labels, timestamps)``."""
        if isinstance(batch, tuple) and len(batch) in (2, 3) and not _is_frame(batch[0]):
            x, y, *ts = batch
            yield FrameRows(
                np.asarray(x),
                None if y is None else np.asarray(y),
                timestamps_ns(ts[0], "batch") if ts and ts[0] is not None else None,
            )
        elif _is_frame(batch) or isinstance(batch, np.ndarray):
            yield from self._sliced(batch)
        else:
            raise UserError(
                f"a batch is a data frame, an array or (x, labels[, timestamps]); got {type(batch).__name__}"
            )

    def _sliced(self, data: Any) -> Iterator[FrameRows]:
        """A frame or an array in memory, ``batch_rows`` at a time, with labels and timestamps given beside it."""
        frame = data if _is_frame(data) else None
        label_col, y = _column_or_array(frame, self.labels, "labels")
        ts_col, ts = _column_or_array(frame, self.timestamp, "timestamp")
        for name, arr in (("labels", y), ("timestamp", ts)):
            if arr is not None and len(arr) != len(data):
                raise UserError(f"{name}: {len(arr)} values for {len(data)} rows")
        ts_ns = timestamps_ns(ts, "timestamp") if ts is not None else None
        for start in range(0, len(data), self.batch_rows):
            rows = slice(start, start + self.batch_rows)
            if frame is not None:
                part = frame_rows(
                    frame.iloc[rows],
                    self.model.signature.names,
                    label_column=label_col,
                    timestamp_column=ts_col,
                    metadata=self.metadata,
                    where="frame",
                )
            else:
                part = FrameRows(data[rows])
            yield FrameRows(
                part.x,
                part.y if y is None else y[rows],
                part.timestamps if ts_ns is None else ts_ns[rows],
                part.metadata,
            )

    def _path(self, path: str | Path) -> Iterator[FrameRows]:
        """A file: ``.npz`` (its ``labels`` and ``timestamp`` arrays named), a CSV or Parquet table read in
        batches, a directory or glob of Parquet files, or an image folder."""
        label_col = self.labels if isinstance(self.labels, str) else None
        ts_col = self.timestamp if isinstance(self.timestamp, str) else None
        if not isinstance(self.labels, (str, type(None))) or not isinstance(self.timestamp, (str, type(None))):
            raise UserError("with a path, labels and timestamp name columns (or arrays of a .npz)")
        p = Path(path)
        suffix = p.suffix.lower()
        if suffix in (".csv", ".npz", ".npy") and not p.is_file():
            raise UserError(f"data file not found: {p}")
        if p.is_file() and suffix in (".csv", ".parquet", ".pq"):
            for df in frames(p, None, self.batch_rows, self.limits):
                yield frame_rows(
                    df,
                    self.model.signature.names,
                    label_column=label_col,
                    timestamp_column=ts_col,
                    metadata=self.metadata,
                    where=str(p),
                )
            return
        if p.is_file() or image_reading(self.model, None) is not None and p.is_dir() and not lake_dir(p):
            yield from self._dataset(p, label_col, ts_col)
            return
        files = lake_files(path)
        yield from lake_batches(
            files,
            self.model.signature.names,
            label_column=label_col,
            timestamp_column=ts_col,
            metadata=self.metadata,
            batch_rows=self.batch_rows,
            limits=self.limits,
        )

    def _dataset(self, p: Path, label_col: str | None, ts_col: str | None) -> Iterator[FrameRows]:
        """An array file or an image folder, read as ``check`` reads it (``y`` its labels when ``labels`` is
        ``"y"``; an image folder's labels are its subfolders when ``labels`` is given)."""
        wanted = [m for m in (*self.metadata, ts_col) if m is not None]
        data = load_data(
            p,
            metadata=wanted,
            limits=self.limits,
            inputs=self.model.signature.names,
            image=image_reading(self.model, None),
            classes=self.model.classes,
        )
        if label_col is not None and data.y is None:
            raise UserError(f"{p}: labels={label_col!r}, but the file holds no labels (y)")
        y = data.y if label_col is not None else None
        ts = timestamps_ns(data.metadata[ts_col], str(p)) if ts_col is not None else None
        meta = {m: data.metadata[m] for m in self.metadata}
        for start in range(0, len(data), self.batch_rows):
            part = data.subset(np.arange(start, min(start + self.batch_rows, len(data))))
            rows = slice(start, start + self.batch_rows)
            yield FrameRows(
                part.x,  # type: ignore[arg-type]
                None if y is None else y[rows],
                None if ts is None else ts[rows],
                {k: v[rows] for k, v in meta.items()},
            )


def lake_dir(p: Path) -> bool:
    """A directory holding Parquet files (a lake), not an image folder."""
    return any(f.suffix.lower() in (".parquet", ".pq") for f in p.rglob("*") if f.is_file())
