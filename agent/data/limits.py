"""How much of a data file the agent reads, and the errors of files it cannot use.

A data file given on the command line (or as an audit's reference data) may be hostile or simply
wrong: a 4 MB ``.npz`` can inflate to gigabytes, a 20 MB CSV can have millions of columns, a Parquet
file can declare billions of rows. Every reader of :mod:`agent.data` checks what the file declares
against :class:`DataLimits` *before* it decodes it, and refuses with one line naming the limit and how
to raise it (a CLI flag, or a config setting in the served agent).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from agent.errors import UserError


class DataError(UserError, ValueError):
    """A data file that cannot be used, with the reason."""


class DataLimitError(DataError):
    """A data file larger than a limit: the message names the limit and how to raise it."""


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_size(text: str) -> int:
    """``"2GiB"``, ``"512MB"``, ``"1048576"`` → bytes (``KiB``/``MiB``/``GiB`` are powers of 1024,
    ``KB``/``MB``/``GB`` powers of 1000). Raises ``ValueError`` naming the format."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size like 1073741824, 512MiB or 2GiB")
    unit = (m.group(2) or "").lower()
    scale = 1024 ** ("kmgt".index(unit[0]) + 1) if "i" in unit else _UNITS[unit[:1]]
    return int(float(m.group(1)) * scale)


def format_size(n: int) -> str:
    """Bytes for a person: ``2.9 GiB``, ``512.0 MiB``, ``300 bytes``."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


@dataclass(frozen=True)
class LimitNames:
    """How a person raises each limit where they meet it (a CLI flag or a config setting)."""

    max_bytes: str = "--max-data-bytes"
    max_rows: str = "--max-rows"
    max_columns: str = "--max-columns"


#: Defaults: a 100,000 × 784 float32 training set (314 MB; 627 MB as a table of float64) passes.
DEFAULT_MAX_BYTES = 2 * 1024**3
DEFAULT_MAX_ROWS = 10_000_000
DEFAULT_MAX_COLUMNS = 100_000


@dataclass(frozen=True)
class DataLimits:
    """Bounds on what one data file may make the agent decode.

    * ``max_bytes``: data held in memory at once from one file: the arrays read from a ``.npz``/``.npy``
      (their declared sizes, checked before decompression), a table read whole (rows × columns as
      8-byte numbers; a CSV's text; a Parquet file's uncompressed size), or one batch of a table read in
      batches (whose rows are cut to fit).
    * ``max_rows``: samples of an array file, rows of a table (whole or in batches).
    * ``max_columns``: columns of a CSV (counted in its header before any row is parsed) or Parquet
      table (from its metadata).
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    max_rows: int = DEFAULT_MAX_ROWS
    max_columns: int = DEFAULT_MAX_COLUMNS
    names: LimitNames = field(default_factory=LimitNames)

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_rows", "max_columns"):
            if getattr(self, name) < 1:
                raise DataError(f"{getattr(self.names, name)} must be at least 1, got {getattr(self, name)}")

    @classmethod
    def from_args(cls, args: Any) -> DataLimits:
        """The limits the CLI flags set (``--max-data-bytes``, ``--max-rows``, ``--max-columns``)."""
        return cls(max_bytes=args.max_data_bytes, max_rows=args.max_rows, max_columns=args.max_columns)

    def check_bytes(self, n: int, what: str) -> None:
        """Refuse ``what`` (a phrase naming the file and the data) when it needs more than ``max_bytes``."""
        if n > self.max_bytes:
            raise DataLimitError(
                f"{what} needs {format_size(n)}, over the limit of {format_size(self.max_bytes)} of data read "
                f"from one file (raise it with {self.names.max_bytes})"
            )

    def check_rows(self, n: int, where: str, *, at_least: bool = False) -> None:
        if n > self.max_rows:
            more = "more than " if at_least else ""
            raise DataLimitError(
                f"{where}: {more}{n} rows, over the limit of {self.max_rows} (raise it with {self.names.max_rows})"
            )

    def check_columns(self, n: int, where: str, *, at_least: bool = False) -> None:
        if n > self.max_columns:
            more = "more than " if at_least else ""
            raise DataLimitError(
                f"{where}: {more}{n} columns, over the limit of {self.max_columns} "
                f"(raise it with {self.names.max_columns})"
            )

    def batch_rows(self, wanted: int, row_bytes: int) -> int:
        """``wanted`` rows per batch, fewer when a batch of them would pass ``max_bytes``."""
        return max(1, min(wanted, self.max_bytes // max(1, row_bytes)))
