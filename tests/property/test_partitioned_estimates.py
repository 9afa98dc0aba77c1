"""The equality guarantee of ``icos_agent`` (docs/python.md): the estimates over partitions of the data, in any order
of rows, equal the estimates over the data in one piece — every estimate, interval, flag and segment, to 1e-9 —
because each window adds up additive statistics. Checked for 1, 7 and 64 partitions, handed over as an iterator of
batches and as a directory of Parquet files (``estimate-lake``'s reading), on a table model (a logistic regression
of scikit-learn's digits) and on an image model (the shipped MNIST CNN)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import icos_agent
from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from tests.support.digits import digits
from tests.support.estimates import assert_same_estimates

ROWS = 240
START = pd.Timestamp("2026-03-01", tz="UTC")

PARTITIONS = settings(
    max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _split(n: int, partitions: int, seed: int) -> list[np.ndarray]:
    """The rows shuffled by ``seed`` and cut into ``partitions`` parts of random sizes (some may be empty)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    cuts = np.sort(rng.integers(0, n + 1, size=partitions - 1))
    return np.split(order, cuts)


def _timestamps(n: int) -> pd.Series:
    """Rows over six hours, so that hourly windows hold rows of every partition."""
    return pd.Series(START + pd.to_timedelta(np.linspace(0, 6 * 3600 - 1, n).astype(np.int64), unit="s"))


@pytest.fixture(scope="module")
def digits_case(digits_logreg: dict[str, Path]) -> tuple[icos_agent.Bundle, pd.DataFrame]:
    x, y = digits()
    frame = pd.DataFrame(x[1400 : 1400 + ROWS], columns=[f"px{i}" for i in range(64)])
    frame["label"] = y[1400 : 1400 + ROWS]
    frame["ts"] = _timestamps(len(frame))
    return icos_agent.load(digits_logreg["bundle"], model=digits_logreg["model"]), frame


@pytest.fixture(scope="module")
def mnist_case(mnist_bundle_dir: Path, mnist_splits: Splits) -> tuple[icos_agent.Bundle, dict[str, Any]]:
    x, y = mnist_splits.test.x[:ROWS], mnist_splits.test.y[:ROWS]
    # the second half darkened: a drop for the estimates to follow, with segments that carry it
    x = x.copy()
    x[ROWS // 2 :] *= 0.5
    data = {"x": x, "y": y, "ts": _timestamps(ROWS).to_numpy()}
    return icos_agent.load(mnist_bundle_dir, model=default_model_path()), data


@pytest.mark.parametrize("partitions", [1, 7, 64])
@PARTITIONS
@given(seed=st.integers(0, 2**16), window=st.sampled_from(["1h", None]))
def test_a_table_models_estimates_over_partitions_equal_the_whole(
    digits_case: tuple[icos_agent.Bundle, pd.DataFrame], tmp_path: Path, partitions: int, seed: int, window: str | None
) -> None:
    bundle, frame = digits_case
    ts = "ts" if window else None
    whole = bundle.estimate(frame.drop(columns=[] if ts else ["ts"]), timestamp=ts, window=window, labels="label")
    pieces = [frame.iloc[idx] for idx in _split(len(frame), partitions, seed)]
    if not ts:
        pieces = [p.drop(columns=["ts"]) for p in pieces]
    assert_same_estimates(
        whole, bundle.estimate(iter(pieces), timestamp=ts, window=window, labels="label", progress=False)
    )
    lake = tmp_path / f"lake-{partitions}-{seed}-{window}"
    lake.mkdir()
    for i, piece in enumerate(pieces):
        piece.to_parquet(lake / f"part-{i:03d}.parquet", index=False)
    assert_same_estimates(whole, bundle.estimate(lake, timestamp=ts, window=window, labels="label", progress=False))


@pytest.mark.parametrize("partitions", [1, 7, 64])
@PARTITIONS
@given(seed=st.integers(0, 2**16))
def test_an_image_models_estimates_over_partitions_equal_the_whole(
    mnist_case: tuple[icos_agent.Bundle, dict[str, Any]], partitions: int, seed: int
) -> None:
    bundle, data = mnist_case
    whole = bundle.estimate(data["x"], timestamp=data["ts"], window="1h", labels=data["y"], progress=False)
    batches = ((data["x"][i], data["y"][i], data["ts"][i]) for i in _split(ROWS, partitions, seed))
    assert_same_estimates(whole, bundle.estimate(batches, window="1h", progress=False))
