"""The flags that bound what a data file may make a command read (``fit``, ``check``, ``audit``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.data.images import Preprocess
    from agent.data.limits import DataLimits
    from agent.model.classifier import OnnxClassifier

# the defaults of agent.data.limits, repeated so that --help needs no numpy import
_DEFAULT_MAX_BYTES = "2GiB"
_DEFAULT_MAX_ROWS = 10_000_000
_DEFAULT_MAX_COLUMNS = 100_000


def _size(text: str) -> int:
    from agent.data.limits import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_limit_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--max-data-bytes",
        type=_size,
        default=_DEFAULT_MAX_BYTES,
        metavar="SIZE",
        help="data held in memory at once from one file: arrays of a .npz/.npy (their declared sizes, checked "
        "before decompression), a table read whole (rows x columns as 8-byte numbers), one batch of a table read "
        f"in batches (e.g. 512MiB, 4GiB; default {_DEFAULT_MAX_BYTES})",
    )
    p.add_argument(
        "--max-rows",
        type=int,
        default=_DEFAULT_MAX_ROWS,
        metavar="N",
        help=f"samples of an array file, rows of a table (default {_DEFAULT_MAX_ROWS})",
    )
    p.add_argument(
        "--max-columns",
        type=int,
        default=_DEFAULT_MAX_COLUMNS,
        metavar="N",
        help=f"columns of a CSV or Parquet table, checked before its rows are read (default {_DEFAULT_MAX_COLUMNS})",
    )


def metadata_to_read(path: str, named: Sequence[str], rule_fields: Iterable[str]) -> list[str]:
    """The metadata arrays to read from ``path``: ``--metadata``, else for an array file the fields
    the IDI rules read (its 1-D arrays of one value per sample are metadata without being named, and
    only those read are decompressed). Tables take metadata columns only when named."""
    if named or Path(path).suffix.lower() not in (".npz", ".npy"):
        return list(named)
    return sorted(rule_fields)


def data_limits(args: argparse.Namespace) -> DataLimits:
    """The limits the flags set (raises a :class:`~agent.data.limits.DataError` for a value below 1)."""
    from agent.data.limits import DataLimits

    return DataLimits.from_args(args)


def add_preprocess_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--preprocess",
        metavar="SPEC",
        help="image folders (one subfolder of PNG/JPEG files per class): how a file becomes the model's input, "
        'e.g. "scale=1/255 mean=0.485,0.456,0.406 std=0.229,0.224,0.225" (default: resized to the model\'s input, '
        "pixels scaled to [0, 1] for a float input; recorded in the bundle and used again by check)",
    )


def image_reading(
    model: OnnxClassifier, spec: str | None, recorded: Mapping[str, Any] | None = None
) -> tuple[str, Preprocess] | None:
    """How image folders are read for ``model`` (its single image input and the preprocessing: the
    bundle's ``recorded`` one, else the one the input implies, with ``spec``'s overrides); None for a
    model without one image input."""
    from agent.data.images import Preprocess
    from agent.model.views import is_image

    spec_in = model.signature.single
    if spec_in is None or not is_image(spec_in) or len(spec_in.shape) != 3:
        return None
    if recorded:
        pre = Preprocess.from_dict(recorded)
    else:
        pre = Preprocess.for_input(spec_in.name, spec_in.shape, spec_in.dtype)
    return spec_in.name, pre.with_options(spec)
