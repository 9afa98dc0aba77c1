"""Spark ``local[2]`` over a Parquet lake (:func:`icos_agent.spark.estimate`) against the same rows estimated
in-process (:meth:`icos_agent.Bundle.estimate` over the same directory), with the same bundle.

The session is started, and one Spark run made (its Python workers start and import the agent), before anything
is timed: the figures compare steady throughput, and the start-up and the first run are reported apart. Spark and
in-process runs alternate, so that a neighbour's load on the machine falls on both alike."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import icos_agent

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-9


@dataclass(frozen=True)
class SparkRun:
    """The timings of one comparison (seconds) and whether the estimates agree."""

    rows: int
    partitions: int
    session_start: float
    first_spark: float
    spark: list[float]
    in_process: list[float]
    equal: bool

    @property
    def spark_rows_per_second(self) -> float:
        return self.rows / statistics.median(self.spark)

    @property
    def in_process_rows_per_second(self) -> float:
        return self.rows / statistics.median(self.in_process)

    @property
    def ratio(self) -> float:
        """Spark's rows per second over in-process's (medians of the timed runs)."""
        return self.spark_rows_per_second / self.in_process_rows_per_second

    @property
    def first_ratio(self) -> float:
        """The same with Spark's first run (its workers starting) in place of its median."""
        return (self.rows / self.first_spark) / self.in_process_rows_per_second


@contextmanager
def session(cores: int = 2) -> Iterator[Any]:
    """A Spark session in local mode whose Python workers run this interpreter and import this checkout."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("icos-agent-bench-lake")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(cores * 2))
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")  # where the block manager serves task results over the direct size
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


def same(a: icos_agent.Estimates, b: icos_agent.Estimates) -> bool:
    """The equality guarantee (docs/python.md): the same windows, every number within 1e-9."""
    x, y = a.to_df(), b.to_df()
    if list(x.columns) != list(y.columns) or len(x) != len(y) or len(x) == 0:
        return False
    for col in x.columns:
        if pd.api.types.is_float_dtype(x[col]) or pd.api.types.is_float_dtype(y[col]):
            u, v = x[col].astype(float).to_numpy(), y[col].astype(float).to_numpy()
            if not np.array_equal(np.isnan(u), np.isnan(v)):
                return False
            if np.nanmax(np.abs(np.nan_to_num(u) - np.nan_to_num(v)), initial=0.0) > TOLERANCE:
                return False
        elif x[col].tolist() != y[col].tolist():
            return False
    return True


def compare(bundle: icos_agent.Bundle, lake: Path, rows: int, repeats: int) -> SparkRun:
    """Start the session, warm it with one run, then time ``repeats`` Spark and in-process runs, alternating."""
    from icos_agent.spark import estimate

    t0 = time.perf_counter()
    with session() as spark:
        session_start = time.perf_counter() - t0

        def on_spark() -> tuple[float, icos_agent.Estimates, int]:
            t = time.perf_counter()
            frame = spark.read.parquet(str(lake))
            est = estimate(frame, bundle, timestamp="ts", window="1 hour")
            return time.perf_counter() - t, est, frame.rdd.getNumPartitions()

        def in_process() -> tuple[float, icos_agent.Estimates]:
            t = time.perf_counter()
            est = bundle.estimate(lake, timestamp="ts", window="1h", progress=False)
            return time.perf_counter() - t, est

        first, spark_est, partitions = on_spark()
        spark_times: list[float] = []
        local_times: list[float] = []
        equal = True
        for _ in range(repeats):
            seconds, local_est = in_process()
            local_times.append(seconds)
            seconds, spark_est, _parts = on_spark()
            spark_times.append(seconds)
            equal = equal and same(local_est, spark_est)
    return SparkRun(rows, partitions, session_start, first, spark_times, local_times, equal)
