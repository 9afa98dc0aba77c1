"""CSV and Parquet files read within :class:`~agent.data.limits.DataLimits`.

What a table declares is checked before its rows are parsed: a CSV's columns are counted in its
header line by a scanner that stops past ``max_columns`` (pandas would first build every column), a
Parquet file's columns, rows and uncompressed size come from its metadata. Rows are then read in
batches (pandas' chunked reader, pyarrow's batch reader); each batch is cut to fit ``max_bytes``, rows
are counted against ``max_rows``, and a read of the whole table (``whole=True``) counts everything it
holds against ``max_bytes``.

Used by :mod:`agent.data.files` (a table read whole for ``fit``/``check``/audits),
:mod:`agent.data.tables` (tables of predictions, in batches) and the mutation audit's retrain mode.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from agent.data.limits import DataError, DataLimits

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow.parquet as pq

TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
#: Bytes a number costs once parsed (pandas holds float64 and int64).
CELL_BYTES = 8
#: Cells read to tell numeric from text columns (at most 1,000 rows).
SNIFF_CELLS = 1_000_000
_SCAN_CHUNK = 1 << 20


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


def first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def csv_header_columns(path: Path, stop_after: int) -> int:
    """Columns in the CSV's header line (quoted commas and line breaks are no separators), counted
    a chunk at a time; stops once more than ``stop_after`` are seen (then the count is a lower bound)."""
    count, quoted = 1, False
    with open(path, "rb") as f:
        while chunk := f.read(_SCAN_CHUNK):
            for i, part in enumerate(chunk.split(b'"')):
                if i:
                    quoted = not quoted
                if quoted:
                    continue
                end = part.find(b"\n")
                if end >= 0:
                    return count + part.count(b",", 0, end)
                count += part.count(b",")
            if count > stop_after:
                return count
    return count


def _parquet_file(path: Path, limits: DataLimits) -> pq.ParquetFile:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises many error types for a damaged file
        raise DataError(f"{path}: cannot read table ({first_line(exc)})") from exc
    md = pf.metadata
    limits.check_columns(md.num_columns, str(path))
    limits.check_rows(md.num_rows, str(path))
    return pf


def check_table(path: Path, limits: DataLimits) -> int:
    """The table's columns; refuses ``path`` when its declared columns (or a Parquet file's rows)
    pass ``limits``. Nothing but the CSV header or the Parquet metadata is read."""
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    if is_parquet(path):
        return int(_parquet_file(path, limits).metadata.num_columns)
    columns = csv_header_columns(path, limits.max_columns)
    limits.check_columns(columns, str(path), at_least=True)
    return columns


def sniff_schema(path: Path, limits: DataLimits) -> dict[str, bool]:
    """Column name → whether it is numeric: the Parquet schema, or the first CSV rows (at most
    :data:`SNIFF_CELLS` cells), after the columns passed ``limits``."""
    import pandas as pd

    columns = check_table(path, limits)
    try:
        if is_parquet(path):
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = pq.read_schema(path)
            return {
                f.name: pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type)
                for f in schema
            }
        with open(path, "rb") as raw:
            head = pd.read_csv(_CountingReader(raw, path, limits), nrows=max(1, min(1000, SNIFF_CELLS // columns)))
    except DataError:
        raise
    except Exception as exc:  # pyarrow and pandas raise many parser error types
        raise DataError(f"{path}: cannot read table ({first_line(exc)})") from exc
    return {str(c): bool(pd.api.types.is_numeric_dtype(head[c])) for c in head.columns}


def parquet_rows(path: Path) -> int | None:
    """Rows in a Parquet file from its metadata; None for CSV or an unreadable file."""
    if not is_parquet(path):
        return None
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except Exception:  # unreadable: the batch reader names the problem
        return None


class _CountingReader:
    """A binary file that refuses to hand pandas more than ``max_bytes`` between two batches (a line
    of megabytes in a file read in batches)."""

    def __init__(self, raw: IO[bytes], path: Path, limits: DataLimits) -> None:
        self.raw, self.path, self.limits = raw, path, limits
        self.since_batch = 0

    def read(self, n: int = -1) -> bytes:
        # checked before the read: a batch's text may pass the bound by one of pandas' reads (256 KiB)
        self.limits.check_bytes(self.since_batch, f"{self.path}: the text of one batch of rows")
        data = self.raw.read(n if n >= 0 else _SCAN_CHUNK)
        self.since_batch += len(data)
        return data

    def __iter__(self) -> Iterator[bytes]:  # pandas checks for it; reading goes through read()
        return iter(self.raw)


def frames(
    path: Path,
    columns: Sequence[str] | None,
    batch_rows: int,
    limits: DataLimits,
    *,
    whole: bool = False,
) -> Iterator[pd.DataFrame]:
    """The table's ``columns`` (all when None) in frames of at most ``batch_rows`` rows.

    Batches are cut so that one holds at most ``max_bytes`` as numbers; rows are counted against
    ``max_rows``. ``whole``: the caller keeps every row, so the whole table counts against
    ``max_bytes`` (a CSV's text too), checked before reading where the file declares it.
    """
    import pandas as pd

    if batch_rows < 1:
        raise DataError(f"batch size must be at least 1 row, got {batch_rows}")
    n_file = check_table(path, limits)
    try:
        if is_parquet(path):
            yield from _parquet_frames(path, columns, batch_rows, limits, whole)
            return
        n_cols = len(columns) if columns is not None else n_file
        step = limits.batch_rows(batch_rows, n_cols * CELL_BYTES)
        if whole:
            limits.check_bytes(path.stat().st_size, f"{path} (its text, read whole)")
        seen = 0
        with open(path, "rb") as raw:
            counted = _CountingReader(raw, path, limits)
            with pd.read_csv(counted, usecols=list(columns) if columns is not None else None, chunksize=step) as it:
                for df in it:
                    seen += len(df)
                    limits.check_rows(seen, str(path), at_least=True)
                    if whole:
                        limits.check_bytes(seen * n_cols * CELL_BYTES, f"{path} (its rows read whole)")
                    counted.since_batch = 0
                    yield df
    except DataError:
        raise
    except Exception as exc:  # pyarrow and pandas raise many parser error types
        raise DataError(f"{path}: cannot read table ({first_line(exc)})") from exc


def _parquet_frames(
    path: Path, columns: Sequence[str] | None, batch_rows: int, limits: DataLimits, whole: bool
) -> Iterator[pd.DataFrame]:
    pf = _parquet_file(path, limits)
    md = pf.metadata
    names = list(columns) if columns is not None else pf.schema_arrow.names
    wanted = set(names)
    n_cols = len(names)
    if whole:
        limits.check_bytes(md.num_rows * n_cols * CELL_BYTES, f"{path} ({md.num_rows} rows × {n_cols} columns)")
    for g in range(md.num_row_groups):
        group = md.row_group(g)
        stored = sum(
            group.column(c).total_uncompressed_size
            for c in range(group.num_columns)
            if group.column(c).path_in_schema.split(".")[0] in wanted
        )
        limits.check_bytes(stored, f"{path}: row group {g} (uncompressed)")
    step = limits.batch_rows(batch_rows, n_cols * CELL_BYTES)
    with pf:
        for rb in pf.iter_batches(batch_size=step, columns=names):
            yield rb.to_pandas()
