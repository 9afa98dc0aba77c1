"""Data files read within limits: named arrays of .npz/.npy read on demand, declared sizes checked
before decompression, CSV columns counted in the header, Parquet checked from its metadata, and one
clear line naming the limit and the flag (or setting) that raises it."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agent.audits.config import AuditsConfig
from agent.data.arrays import MAX_ENTRIES, ArrayFile
from agent.data.files import load_data
from agent.data.limits import DataError, DataLimitError, DataLimits, format_size, parse_size
from agent.data.table_files import csv_header_columns, frames, sniff_schema


def test_sizes_parse_in_both_unit_systems() -> None:
    assert parse_size("2GiB") == 2 * 1024**3
    assert parse_size("512MB") == 512 * 1000**2
    assert parse_size("1048576") == 1 << 20
    assert parse_size("1.5 kib") == 1536
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")
    assert format_size(3 * 1024**3) == "3.0 GiB"


def test_defaults_admit_a_real_training_set() -> None:
    """100,000 × 784 float32 (MNIST-sized): as arrays, and as a table of float64 read whole."""
    limits = DataLimits()
    limits.check_bytes(100_000 * 784 * 4, "arrays")
    limits.check_bytes(100_000 * 784 * 8, "table")
    limits.check_rows(100_000, "rows")
    limits.check_columns(784, "columns")


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(DataError, match="--max-rows must be at least 1"):
        DataLimits(max_rows=0)


# -- arrays ---------------------------------------------------------------------------------------------
def test_npz_arrays_are_read_by_name_and_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    np.savez_compressed(path, x=x, y=np.arange(20) % 2, input_ids=np.ones((20, 7), np.int64))
    with ArrayFile(path) as arrays:
        assert arrays.names == ["x", "y", "input_ids"]
        info = arrays.info("input_ids")
        assert info.shape == (20, 7) and info.dtype == np.int64 and info.nbytes == 20 * 7 * 8
        assert np.array_equal(arrays.read("x"), x)
        batches = list(arrays.batches("input_ids", 6))
        assert [len(b) for b in batches] == [6, 6, 6, 2]
        assert np.array_equal(np.concatenate(batches), np.ones((20, 7), np.int64))
        with pytest.raises(DataError, match="no array named 'attention_mask'"):
            arrays.info("attention_mask")


def test_npy_is_memory_mapped_and_read_in_batches(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    x = np.arange(1000, dtype=np.float32).reshape(100, 10)
    np.save(path, x)
    with ArrayFile(path) as arrays:
        whole = arrays.read("x")
        assert isinstance(whole, np.memmap) and np.array_equal(whole, x)
    with ArrayFile(path, DataLimits(max_bytes=400)) as arrays:  # 10 rows of 40 bytes per batch
        batches = list(arrays.batches("x", 64))
    assert [len(b) for b in batches] == [10] * 10
    assert np.array_equal(np.concatenate(batches), x)
    data = load_data(path)
    assert data.y is None and data.x.shape == (100, 10)


def test_declared_sizes_are_checked_over_every_array_read(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((100, 10), np.float32), y=np.zeros(100, np.int64))
    limits = DataLimits(max_bytes=4500)
    with ArrayFile(path, limits) as arrays:
        arrays.read("x")  # 4,000 bytes
        with pytest.raises(DataLimitError) as info:
            arrays.read("y")  # 800 more
    message = str(info.value)
    assert "'y'" in message and "with the 4000 bytes read before it" in message
    assert "--max-data-bytes" in message and "\n" not in message


def test_rows_are_bounded_for_whole_and_batched_reads(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((50, 2), np.float32))
    limits = DataLimits(max_rows=10)
    with ArrayFile(path, limits) as arrays, pytest.raises(DataLimitError, match="50 rows.*--max-rows"):
        arrays.read("x")
    with ArrayFile(path, limits) as arrays, pytest.raises(DataLimitError, match="--max-rows"):
        next(arrays.batches("x", 5))


def test_object_arrays_and_other_zip_methods_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "obj.npz"
    with zipfile.ZipFile(path, "w") as zf:
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        zf.writestr("x.npy", buf.getvalue())
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.zeros((3, 2), np.float32))
        zf.writestr("y.npy", buf.getvalue(), compress_type=zipfile.ZIP_BZIP2)
    with ArrayFile(path) as arrays:
        with pytest.raises(DataError, match="object arrays would need pickle"):
            arrays.info("x")
        with pytest.raises(DataError, match="zip method 12"):
            arrays.info("y")


def test_an_entry_whose_size_disagrees_with_its_header_is_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10**9, 784)})
    path = tmp_path / "liar.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", buf.getvalue() + bytes(64))
    with ArrayFile(path) as arrays, pytest.raises(DataError, match="declares 3136000000000 bytes"):
        arrays.info("x")


def test_too_many_entries_are_refused_before_the_directory_is_read(tmp_path: Path) -> None:
    path = tmp_path / "many.npz"
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(MAX_ENTRIES + 1):
            zf.writestr(f"a{i}.npy", b"")
    with pytest.raises(DataError, match=f"at most {MAX_ENTRIES} arrays"):
        ArrayFile(path)


def test_load_data_reads_named_metadata_only(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((4, 2)), y=np.arange(4), form=np.array(list("abab")), other=np.arange(4))
    data = load_data(path, metadata=["form"])
    assert list(data.metadata) == ["form"]
    with pytest.raises(DataError, match="metadata array\\(s\\) not found: nope"):
        load_data(path, metadata=["nope"])
    assert load_data(path, metadata=["nope"], require_metadata=False).metadata == {}


# -- tables ---------------------------------------------------------------------------------------------
def test_csv_header_columns_skip_quoted_commas_and_line_breaks(tmp_path: Path) -> None:
    path = tmp_path / "q.csv"
    path.write_bytes(b'a,"b,c","d\ne",f\r\n1,2,3,4\n')
    assert csv_header_columns(path, 100) == 4
    assert list(pd.read_csv(path).columns) == ["a", "b,c", "d\ne", "f"]
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{i}" for i in range(300_000)) + "\n")
    assert 10 < csv_header_columns(wide, 10) < 300_000  # stops after the first chunk past the bound


def test_table_limits_name_their_flags(tmp_path: Path) -> None:
    df = pd.DataFrame(np.zeros((50, 20)), columns=[f"f{i}" for i in range(20)])
    csv, parquet = tmp_path / "t.csv", tmp_path / "t.parquet"
    df.to_csv(csv, index=False)
    df.to_parquet(parquet)
    for path in (csv, parquet):
        with pytest.raises(DataLimitError, match="20 columns, over the limit of 10 \\(raise it with --max-columns\\)"):
            sniff_schema(path, DataLimits(max_columns=10))
        with pytest.raises(DataLimitError, match="--max-rows"):
            list(frames(path, None, 8, DataLimits(max_rows=20)))
        with pytest.raises(DataLimitError, match="--max-data-bytes"):
            list(frames(path, None, 8, DataLimits(max_bytes=2000), whole=True))
        # read in batches, the same bound cuts each batch to fit instead: 12 rows of 20 × 8 bytes
        sizes = [len(f) for f in frames(path, None, 1000, DataLimits(max_bytes=2000))]
        assert sum(sizes) == 50 and max(sizes) <= 12


def test_load_table_reads_whole_within_limits(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    pd.DataFrame({"a": range(200), "b": np.arange(200) * 0.5, "label": np.arange(200) % 3}).to_csv(path, index=False)
    data = load_data(path, label_column="label")
    assert data.x.shape == (200, 2) and data.feature_names == ["a", "b"] and data.y is not None
    with pytest.raises(DataLimitError, match="--max-data-bytes"):
        load_data(path, label_column="label", limits=DataLimits(max_bytes=1000))


def test_the_served_agent_names_its_settings() -> None:
    limits = AuditsConfig().data_limits.limits()
    with pytest.raises(DataLimitError, match="raise it with audits.data_limits.max_bytes"):
        limits.check_bytes(limits.max_bytes + 1, "reference.npz")
    assert AuditsConfig(data_limits={"max_rows": 5}).data_limits.limits().max_rows == 5
