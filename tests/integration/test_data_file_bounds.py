"""Hostile data files given to the real CLI: small on disk, huge once read. Each is refused with one line
naming the limit and its flag, or its unused part is never decompressed, and the command's peak RSS
stays small (measured on the command's own process)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agent.data.arrays import ArrayFile
from agent.data.datasets import Splits
from agent.data.files import load_data
from agent.model.classifier import default_model_path
from bench.hostile.files import Measured, Zeros, run_measured, wide_csv, write_npz
from invariants.fitting import stratified_split

MODEL = str(default_model_path())
GIB = 1024**3
#: A refusal costs the interpreter, numpy, pandas and onnxruntime (about 170 MB measured), no data.
REFUSAL_PEAK = 500 * 10**6
#: The 4 GiB array of the archive is never decompressed: the command holds 200 images.
IGNORED_PEAK = 10**9


def one_line_error(r: Measured, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def check(bundle: Path, data: Path, *extra: str) -> list[str]:
    return ["check", "--model", MODEL, "--bundle", str(bundle), "--data", str(data), *extra]


def test_an_unused_array_inflating_to_4_gib_is_never_decompressed(
    tmp_path: Path, mnist_splits: Splits, mnist_bundle_dir: Path
) -> None:
    path = tmp_path / "bomb.npz"
    test = mnist_splits.test
    write_npz(path, {"x": test.x[:200], "y": test.y[:200], "pad": Zeros((4 * GIB,), "|u1")})
    assert path.stat().st_size < 8 * 10**6
    r = run_measured([*check(mnist_bundle_dir, path), "--json"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["n"] == 200
    assert r.peak_rss < IGNORED_PEAK, f"peak RSS {r.peak_mb:.0f} MB"


def test_a_metadata_array_inflating_to_4_gib_is_refused_before_decompression(
    tmp_path: Path, mnist_splits: Splits, mnist_bundle_dir: Path
) -> None:
    """The bundle's IDI rules read ``form``: 200 strings of 21 MB each declared, 4 GiB in all."""
    path = tmp_path / "form.npz"
    test = mnist_splits.test
    write_npz(path, {"x": test.x[:200], "y": test.y[:200], "form": Zeros((200,), f"|S{4 * GIB // 200}")})
    r = run_measured(check(mnist_bundle_dir, path), tmp_path)
    one_line_error(r, "array 'form'", "over the limit of 2.0 GiB", "--max-data-bytes")
    assert r.peak_rss < REFUSAL_PEAK, f"peak RSS {r.peak_mb:.0f} MB"


def test_a_million_samples_in_3_mb_are_refused_before_decompression(tmp_path: Path, mnist_bundle_dir: Path) -> None:
    path = tmp_path / "million.npz"
    write_npz(path, {"x": Zeros((10**6, 1, 28, 28)), "y": Zeros((10**6,), "<i8")})
    assert path.stat().st_size < 8 * 10**6
    r = run_measured(check(mnist_bundle_dir, path), tmp_path)
    one_line_error(r, "array 'x' (1000000x1x28x28 float32) needs 2.9 GiB", "--max-data-bytes")
    assert r.peak_rss < REFUSAL_PEAK, f"peak RSS {r.peak_mb:.0f} MB"
    r = run_measured([*check(mnist_bundle_dir, path), "--max-rows", "1000"], tmp_path)
    one_line_error(r, "1000000 rows, over the limit of 1000", "--max-rows")


def test_a_csv_with_two_million_columns_is_refused_from_its_header(tmp_path: Path, mnist_bundle_dir: Path) -> None:
    path = tmp_path / "wide.csv"
    wide_csv(path, 2_000_000)
    assert path.stat().st_size < 25 * 10**6
    fit = [
        "fit",
        "--reference",
        str(path),
        "--proba-columns",
        "c0",
        "--label-column",
        "c1",
        "--out",
        str(tmp_path / "b"),
    ]
    for args in (check(mnist_bundle_dir, path), fit):
        r = run_measured(args, tmp_path)
        one_line_error(r, "columns, over the limit of 100000", "--max-columns")
        assert r.peak_rss < REFUSAL_PEAK, f"{args[0]}: peak RSS {r.peak_mb:.0f} MB"


def test_a_parquet_file_is_bounded_from_its_metadata(tmp_path: Path, mnist_bundle_dir: Path) -> None:
    path = tmp_path / "t.parquet"
    pd.DataFrame(np.zeros((100, 784), np.float32), columns=[f"p{i}" for i in range(784)]).to_parquet(path)
    one_line_error(run_measured([*check(mnist_bundle_dir, path), "--max-columns", "500"], tmp_path), "--max-columns")
    one_line_error(run_measured([*check(mnist_bundle_dir, path), "--max-rows", "50"], tmp_path), "--max-rows")
    r = run_measured([*check(mnist_bundle_dir, path), "--max-data-bytes", "100KiB"], tmp_path)
    one_line_error(r, "100 rows × 784 columns", "--max-data-bytes")


def test_a_memory_mapped_npy_is_checked(tmp_path: Path, mnist_splits: Splits, mnist_bundle_dir: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, mnist_splits.test.x[:300])
    r = run_measured([*check(mnist_bundle_dir, path), "--json"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["n"] == 300 and "truth" not in report  # a .npy holds inputs only


def test_the_array_reader_reads_declarations_without_decompressing(tmp_path: Path) -> None:
    path = tmp_path / "bomb.npz"
    write_npz(path, {"x": np.ones((3, 2), np.float32), "input_ids": Zeros((2 * 10**6, 512), "<i8")})
    with ArrayFile(path) as arrays:
        info = arrays.info("input_ids")
        assert info.shape == (2 * 10**6, 512) and info.nbytes == 8 * 2 * 10**6 * 512
        with pytest.raises(Exception, match="needs 7.6 GiB"):
            arrays.read("input_ids")
        first = next(arrays.batches("input_ids", 1000))  # a batch is bounded, the array is not
        assert first.shape == (1000, 512) and not first.any()


def test_a_real_training_set_passes_the_default_limits(tmp_path: Path) -> None:
    """100,000 MNIST-sized float32 samples (314 MB once read) load under the defaults."""
    path = tmp_path / "train.npz"
    write_npz(path, {"x": Zeros((100_000, 784)), "y": Zeros((100_000,), "<i8")})
    data = load_data(path)
    assert data.x.shape == (100_000, 784) and data.y is not None and len(data.y) == 100_000


@pytest.mark.parametrize("split", ["train", "validation"])
def test_every_reference_row_is_checked_whatever_its_split(tmp_path: Path, split: str) -> None:
    """An infinite feature is refused in the rows that fit the TDIs and in those that fit the ADI."""
    rng = np.random.default_rng(0)
    n = 400
    y = rng.integers(0, 2, n)
    p1 = np.clip(0.7 * y + 0.15 + rng.normal(0, 0.1, n), 0.01, 0.99)
    df = pd.DataFrame({"a": rng.normal(size=n), "b": rng.normal(size=n), "proba": p1, "label": y})
    val_idx, train_idx = stratified_split(y, 0.5, 0)  # the split `fit --reference` makes (seed 0)
    row = int((train_idx if split == "train" else val_idx)[0])
    df.loc[row, "b"] = np.inf
    path = tmp_path / "ref.csv"
    df.to_csv(path, index=False)
    out = tmp_path / "bundle"
    args = ["fit", "--reference", str(path), "--proba-columns", "proba", "--label-column", "label", "--trees", "10"]
    r = run_measured([*args, "--out", str(out)], tmp_path)
    one_line_error(r, f"rows 1..{n}", "NaN or infinite values in feature column(s): b")
    assert not out.exists()
