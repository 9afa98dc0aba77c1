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
