"""Throughput and memory of estimates over a data lake (docs/python.md).

    python -m bench.lake [--rows 10000000] [--spark-rows 1000000] [--repeats 3] [--out docs/python.md]

The subject (:mod:`bench.lake.subject`): a logistic regression of eight numeric columns exported by skl2onnx, its
bundle fitted through :func:`icos_agent.fit`, and generated logged rows (the columns and a timestamp, 10 ms apart)
written as Parquet a chunk at a time.

- Spark ``local[2]`` over a Parquet lake of ``--spark-rows`` rows (:func:`icos_agent.spark.estimate`) against
  :meth:`icos_agent.Bundle.estimate` over the same directory, same bundle, hourly windows: rows per second of
  each and their ratio (target: Spark at least ``0.8`` of in-process), and whether the estimates are equal to
  1e-9. The session's start-up and Spark's first run are excluded from the timed part (:mod:`bench.lake.spark_run`)
  and reported apart.
- ``icos-agent estimate-lake`` over ``--rows`` logged rows, as a child process: its peak RSS (target: at most
  1 GB) and rows per second (:mod:`bench.lake.rss`).

``--out`` rewrites the page's generated block with the figures and the command. A test runs it with few rows;
the figures of the page are for the defaults.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.generated_docs import provenance, write_block
from bench.lake.rss import LakeRun, run_lake
from bench.lake.spark_run import SparkRun, compare
from bench.lake.subject import COLUMNS, ROW_GROUP_ROWS, fit_subject, write_lake

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python -m bench.lake"
BEGIN = f"<!-- BEGIN GENERATED: {COMMAND} --out docs/python.md -->"
DEFAULT_ROWS = 10_000_000
DEFAULT_SPARK_ROWS = 1_000_000
DEFAULT_REPEATS = 3
RATIO_TARGET = 0.8
RSS_TARGET = 1_000_000_000
#: estimate-lake's time limit, seconds per million rows (a bound on the loop, not a figure)
SECONDS_PER_MILLION = 120.0


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def lines(spark: SparkRun, lake: LakeRun) -> list[str]:
    """The figures, one line each (printed, and the body of the generated block)."""
    return [
        f"Spark `local[2]` against in-process `Bundle.estimate`, {spark.rows:,} rows of {len(COLUMNS)} numeric "
        f"columns in Parquet ({spark.partitions} partitions), hourly windows, the same bundle:",
        "",
        "| | rows/s | timed runs (s) |",
        "|---|---|---|",
        f"| in-process `Bundle.estimate` | {spark.in_process_rows_per_second:,.0f} | "
        f"{', '.join(f'{s:.2f}' for s in spark.in_process)} |",
        f"| Spark `local[2]` (`icos_agent.spark.estimate`) | {spark.spark_rows_per_second:,.0f} | "
        f"{', '.join(f'{s:.2f}' for s in spark.spark)} |",
        "",
        f"- Spark / in-process: **{spark.ratio:.2f}** (medians; target at least {RATIO_TARGET}): "
        f"**{_verdict(spark.ratio >= RATIO_TARGET)}**",
        f"- not timed: the session's start-up ({spark.session_start:.1f} s) and Spark's first run "
        f"({spark.first_spark:.1f} s, its Python workers starting and importing the agent); counting that first "
        f"run instead, the ratio would be {spark.first_ratio:.2f}",
        f"- estimates equal to 1e-9 in every timed run: **{'yes' if spark.equal else 'NO'}**",
        "",
        f"`icos-agent estimate-lake` over {lake.rows:,} logged rows ({lake.files} Parquet "
        f"file{'' if lake.files == 1 else 's'}, row groups of "
        f"{ROW_GROUP_ROWS:,} rows, `--timestamp ts --window 1h`), as a child process:",
        "",
        f"- peak RSS **{lake.peak_rss / 1e6:,.0f} MB** (target at most {RSS_TARGET / 1e9:.0f} GB): "
        f"**{_verdict(lake.peak_rss <= RSS_TARGET)}**",
        f"- {lake.rows_per_second:,.0f} rows/s ({lake.seconds:.1f} s, the process's start and the bundle's load "
        f"included)",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="logged rows estimate-lake reads")
    ap.add_argument("--spark-rows", type=int, default=DEFAULT_SPARK_ROWS, help="rows of the Spark comparison")
    ap.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="timed runs of each side")
    ap.add_argument("--workdir", type=Path, help="where the model, bundle and lakes go (default: a temp dir)")
    ap.add_argument("--out", type=Path, help="rewrite this page's generated block (docs/python.md)")
    args = ap.parse_args(argv)
    if args.rows < 1 or args.spark_rows < 1 or args.repeats < 1:
        ap.error("--rows, --spark-rows and --repeats are at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-lake-") as tmp:
        work = args.workdir or Path(tmp)
        t = time.perf_counter()
        bundle = fit_subject(work / "subject")
        print(f"fitted the subject's bundle in {time.perf_counter() - t:.1f} s", flush=True)
        write_lake(work / "spark-lake", args.spark_rows)
        spark = compare(bundle, work / "spark-lake", args.spark_rows, args.repeats)
        t = time.perf_counter()
        write_lake(work / "lake", args.rows)
        print(f"wrote {args.rows:,} rows of Parquet in {time.perf_counter() - t:.1f} s", flush=True)
        limit = 60.0 + SECONDS_PER_MILLION * args.rows / 1e6
        lake = run_lake(work / "subject" / "table.onnx", work / "subject" / "bundle", work / "lake", limit)
        if lake.rows != args.rows:
            raise SystemExit(f"estimate-lake read {lake.rows} rows of {args.rows}")
    body = lines(spark, lake)
    print("\n".join(body))
    if args.out is not None:
        flags = [f"--{k.replace('_', '-')} {v}" for k, v, d in _given(args) if v != d]
        command = " ".join([COMMAND, *flags, "--out", str(args.out)])
        write_block(args.out, BEGIN, "\n".join([provenance(command, ROOT), "", *body]))
    return 0 if spark.equal else 1


def _given(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """The sizes given, with their defaults (a non-default one is named in the block's command)."""
    return [
        ("rows", args.rows, DEFAULT_ROWS),
        ("spark_rows", args.spark_rows, DEFAULT_SPARK_ROWS),
        ("repeats", args.repeats, DEFAULT_REPEATS),
    ]


if __name__ == "__main__":
    raise SystemExit(main())
