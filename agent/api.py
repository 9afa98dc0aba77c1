"""The agent's public entry points for Python callers: what :mod:`icos_agent` (the package a data scientist imports
in a notebook) builds on, and the only module of ``agent`` it may import (an import-linter contract in
``pyproject.toml``), so that the internals can move without breaking a notebook."""

from __future__ import annotations

from agent.commands.data_args import image_reading
from agent.data.files import Dataset, label_indices, load_data
from agent.data.frame_rows import FrameRows, frame_rows, rebatched, timestamps_ns
from agent.data.limits import DataError, DataLimits
from agent.data.table_files import frames
from agent.data.tables import TableBatch, TableColumns, columns_of_schema, default_classes, table_batch
from agent.errors import UserError
from agent.estimation.segments.table import SegmentTable
from agent.model.classifier import OnnxClassifier
from agent.offline.backfill import Backfill, write_openmetrics
from agent.offline.fit import FitReport, fit_bundle, fit_table_bundle, fit_warnings
from agent.offline.lake import lake_batches, lake_files
from agent.offline.tables import Tally
from agent.offline.windowed import Windowed, Windowing, alert_of, realized_accuracy, tally_of_json
from agent.offline.windowed_pair import WindowedPair
from agent.results.estimate import estimate_row
from agent.results.paired import PairedEntry
from agent.results.window import WindowEntry
from invariants.bundle import Bundle as InvariantBundle
from invariants.fit_params import CalibrationPlan, FitParams, FitParamsError, flag_name

__all__ = [
    "Backfill",
    "CalibrationPlan",
    "DataError",
    "DataLimits",
    "Dataset",
    "FitParams",
    "FitParamsError",
    "FitReport",
    "FrameRows",
    "InvariantBundle",
    "OnnxClassifier",
    "SegmentTable",
    "TableBatch",
    "TableColumns",
    "Tally",
    "UserError",
    "WindowEntry",
    "Windowed",
    "Windowing",
    "WindowedPair",
    "PairedEntry",
    "alert_of",
    "columns_of_schema",
    "default_classes",
    "estimate_row",
    "fit_bundle",
    "fit_table_bundle",
    "fit_warnings",
    "flag_name",
    "image_reading",
    "frame_rows",
    "frames",
    "label_indices",
    "lake_batches",
    "lake_files",
    "load_data",
    "realized_accuracy",
    "table_batch",
    "tally_of_json",
    "rebatched",
    "timestamps_ns",
    "write_openmetrics",
]
