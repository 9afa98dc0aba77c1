"""Estimates over a Spark data frame (``pip install 'icos-agent[spark]'``): each partition is judged where it lies,
through ``mapInArrow`` (Arrow batches, no row-by-row Python), into one additive tally per window, exactly as
:meth:`icos_agent.Bundle.estimate` adds up a batch; Spark groups the partitions' tallies by window and the driver
sums each group, so the estimates are those of ``Bundle.estimate`` over the same rows (to 1e-9, in any
partitioning: docs/python.md, "The equality guarantee").

The executors load the bundle and the model from their paths: a bundle saved (``Bundle.save``) or loaded from a
directory every executor can read (a shared filesystem on a cluster). A bundle fitted from logged predictions
(:func:`icos_agent.fit_reference`) has no model: the data frame then holds the logged rows (features and
probabilities), judged as :meth:`icos_agent.Bundle.estimate` judges them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from agent.api import UserError, Windowed, Windowing, frame_rows, tally_of_json
from icos_agent._inputs import BATCH_ROWS
from icos_agent.bundle import Bundle, load
from icos_agent.estimates import ALERT_MARGIN, Estimates

if TYPE_CHECKING:
    import pyarrow as pa

#: The schema of what each partition hands on: one row per window it saw.
PARTIAL_SCHEMA = "window long, tally string"

#: Bundles loaded in this process (an executor's Python worker, which Spark reuses from partition to partition),
#: by their paths and the files' times and sizes: a bundle or model rewritten in place is loaded again.
_LOADED: dict[tuple[object, ...], Bundle] = {}


def _loaded(bundle_dir: str, model_path: str | None) -> Bundle:
    """The bundle and model at these paths (no model: a bundle of logged predictions), loaded once per worker
    process rather than once per partition."""
    from pathlib import Path

    files = (*([Path(model_path)] if model_path else []), *sorted(Path(bundle_dir).iterdir()))
    key = (bundle_dir, model_path, *((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files))
    if key not in _LOADED:
        _LOADED.clear()  # one bundle at a time: a worker serving another estimate drops the last one
        _LOADED[key] = load(bundle_dir, model=model_path)
    return _LOADED[key]


def _add_partition(
    bundle: Bundle,
    windowed: Windowed,
    frames: Iterator[Any],
    label_column: str | None,
    timestamp_column: str | None,
    metadata: Sequence[str],
    batch_rows: int,
) -> None:
    """A partition's rows (pandas frames) added to ``windowed``: judged by the model, or read as logged rows."""
    if bundle.model is None:
        from icos_agent.reference import table_batches

        columns = bundle.logged_columns(metadata)
        for frame in frames:
            for batch, ts in table_batches(
                frame, columns, labels=label_column, timestamp=timestamp_column, batch_rows=batch_rows
            ):
                windowed.add_table(batch, ts)
        return
    names = bundle.model.signature.names
    rows = (
        frame_rows(
            frame,
            names,
            label_column=label_column,
            timestamp_column=timestamp_column,
            metadata=metadata,
            where="spark partition",
        )
        for frame in frames
    )
    windowed.add_all(rows, batch_rows)


def _partition_tallies(
    bundle_dir: str,
    model_path: str | None,
    windowing: Windowing,
    label_column: str | None,
    timestamp_column: str | None,
    metadata: Sequence[str],
    batch_rows: int,
) -> Any:
    """The function ``mapInArrow`` runs over each partition: its Arrow batches judged into tallies per window."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        bundle = _loaded(bundle_dir, model_path)
        windowed = Windowed(bundle.model, bundle.invariants, windowing)
        frames = (batch.to_pandas() for batch in batches)
        _add_partition(bundle, windowed, frames, label_column, timestamp_column, metadata, batch_rows)
        partials = windowed.partials()
        yield pa.RecordBatch.from_pydict(
            {"window": [k for k, _ in partials], "tally": [t for _, t in partials]},
            schema=pa.schema([("window", pa.int64()), ("tally", pa.string())]),
        )

    return run


def estimate(
    spark_df: Any,
    bundle: Bundle,
    timestamp: str | None = "ts",
    window: str | None = "1 hour",
    labels: str | None = None,
    *,
    metadata: Sequence[str] = (),
    alert_margin: float = ALERT_MARGIN,
    batch_rows: int = BATCH_ROWS,
) -> Estimates:
    """Every estimate per window of a Spark data frame: ``timestamp`` its time column and ``window`` a duration
    (``"1 hour"``, ``"15 minutes"``; None: one window of every row), ``labels`` its label column (None: no labels);
    every other column is an input, as :meth:`icos_agent.Bundle.estimate` reads a pandas frame; with a bundle fitted
    from logged predictions, the logged rows' feature and probability columns."""
    if bundle.directory is None or (bundle.model is not None and bundle.model.path is None):
        raise UserError("the executors load the bundle from its directory: save it first (bundle.save(dir))")
    windowing = Windowing.of(window)
    if windowing.rows is not None:
        raise UserError("a Spark data frame has no row order: window is a duration, or None for one window")
    if windowing.by_time and timestamp is None:
        raise UserError("a time window needs timestamp= (the time column)")
    run = _partition_tallies(
        str(bundle.directory),
        str(bundle.model.path) if bundle.model is not None else None,
        windowing,
        labels,
        timestamp if windowing.by_time else None,
        list(metadata),
        batch_rows,
    )
    if not windowing.by_time and timestamp is not None and timestamp in spark_df.columns:
        spark_df = spark_df.drop(timestamp)
    from pyspark.sql import functions as F  # noqa: N812 - pyspark's own convention

    partials = spark_df.mapInArrow(run, PARTIAL_SCHEMA)
    grouped = partials.groupBy("window").agg(F.collect_list("tally").alias("tallies")).collect()
    windowed = Windowed(bundle.model, bundle.invariants, windowing)
    for row in sorted(grouped, key=lambda r: r["window"]):
        for text in row["tallies"]:
            windowed.merge(int(row["window"]), tally_of_json(text))
    if windowed.total.stats is None:
        raise UserError("estimate: the data frame has no rows")
    return Estimates(windowed, alert_margin=alert_margin)
