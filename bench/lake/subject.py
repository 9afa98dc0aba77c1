"""The subject of the lake benchmark: a table model (a logistic regression of eight numeric columns, exported by
skl2onnx), its bundle fitted through :func:`icos_agent.fit`, and logged rows of its columns with a timestamp,
generated and written as Parquet a chunk at a time, so that memory stays bounded whatever the row count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

import icos_agent

COLUMNS = [f"c{i}" for i in range(8)]
#: The first logged row's time; rows follow each other by :data:`STEP_MS` milliseconds.
START = pd.Timestamp("2026-03-01", tz="UTC")
STEP_MS = 10
#: Rows generated (and written) at once.
CHUNK_ROWS = 500_000
#: Rows per Parquet row group.
ROW_GROUP_ROWS = 100_000
#: Rows per Parquet file.
FILE_ROWS = 2_000_000


def rows(start: int, n: int, seed: int = 0) -> pd.DataFrame:
    """Rows ``start`` .. ``start + n`` of the logged stream: two classes with shifted means, a label and a
    timestamp; the same rows for the same arguments, whatever the chunking."""
    rng = np.random.default_rng([seed, start])
    y = rng.integers(0, 2, size=n)
    x = rng.normal(size=(n, len(COLUMNS))).astype(np.float32)
    x[:, :4] += (y[:, None] * 1.2).astype(np.float32)
    frame = pd.DataFrame(x, columns=COLUMNS)
    frame["label"] = y
    frame["ts"] = START + pd.to_timedelta((start + np.arange(n, dtype=np.int64)) * STEP_MS, unit="ms")
    return frame


def fit_subject(root: Path) -> icos_agent.Bundle:
    """The model exported to ``root/table.onnx`` and its bundle fitted and saved in ``root/bundle``."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    from invariants.fit_params import CalibrationPlan

    root.mkdir(parents=True, exist_ok=True)
    data = rows(0, 3000, seed=1)
    x = data[COLUMNS].to_numpy()
    clf = LogisticRegression().fit(x[:1000], data["label"][:1000])
    onnx = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    (root / "table.onnx").write_bytes(onnx.SerializeToString())
    frame = data.drop(columns=["ts"])
    plan = CalibrationPlan(shift_windows=300, clean_windows=40, windows_per_kind=3, bootstrap=20, min_fold_rows=20)
    bundle = icos_agent.fit(
        root / "table.onnx",
        (frame.iloc[1000:2000], "label"),
        (frame.iloc[2000:3000], "label"),
        trees=20,
        plan=plan,
        progress=False,
    )
    bundle.save(root / "bundle")
    return bundle


def write_lake(where: Path, n: int, *, labels: bool = False) -> list[Path]:
    """``n`` logged rows as Parquet files of at most :data:`FILE_ROWS` rows under ``where``, written
    :data:`CHUNK_ROWS` rows at a time (row groups of :data:`ROW_GROUP_ROWS`); the label column only with
    ``labels``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    writer: pq.ParquetWriter | None = None
    in_file = 0
    for start in range(0, n, CHUNK_ROWS):
        chunk = rows(start, min(CHUNK_ROWS, n - start))
        if not labels:
            chunk = chunk.drop(columns=["label"])
        table = pa.Table.from_pandas(chunk, preserve_index=False)
        if writer is None or in_file >= FILE_ROWS:
            if writer is not None:
                writer.close()
            files.append(where / f"part-{len(files):05d}.parquet")
            writer, in_file = pq.ParquetWriter(files[-1], table.schema), 0
        writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        in_file += len(chunk)
    if writer is not None:
        writer.close()
    return files
