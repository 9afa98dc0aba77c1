"""``check`` over a data lake: the Parquet files of a directory (recursively) or of a glob, read row group by row
group (:func:`agent.data.table_files.frames`, at most ``batch_rows`` rows at once) into
:class:`~agent.offline.windowed.Windowed`, so memory holds one batch whatever the lake's size, and the report is
the one ``check`` gives over the files concatenated (the sums are additive)."""

from __future__ import annotations

import glob
from collections.abc import Iterator, Sequence
from pathlib import Path

from agent.data.frame_rows import FrameRows, frame_rows
from agent.data.limits import DataLimits
from agent.data.table_files import frames
from agent.errors import UserError

#: Rows of a row group turned into model inputs at once.
LAKE_BATCH_ROWS = 16384


def lake_files(where: str | Path) -> list[Path]:
    """The Parquet files of a directory (recursively, hidden files and ``_``-prefixed ones such as
    ``_SUCCESS`` left out, as Spark and Hive leave them) or of a glob, in sorted order."""
    p = Path(where)
    if p.is_dir():
        found = [f for f in p.rglob("*") if f.is_file() and not f.name.startswith((".", "_"))]
        found = [f for f in found if f.suffix.lower() in (".parquet", ".pq")]
    elif p.is_file():
        found = [p]
    else:
        found = [Path(f) for f in glob.glob(str(where), recursive=True) if Path(f).is_file()]
    if not found:
        raise UserError(f"{where}: no Parquet files (give a directory of .parquet files or a glob)")
    return sorted(found)


def lake_batches(
    files: Sequence[Path],
    inputs: Sequence[str],
    *,
    label_column: str | None = None,
    timestamp_column: str | None = None,
    metadata: Sequence[str] = (),
    batch_rows: int = LAKE_BATCH_ROWS,
    limits: DataLimits | None = None,
) -> Iterator[FrameRows]:
    """The rows of every file in order, a row group's batch at a time, as a model's inputs."""
    for path in files:
        for df in frames(path, None, batch_rows, limits or DataLimits()):
            yield frame_rows(
                df,
                inputs,
                label_column=label_column,
                timestamp_column=timestamp_column,
                metadata=metadata,
                where=str(path),
            )
