"""What reading a lake costs once per batch or once per partition: a column of zoned datetimes converted whole
(not a Timestamp per row) into the nanoseconds every other form of timestamp gives, and the bundle an executor's
Python worker loads once and reuses until its files change."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agent.data.frame_rows import frame_rows, timestamps_ns
from agent.data.limits import DataError
from icos_agent import spark

SECONDS = np.array([1_767_225_600, 1_767_225_601, 1_767_229_200], dtype=np.int64)
EXPECTED = SECONDS * 1_000_000_000


@pytest.mark.parametrize(
    "column",
    [
        pd.Series(pd.to_datetime(SECONDS, unit="s", utc=True)),
        pd.Series(pd.to_datetime(SECONDS, unit="s", utc=True)).dt.tz_convert("Europe/Paris"),
        pd.Series(pd.to_datetime(SECONDS, unit="s")),  # naive: read as UTC
        pd.Series(pd.to_datetime(SECONDS, unit="s", utc=True).as_unit("us")),  # as Arrow hands microseconds
        pd.Series(SECONDS),
        pd.Series([str(t) for t in pd.to_datetime(SECONDS, unit="s", utc=True)]),
    ],
    ids=["utc", "paris", "naive", "microseconds", "epoch-seconds", "strings"],
)
def test_a_timestamp_column_gives_nanoseconds_since_the_epoch_in_utc(column: pd.Series) -> None:
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "ts": column})
    assert frame_rows(frame, ["x"], timestamp_column="ts").timestamps.tolist() == EXPECTED.tolist()  # type: ignore[union-attr]
    assert timestamps_ns(column, "ts").tolist() == EXPECTED.tolist()


def test_a_missing_datetime_is_refused() -> None:
    column = pd.Series(pd.to_datetime([SECONDS[0], None], unit="s", utc=True))
    with pytest.raises(DataError, match="a timestamp is missing"):
        timestamps_ns(column, "ts")


def test_a_worker_loads_the_bundle_once_until_its_files_change(digits_logreg: dict[str, Path], tmp_path: Path) -> None:
    bundle_dir = tmp_path / "bundle"
    shutil.copytree(digits_logreg["bundle"], bundle_dir)
    model = str(digits_logreg["model"])
    first = spark._loaded(str(bundle_dir), model)
    assert spark._loaded(str(bundle_dir), model) is first
    manifest = bundle_dir / "manifest.json"
    later = manifest.stat().st_mtime_ns + 1_000_000_000
    os.utime(manifest, ns=(later, later))  # rewritten in place: loaded again
    again = spark._loaded(str(bundle_dir), model)
    assert again is not first
    assert spark._loaded(str(bundle_dir), model) is again
    assert len(spark._LOADED) == 1
