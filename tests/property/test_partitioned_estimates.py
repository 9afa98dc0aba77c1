"""The equality guarantee of ``icos_agent`` (docs/python.md): the estimates over partitions of the data, in any order
of rows, equal the estimates over the data in one piece — every estimate, interval, flag and segment, to 1e-9 —
because each window adds up additive statistics. Checked for 1, 7 and 64 partitions, handed over as an iterator of
batches and as a directory of Parquet files (``estimate-lake``'s reading), on a table model (a logistic regression
of six numeric columns) and on an image model (the shipped MNIST CNN)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import icos_agent
from agent.data.datasets import Splits
from agent.model.classifier import default_model_path
from invariants.fit_params import CalibrationPlan
from tests.support.estimates import FLOAT32_INPUTS_TOLERANCE, assert_same_estimates

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
def table_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[icos_agent.Bundle, pd.DataFrame]:
    """A logistic regression of six numeric columns exported by skl2onnx, fitted through ``icos_agent.fit`` with a
    small calibration plan (as tests/unit/test_fit_stages.py fits one), and rows of its columns, labels and times."""
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    root = tmp_path_factory.mktemp("table-model")
    x, y = make_classification(n_samples=1200, n_features=6, n_informative=4, flip_y=0.1, random_state=3)
    x = x.astype(np.float32)
    clf = LogisticRegression().fit(x[:400], y[:400])
    onnx = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    (root / "table.onnx").write_bytes(onnx.SerializeToString())
    columns = [f"c{i}" for i in range(6)]
    frame = pd.DataFrame(x, columns=columns).assign(label=y)
    plan = CalibrationPlan(shift_windows=300, clean_windows=40, windows_per_kind=3, bootstrap=20, min_fold_rows=20)
    bundle = icos_agent.fit(
        root / "table.onnx", (frame.iloc[:400], "label"), (frame.iloc[400:800], "label"), trees=10, plan=plan
    )
    live = frame.iloc[800 : 800 + ROWS].reset_index(drop=True)
    live["ts"] = _timestamps(len(live))
    return bundle, live


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
@given(seed=st.integers(0, 2**16), window=st.sampled_from(["1h", None]), batch_rows=st.sampled_from([1, 5, 64]))
@example(seed=0, window="1h", batch_rows=1)  # every row judged alone (onnxruntime's one-row kernel)
def test_a_table_models_estimates_over_partitions_equal_the_whole(
    table_case: tuple[icos_agent.Bundle, pd.DataFrame],
    tmp_path: Path,
    partitions: int,
    seed: int,
    window: str | None,
    batch_rows: int,
) -> None:
    bundle, frame = table_case
    ts = "ts" if window else None
    whole = bundle.estimate(frame.drop(columns=[] if ts else ["ts"]), timestamp=ts, window=window, labels="label")
    pieces = [frame.iloc[idx] for idx in _split(len(frame), partitions, seed)]
    if not ts:
        pieces = [p.drop(columns=["ts"]) for p in pieces]
    assert_same_estimates(
        whole, bundle.estimate(iter(pieces), timestamp=ts, window=window, labels="label", progress=False)
    )
    lake = Path(tempfile.mkdtemp(prefix="lake-", dir=tmp_path))  # one per example: tmp_path is the test's
    for i, piece in enumerate(pieces):
        piece.to_parquet(lake / f"part-{i:03d}.parquet", index=False)
    assert_same_estimates(whole, bundle.estimate(lake, timestamp=ts, window=window, labels="label", progress=False))


@pytest.mark.parametrize("partitions", [1, 7, 64])
@PARTITIONS
@given(seed=st.integers(0, 2**16), batch_rows=st.sampled_from([1, 5, 64]))
@example(seed=0, batch_rows=1)
def test_an_image_models_estimates_over_partitions_equal_the_whole(
    mnist_case: tuple[icos_agent.Bundle, dict[str, Any]], partitions: int, seed: int, batch_rows: int
) -> None:
    bundle, data = mnist_case
    whole = bundle.estimate(data["x"], timestamp=data["ts"], window="1h", labels=data["y"], progress=False)
    batches = ((data["x"][i], data["y"][i], data["ts"][i]) for i in _split(ROWS, partitions, seed))
    parts = bundle.estimate(batches, window="1h", batch_rows=batch_rows, progress=False)
    assert_same_estimates(whole, parts, FLOAT32_INPUTS_TOLERANCE)


def test_a_row_judged_alone_is_judged_as_in_a_batch(table_case: tuple[icos_agent.Bundle, pd.DataFrame]) -> None:
    """The mechanism behind batches of one row: onnxruntime's one-row kernel differs in the last bits for this
    model, and a row judged alone is judged as two copies of it, so it matches the same row in a batch exactly."""
    from agent.data.frame_rows import FrameRows
    from agent.offline.windowed import judge_rows

    bundle, frame = table_case
    x = frame.drop(columns=["label", "ts"]).to_numpy(np.float32)
    alone = np.concatenate([bundle.model.predict(x[i : i + 1]).probabilities for i in range(len(x))])
    batch = judge_rows(bundle.model, bundle.invariants, FrameRows(x))
    assert np.abs(alone - batch.prediction.probabilities).max() > 0  # the kernels differ for this model
    for i in range(len(x)):
        one = judge_rows(bundle.model, bundle.invariants, FrameRows(x[i : i + 1]))
        assert np.array_equal(one.prediction.probabilities[0], batch.prediction.probabilities[i]), i
        assert one.result.verdict[0] == batch.result.verdict[i] and one.tdi_rules is not None
        assert batch.features is not None and one.features is not None
        assert np.array_equal(one.features[0], batch.features[i]), i
