"""``icos_agent.spark.estimate`` on a real Spark (``local[2]``, the ``spark`` extra): partitions judged through
``mapInArrow``, their tallies grouped by window and summed, give ``Bundle.estimate``'s estimates over the same rows,
every estimate, interval, flag and segment to 1e-9."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import icos_agent
from agent.errors import UserError
from tests.support.digits import digits
from tests.support.estimates import assert_same_estimates

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    if shutil.which("java") is None:
        pytest.skip("Spark's local mode needs Java 17: make system-tools as root installs openjdk-17-jre-headless")
    from pyspark.sql import SparkSession

    # the executors' Python workers run this interpreter (the one with the agent's packages, not the first
    # python3 on the PATH) and import icos_agent from the repository, as an installed package would be
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("icos-agent-test")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.bindAddress", "127.0.0.1")
        # the address the driver's block manager advertises too: a task result over the direct-result size is
        # fetched from it, and only loopback is reachable (the host's own address is refused here)
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    yield session
    session.stop()


def test_spark_estimates_are_the_in_process_estimates(spark: Any, digits_logreg: dict[str, Path]) -> None:
    from icos_agent.spark import estimate

    x, y = digits()
    frame = pd.DataFrame(x[1400:1797], columns=[f"px{i}" for i in range(64)]).assign(label=y[1400:1797])
    frame["ts"] = pd.Timestamp("2026-02-01", tz="UTC") + pd.to_timedelta(np.arange(len(frame)) * 45, unit="s")
    bundle = icos_agent.load(digits_logreg["bundle"], model=digits_logreg["model"])
    whole = bundle.estimate(frame, timestamp="ts", window="1h", labels="label", progress=False)
    shuffled = frame.sample(frac=1.0, random_state=3)
    sdf = spark.createDataFrame(shuffled).repartition(7)
    assert sdf.rdd.getNumPartitions() == 7
    on_spark = estimate(sdf, bundle, timestamp="ts", window="1 hour", labels="label")
    assert on_spark.to_df()["n"].tolist() == [80, 80, 80, 80, 77]
    assert_same_estimates(whole, on_spark)
    one = estimate(sdf, bundle, timestamp="ts", window=None, labels="label")
    assert_same_estimates(bundle.estimate(frame.drop(columns=["ts"]), labels="label", progress=False), one)
    with pytest.raises(UserError, match="no row order"):
        estimate(sdf, bundle, window=100)  # type: ignore[arg-type]


def test_spark_estimates_logged_predictions_of_a_reference_bundle(spark: Any, tmp_path: Path) -> None:
    """A bundle fitted from logged predictions (no model): the executors read the logged rows' features and
    probabilities as ``Bundle.estimate`` reads them, and the estimates are the same."""
    from icos_agent.spark import estimate
    from invariants.fit_params import CalibrationPlan

    def logged(n: int, seed: int, shift: float = 0.0) -> pd.DataFrame:
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(n, 3)) + shift
        p1 = 1.0 / (1.0 + np.exp(-(1.5 * x[:, 0] - x[:, 1])))
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(1.5 * x[:, 0] - x[:, 1] + 0.8 * x[:, 2])))).astype(int)
        frame = pd.DataFrame(x, columns=["a", "b", "c"]).assign(p1=p1.round(4), label=y)
        frame["ts"] = pd.Timestamp("2026-04-01", tz="UTC") + pd.to_timedelta(np.arange(n) * 7, unit="s")
        return frame

    plan = CalibrationPlan(shift_windows=300, clean_windows=40, windows_per_kind=3, bootstrap=20, min_fold_rows=20)
    reference = logged(1500, 1).drop(columns=["ts"])
    fitted = icos_agent.fit_reference(reference, label_column="label", proba_columns=["p1"], trees=10, plan=plan)
    unsaved = icos_agent.fit_reference(reference, label_column="label", proba_columns=["p1"], trees=10, plan=plan)
    fitted.save(tmp_path / "bundle")
    bundle = icos_agent.load(tmp_path / "bundle")
    assert bundle.model is None
    live = logged(2000, 2, shift=0.4)
    whole = bundle.estimate(live, timestamp="ts", window="1h", labels="label", progress=False)
    sdf = spark.createDataFrame(live.sample(frac=1.0, random_state=5)).repartition(7)
    on_spark = estimate(sdf, bundle, timestamp="ts", window="1 hour", labels="label")
    assert on_spark.to_df()["n"].sum() == 2000
    assert_same_estimates(whole, on_spark)
    with pytest.raises(UserError, match="save it first"):
        estimate(sdf, unsaved, timestamp="ts", window="1 hour")
