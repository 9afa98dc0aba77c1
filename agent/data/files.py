"""Reading data files given on the command line.

* ``.npz``: array ``x`` (inputs), optional ``y`` (labels); every other 1-D array of length N is a
  metadata field (for IDIs), read only when named. A model of several inputs (``inputs``: their names)
  reads one array per input, named like it (``input_ids``, ``attention_mask``).
* ``.npy``: the inputs alone, memory-mapped.
* ``.csv`` / ``.parquet``: one row per sample; the label column is named by ``label_column``, metadata
  columns by ``metadata``; every other column is a numeric feature. A model whose inputs are named like
  the table's columns (skl2onnx's one input per column, a text column for a string input) reads each
  input from its column, numbers or text.

Every file is read within :class:`~agent.data.limits.DataLimits`: arrays through
:class:`~agent.data.arrays.ArrayFile` (declared sizes checked before decompression, unnamed arrays
never decompressed), tables through :mod:`agent.data.table_files` (columns counted before rows are
parsed, rows and bytes counted while reading).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agent.core.label_values import NONE_INDEX, NONE_LABEL, none_label_index
from agent.data.arrays import ArrayFile
from agent.data.images import ImageSource, Preprocess, is_image_folder
from agent.data.limits import DataError, DataLimits
from agent.data.table_files import frames

__all__ = ["DataError", "DataLimits", "Dataset", "label_indices", "load_data", "parse_labels"]
#: Rows of a table parsed at once while it is read whole.
TABLE_BATCH_ROWS = 65536


@dataclass
class Dataset:
    """Samples of a data file: ``x`` the inputs (one array, or one per named model input), ``y`` the labels."""

    x: np.ndarray | dict[str, np.ndarray] | ImageSource
    y: np.ndarray | None = None
    metadata: dict[str, np.ndarray] = field(default_factory=dict)
    feature_names: list[str] | None = None
    source: str = ""

    def __len__(self) -> int:
        if isinstance(self.x, dict):
            return len(next(iter(self.x.values()))) if self.x else 0
        return self.x.n if isinstance(self.x, ImageSource) else len(self.x)

    @property
    def array(self) -> np.ndarray:
        """The inputs of a single-input data set."""
        if isinstance(self.x, ImageSource):
            return self.x.take(slice(None))[self.x.name]
        if isinstance(self.x, dict):
            if len(self.x) != 1:
                raise DataError(f"{self.source}: {len(self.x)} named inputs where one array was expected")
            return next(iter(self.x.values()))
        return self.x

    def subset(self, index: np.ndarray) -> Dataset:
        if isinstance(self.x, ImageSource):
            x: np.ndarray | dict[str, np.ndarray] | ImageSource = self.x.take(index)
        else:
            x = {k: v[index] for k, v in self.x.items()} if isinstance(self.x, dict) else self.x[index]
        return Dataset(
            x,
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


def load_arrays(
    path: Path,
    metadata: Sequence[str] = (),
    require_metadata: bool = True,
    limits: DataLimits | None = None,
    inputs: Sequence[str] | None = None,
) -> Dataset:
    """A ``.npz`` (``x``, optional ``y``, the named metadata arrays) or ``.npy`` (``x``) file; arrays
    that are not named are never decompressed, and the sizes of those that are were checked first. With
    the model's ``inputs`` named in the file, one array per input."""
    with ArrayFile(path, limits) as arrays:
        if inputs and all(name in arrays for name in inputs) and (len(inputs) > 1 or "x" not in arrays):
            return _named_arrays(path, arrays, list(inputs), metadata, require_metadata)
        if inputs and len(inputs) > 1:
            missing = [name for name in inputs if name not in arrays]
            raise DataError(
                f"{path}: the model takes inputs {', '.join(inputs)}; no array named {missing[0]!r} "
                f"(arrays: {', '.join(arrays.names) or 'none'})"
            )
        if "x" not in arrays:
            raise DataError(f"{path}: no array named 'x' (found: {', '.join(arrays.names) or 'none'})")
        x_info = arrays.info("x")
        if not x_info.shape:
            raise DataError(f"{path}: 'x' is a single value; it needs one row per sample")
        n = x_info.rows
        if "y" in arrays:
            y_info = arrays.info("y")
            if len(y_info.shape) != 1:
                raise DataError(f"{path}: labels must be 1-D, got shape {list(y_info.shape)}")
            if y_info.rows != n:
                raise DataError(f"{path}: 'y' has {y_info.rows} labels but 'x' has {n} samples")
        usable = [m for m in metadata if m in arrays and m not in ("x", "y") and _per_sample(arrays.info(m).shape, n)]
        missing = [m for m in metadata if m not in usable]
        if missing and require_metadata:
            raise DataError(
                f"{path}: metadata array(s) not found: {', '.join(missing)} (one value per sample of 'x'; "
                f"arrays: {', '.join(arrays.names)})"
            )
        x = arrays.read("x")
        y = parse_labels(arrays.read("y"), str(path)) if "y" in arrays else None
        meta = {m: arrays.read(m) for m in usable}
    if x.ndim < 2 and x.size:
        x = x.reshape(len(x), -1)
    return Dataset(x, y, meta, None, str(path))


def _named_arrays(
    path: Path, arrays: ArrayFile, inputs: list[str], metadata: Sequence[str], require_metadata: bool
) -> Dataset:
    rows = {name: arrays.info(name).rows for name in inputs}
    if len(set(rows.values())) > 1:
        raise DataError(f"{path}: the input arrays hold different numbers of samples: {rows}")
    n = rows[inputs[0]]
    usable = [m for m in metadata if m in arrays and m not in (*inputs, "y") and _per_sample(arrays.info(m).shape, n)]
    missing = [m for m in metadata if m not in usable and m not in inputs]
    if missing and require_metadata:
        raise DataError(f"{path}: metadata array(s) not found: {', '.join(missing)}")
    x = {name: arrays.read(name) for name in inputs}
    y = parse_labels(arrays.read("y"), str(path)) if "y" in arrays else None
    if y is not None and len(y) != n:
        raise DataError(f"{path}: 'y' has {len(y)} labels but the inputs have {n} samples")
    meta = {m: arrays.read(m) for m in usable}
    meta.update({m: x[m] for m in metadata if m in x})  # an IDI rule may read a model input
    return Dataset(x, y, meta, None, str(path))


def _per_sample(shape: tuple[int, ...], n: int) -> bool:
    return len(shape) == 1 and shape[0] == n


def load_table(
    path: Path,
    label_column: str | None,
    metadata: Sequence[str] = (),
    require_metadata: bool = True,
    limits: DataLimits | None = None,
    inputs: Sequence[str] | None = None,
) -> Dataset:
    """A CSV or Parquet table read whole, a batch of rows at a time, within ``limits``: each batch is
    turned into float32 features before the next is parsed (or, for a model whose inputs are named like
    columns, into one ``[N, 1]`` array per input, numbers or text)."""
    import pandas as pd

    if inputs and (len(inputs) > 1 or inputs[0] not in ("x", "input")):
        columns = _table_columns(path, limits)
        if all(name in columns for name in inputs):
            return _table_inputs(path, label_column, list(inputs), metadata, require_metadata, limits)
        if len(inputs) > 1:
            missing = [c for c in inputs if c not in columns]
            raise DataError(
                f"{path}: the model takes inputs {', '.join(inputs)}; no column named {missing[0]!r} "
                f"(columns: {', '.join(columns[:20])})"
            )

    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    metas: dict[str, list[np.ndarray]] = {}
    features: list[str] = []
    for df in frames(path, None, TABLE_BATCH_ROWS, limits or DataLimits(), whole=True):
        if not xs:
            if not require_metadata:
                metadata = [m for m in metadata if m in df.columns]
            wanted = [*(metadata or ()), *([label_column] if label_column else [])]
            missing = [c for c in wanted if c not in df.columns]
            if missing:
                raise DataError(
                    f"{path}: column(s) not found: {', '.join(missing)} (columns: {', '.join(map(str, df.columns))})"
                )
            features = [c for c in df.columns if c not in wanted]
            metas = {m: [] for m in metadata}
        feats = df[features]
        non_numeric = [str(c) for c in features if not pd.api.types.is_numeric_dtype(feats[c])]
        if non_numeric:
            raise DataError(
                f"{path}: non-numeric feature column(s): {', '.join(non_numeric)}; "
                "name them with --metadata or --label-column"
            )
        xs.append(feats.to_numpy(dtype=np.float32))
        if label_column:
            ys.append(df[label_column].to_numpy())
        for m in metas:
            metas[m].append(df[m].to_numpy())
    if not xs:
        raise DataError(f"{path}: the table has no rows")
    y = parse_labels(np.concatenate(ys), str(path)) if label_column else None
    x = np.concatenate(xs) if len(xs) > 1 else xs[0]
    del xs
    meta = {m: np.concatenate(parts) for m, parts in metas.items()}
    return Dataset(x, y, meta, [str(c) for c in features], str(path))


def _table_columns(path: Path, limits: DataLimits | None) -> list[str]:
    for df in frames(path, None, 1, limits or DataLimits()):
        return [str(c) for c in df.columns]
    return []


def _table_inputs(
    path: Path,
    label_column: str | None,
    inputs: list[str],
    metadata: Sequence[str],
    require_metadata: bool,
    limits: DataLimits | None,
) -> Dataset:
    """A table whose columns are the model's inputs: each input an ``[N, 1]`` array of its column."""
    import pandas as pd

    parts: dict[str, list[np.ndarray]] = {name: [] for name in inputs}
    ys: list[np.ndarray] = []
    metas: dict[str, list[np.ndarray]] = {}
    for df in frames(path, None, TABLE_BATCH_ROWS, limits or DataLimits(), whole=True):
        if not metas and not ys and not parts[inputs[0]]:
            if label_column and label_column not in df.columns:
                raise DataError(
                    f"{path}: no label column {label_column!r} (columns: {', '.join(map(str, df.columns))})"
                )
            present = [m for m in metadata if m in df.columns]
            if require_metadata and len(present) < len(metadata):
                missing = [m for m in metadata if m not in present]
                raise DataError(f"{path}: column(s) not found: {', '.join(missing)}")
            metas = {m: [] for m in present}
        for name in inputs:
            col = df[name]
            values = col.to_numpy() if pd.api.types.is_numeric_dtype(col) else col.astype(str).to_numpy(dtype=object)
            parts[name].append(values.reshape(-1, 1))
        if label_column:
            ys.append(df[label_column].to_numpy())
        for m in metas:
            metas[m].append(df[m].to_numpy())
    if not parts[inputs[0]]:
        raise DataError(f"{path}: the table has no rows")
    x = {name: np.concatenate(p) for name, p in parts.items()}
    y = parse_labels(np.concatenate(ys), str(path)) if label_column else None
    meta = {m: np.concatenate(p) for m, p in metas.items()}
    return Dataset(x, y, meta, list(inputs), str(path))


def load_data(
    path: str | Path,
    *,
    label_column: str | None = None,
    metadata: Sequence[str] = (),
    require_metadata: bool = True,
    limits: DataLimits | None = None,
    inputs: Sequence[str] | None = None,
    image: tuple[str, Preprocess] | None = None,
    classes: Sequence[str] | None = None,
) -> Dataset:
    """Load a data file by extension (``.npz``, ``.npy``, ``.csv``, ``.parquet``) within ``limits``, or an
    image folder (``image``: the model's image input and its preprocessing), read lazily.

    ``require_metadata=False`` tolerates absent metadata fields (training data needs none). ``inputs``:
    the model's input names, read from arrays or columns named like them.
    """
    p = Path(path)
    if image is not None and is_image_folder(p):
        name, preprocess = image
        source = ImageSource(p, name, preprocess, classes, limits=limits)
        return Dataset(source, source.y, {}, None, str(p))
    if p.is_dir():
        raise DataError(
            f"{p} is a directory: an image folder (one subfolder of PNG/JPEG files per class) "
            "needs a model with one image input"
        )
    if not p.is_file():
        raise DataError(f"data file not found: {p}")
    suffix = p.suffix.lower()
    if suffix in (".npz", ".npy"):
        return load_arrays(p, metadata, require_metadata, limits, inputs)
    if suffix in (".csv", ".parquet", ".pq"):
        return load_table(p, label_column, metadata, require_metadata, limits, inputs)
    raise DataError(f"{p}: unsupported data format {suffix!r} (use .npz, .npy, .csv or .parquet)")


def label_indices(y: np.ndarray, classes: Sequence[str], *, allow_none: bool = False) -> np.ndarray:
    """Map labels given as indices or as class names to class indices; with ``allow_none``, the label
    ``"__none__"`` (an input of none of the model's classes, :mod:`agent.core.label_values`) to
    :data:`~agent.core.label_values.NONE_INDEX` (``check`` reports on such data; ``fit`` cannot fit on it)."""
    arr = np.asarray(y)
    if arr.dtype.kind in "iu":
        if len(arr) and (arr.min() < 0 or arr.max() >= len(classes)):
            raise DataError(f"labels out of range 0..{len(classes) - 1}")
        return arr.astype(np.int64)
    lookup = {c: i for i, c in enumerate(classes)}
    if allow_none and none_label_index(NONE_LABEL, classes) is not None:
        lookup[NONE_LABEL] = NONE_INDEX
    unknown = sorted({str(v) for v in arr} - set(lookup))
    if unknown:
        hint = f" ({NONE_LABEL!r}: none of the classes, is for check, not fit)" if NONE_LABEL in unknown else ""
        raise DataError(f"unknown label(s): {', '.join(unknown[:5])} (classes: {', '.join(classes)}){hint}")
    return np.array([lookup[str(v)] for v in arr], dtype=np.int64)
