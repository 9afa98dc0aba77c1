"""Reading data files given on the command line.

* ``.npz``: array ``x`` (inputs), optional ``y`` (labels); every other 1-D array of length N is a
  metadata field (for IDIs).
* ``.csv`` / ``.parquet``: one row per sample; the label column is named by ``label_column``, metadata
  columns by ``metadata``; every other column is a numeric feature.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agent.errors import UserError


class DataError(UserError, ValueError):
    """A data file that cannot be used, with the reason."""


@dataclass
class Dataset:
    x: np.ndarray
    y: np.ndarray | None = None
    metadata: dict[str, np.ndarray] = field(default_factory=dict)
    feature_names: list[str] | None = None
    source: str = ""

    def __len__(self) -> int:
        return len(self.x)

    def subset(self, index: np.ndarray) -> Dataset:
        return Dataset(
            self.x[index],
            None if self.y is None else self.y[index],
            {k: v[index] for k, v in self.metadata.items()},
            self.feature_names,
            self.source,
        )


def parse_labels(y: np.ndarray, where: str) -> np.ndarray:
    """Labels as int64 indices when they are whole numbers, else as class-name strings."""
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise DataError(f"{where}: labels must be 1-D, got shape {list(arr.shape)}")
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        return arr.astype(np.int64)
    return arr.astype(str)


def load_npz(path: Path, metadata: Sequence[str] = (), require_metadata: bool = True) -> Dataset:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except ValueError as exc:
        raise DataError(f"{path}: cannot read npz without pickle ({exc})") from exc
    except OSError as exc:
        raise DataError(f"{path}: not a valid .npz file ({exc})") from exc
    if "x" not in arrays:
        raise DataError(f"{path}: no array named 'x' (found: {', '.join(arrays) or 'none'})")
    x = arrays.pop("x")
    if x.ndim < 2 and x.size:
        x = x.reshape(len(x), -1)
    n = len(x)
    y = parse_labels(arrays.pop("y"), str(path)) if "y" in arrays else None
    if y is not None and len(y) != n:
        raise DataError(f"{path}: 'y' has {len(y)} labels but 'x' has {n} samples")
    meta = {k: v for k, v in arrays.items() if v.ndim == 1 and len(v) == n}
    missing = [m for m in metadata if m not in meta]
    if missing and require_metadata:
        raise DataError(f"{path}: metadata array(s) not found: {', '.join(missing)}")
    return Dataset(x, y, meta, None, str(path))


def load_table(
    path: Path, label_column: str | None, metadata: Sequence[str] = (), require_metadata: bool = True
) -> Dataset:
    import pandas as pd

    try:
        df = pd.read_parquet(path) if path.suffix.lower() in (".parquet", ".pq") else pd.read_csv(path)
    except Exception as exc:  # pandas raises many parser error types
        raise DataError(
            f"{path}: cannot read table ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        ) from exc
    if not require_metadata:
        metadata = [m for m in metadata if m in df.columns]
    missing = [c for c in [*(metadata or ()), *([label_column] if label_column else [])] if c not in df.columns]
    if missing:
        raise DataError(
            f"{path}: column(s) not found: {', '.join(missing)} (columns: {', '.join(map(str, df.columns))})"
        )
    y = parse_labels(df[label_column].to_numpy(), str(path)) if label_column else None
    meta = {m: df[m].to_numpy() for m in metadata}
    feats = df.drop(columns=[*metadata, *([label_column] if label_column else [])])
    non_numeric = [str(c) for c in feats.columns if not pd.api.types.is_numeric_dtype(feats[c])]
    if non_numeric:
        raise DataError(
            f"{path}: non-numeric feature column(s): {', '.join(non_numeric)}; "
            "name them with --metadata or --label-column"
        )
    return Dataset(feats.to_numpy(dtype=np.float32), y, meta, [str(c) for c in feats.columns], str(path))


def load_data(
    path: str | Path,
    *,
    label_column: str | None = None,
    metadata: Sequence[str] = (),
    require_metadata: bool = True,
) -> Dataset:
    """Load a data file by extension (``.npz``, ``.csv``, ``.parquet``).

    ``require_metadata=False`` tolerates absent metadata fields (training data needs none).
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file not found: {p}")
    suffix = p.suffix.lower()
    if suffix == ".npz":
        return load_npz(p, metadata, require_metadata)
    if suffix in (".csv", ".parquet", ".pq"):
        return load_table(p, label_column, metadata, require_metadata)
    raise DataError(f"{p}: unsupported data format {suffix!r} (use .npz, .csv or .parquet)")


def label_indices(y: np.ndarray, classes: Sequence[str]) -> np.ndarray:
    """Map labels given as indices or as class names to class indices."""
    arr = np.asarray(y)
    if arr.dtype.kind in "iu":
        if len(arr) and (arr.min() < 0 or arr.max() >= len(classes)):
            raise DataError(f"labels out of range 0..{len(classes) - 1}")
        return arr.astype(np.int64)
    lookup = {c: i for i, c in enumerate(classes)}
    unknown = sorted({str(v) for v in arr} - set(lookup))
    if unknown:
        raise DataError(f"unknown label(s): {', '.join(unknown[:5])} (classes: {', '.join(classes)})")
    return np.array([lookup[str(v)] for v in arr], dtype=np.int64)
