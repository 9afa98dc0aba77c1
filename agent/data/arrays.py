"""Named arrays of a ``.npz`` or ``.npy`` file, read on demand and within :class:`DataLimits`.

``numpy.load`` of a ``.npz`` decompresses an array as soon as it is touched, and the callers used to
touch every one: a 4 MB archive whose unused array inflates to 4 GiB cost 4 GiB. :class:`ArrayFile`
reads only what the caller names, and before it decompresses an array it reads what the archive
declares: the zip entry's uncompressed size and the ``.npy`` header inside it (shape, dtype; the first
bytes of the entry only). An array past ``max_bytes`` (counted over every array read from the file)
or ``max_rows`` is refused there, with one line naming the limit.

* ``.npz``: a zip of ``<name>.npy`` entries, deflated or stored (``np.savez``/``np.savez_compressed``).
* ``.npy``: one array, memory-mapped (the way to hand over data larger than memory: :meth:`batches`
  then touches one batch of rows at a time), named :data:`NPY_ARRAY` (``x``).

Arrays are served by name (``x``, ``y``, metadata fields, a model's named inputs), whole
(:meth:`ArrayFile.read`) or in batches of rows (:meth:`ArrayFile.batches`); pickled (object) arrays
are refused, as ``allow_pickle=False`` does.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np

from agent.data.limits import DataError, DataLimits

#: The name of the one array of a ``.npy`` file.
NPY_ARRAY = "x"
#: dtype kinds an array may hold: booleans, integers, floats, text and bytes (no objects, no records).
ALLOWED_KINDS = frozenset("biufUS")
#: Entries a ``.npz`` may hold: its central directory is read whole before any array.
MAX_ENTRIES = 4096
_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"
_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class ArrayInfo:
    """What a file declares about one array, read without decompressing it."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    fortran_order: bool = False

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=object)) * self.dtype.itemsize

    @property
    def rows(self) -> int:
        """Samples along the first axis (1 for a scalar)."""
        return int(self.shape[0]) if self.shape else 1

    @property
    def row_bytes(self) -> int:
        """Bytes of one sample (of one value for a scalar)."""
        return int(np.prod(self.shape[1:], dtype=object)) * self.dtype.itemsize

    def describe(self) -> str:
        return f"array {self.name!r} ({'x'.join(map(str, self.shape)) or 'scalar'} {self.dtype})"


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _read_header(fp: IO[bytes], where: str) -> tuple[tuple[int, ...], np.dtype[Any], bool]:
    """The ``.npy`` header at the start of ``fp``: shape, dtype, Fortran order."""
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{where}: not a valid .npy array ({_first_line(exc)})") from exc
    if dtype.hasobject or dtype.kind not in ALLOWED_KINDS or dtype.names is not None or dtype.subdtype is not None:
        raise DataError(
            f"{where}: arrays of dtype {dtype} are not read (numbers, booleans or strings only; "
            "object arrays would need pickle)"
        )
    return tuple(int(d) for d in shape), dtype, bool(fortran)


def _zip_entries(fp: IO[bytes], size: int) -> int:
    """Entries the zip's end-of-central-directory record declares (zip64 too), before ``zipfile``
    reads the whole directory; -1 when no record is found (``zipfile`` then names the problem)."""
    tail_len = min(size, 22 + 65535)
    fp.seek(size - tail_len)
    tail = fp.read(tail_len)
    at = tail.rfind(_EOCD)
    if at < 0 or at + 22 > len(tail):
        return -1
    entries = struct.unpack_from("<H", tail, at + 10)[0]
    loc = at - 20
    if entries == 0xFFFF and loc >= 0 and tail[loc : loc + 4] == _EOCD64_LOCATOR:
        (eocd64,) = struct.unpack_from("<Q", tail, loc + 8)
        if 0 <= eocd64 <= size - 56:
            fp.seek(eocd64)
            record = fp.read(56)
            if record[:4] == b"PK\x06\x06":
                return int(struct.unpack_from("<Q", record, 32)[0])
    return int(entries)


class ArrayFile:
    """The named arrays of one ``.npz`` or ``.npy`` file, read lazily within ``limits``.

    Use as a context manager (it holds the file open). :meth:`info` reads an array's declaration,
    :meth:`read` the whole array, :meth:`batches` its rows a batch at a time.
    """

    def __init__(self, path: str | Path, limits: DataLimits | None = None) -> None:
        self.path = Path(path)
        self.limits = limits or DataLimits()
        self._infos: dict[str, ArrayInfo] = {}
        self._read_bytes = 0
        self._zip: zipfile.ZipFile | None = None
        self._entries: dict[str, zipfile.ZipInfo] = {}
        if not self.path.is_file():
            raise DataError(f"data file not found: {self.path}")
        suffix = self.path.suffix.lower()
        if suffix == ".npy":
            self._names = [NPY_ARRAY]
        elif suffix == ".npz":
            self._open_zip()
            self._names = list(self._entries)
        else:
            raise DataError(f"{self.path}: not an array file (.npz or .npy)")

    def _open_zip(self) -> None:
        size = self.path.stat().st_size
        with open(self.path, "rb") as fp:
            entries = _zip_entries(fp, size)
        if entries > MAX_ENTRIES:
            raise DataError(f"{self.path}: {entries} entries; a .npz data file holds at most {MAX_ENTRIES} arrays")
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise DataError(f"{self.path}: not a valid .npz file ({exc})") from exc
        for zi in self._zip.infolist():
            if zi.is_dir():
                continue
            name = zi.filename[:-4] if zi.filename.endswith(".npy") else zi.filename
            self._entries[name] = zi

    # -- the file's declarations ------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """The arrays the file holds, in file order."""
        return list(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def _where(self, name: str) -> str:
        return f"{self.path}: array {name!r}"

    def info(self, name: str) -> ArrayInfo:
        """Shape and dtype of ``name`` from its header (the first bytes of its entry only)."""
        cached = self._infos.get(name)
        if cached is not None:
            return cached
        if name not in self._names:
            raise DataError(f"{self.path}: no array named {name!r} (found: {', '.join(self._names) or 'none'})")
        entry = self._entries.get(name)
        if entry is not None and entry.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise DataError(
                f"{self._where(name)}: compressed with zip method {entry.compress_type}; arrays are read when "
                "stored or deflated (as numpy writes them)"
            )
        with self._open(name) as fp:
            shape, dtype, fortran = _read_header(fp, self._where(name))
            header_len = fp.tell()
        info = ArrayInfo(name, shape, dtype, fortran)
        declared = entry.file_size if entry is not None else self.path.stat().st_size
        if declared != header_len + info.nbytes:
            raise DataError(
                f"{self._where(name)}: its header declares {info.nbytes} bytes of data but the file holds "
                f"{declared - header_len}; the file is damaged or was not written by numpy"
            )
        self._infos[name] = info
        return info

    def _open(self, name: str) -> IO[bytes]:
        if self._zip is None:
            return open(self.path, "rb")
        try:
            return self._zip.open(self._entries[name])
        except (zipfile.BadZipFile, NotImplementedError, OSError, RuntimeError) as exc:
            raise DataError(f"{self._where(name)}: cannot be read ({exc})") from exc

    def _admit(self, info: ArrayInfo, nbytes: int) -> None:
        """Check ``info``'s rows and that ``nbytes`` more stay within ``max_bytes`` for this file."""
        self.limits.check_rows(info.rows, f"{self.path}: {info.describe()}")
        self.limits.check_bytes(
            self._read_bytes + nbytes,
            f"{self.path}: {info.describe()}"
            + (f" with the {self._read_bytes} bytes read before it" if self._read_bytes else ""),
        )

    # -- reading ----------------------------------------------------------------------------------
    def read(self, name: str) -> np.ndarray:
        """The whole array (a read-only memory map for ``.npy``), after its declared size passed the limits."""
        info = self.info(name)
        self._admit(info, info.nbytes)
        if self._zip is None:
            arr = self._load_npy(name)
        else:
            try:
                with self._open(name) as fp:
                    arr = np.lib.format.read_array(fp, allow_pickle=False)
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                raise DataError(f"{self._where(name)}: cannot be read ({_first_line(exc)})") from exc
        if arr.shape != info.shape:
            raise DataError(f"{self._where(name)}: shape changed while reading; the file is damaged")
        self._read_bytes += info.nbytes
        return arr

    def _load_npy(self, name: str) -> np.ndarray:
        try:
            return np.load(self.path, mmap_mode="r", allow_pickle=False)  # type: ignore[no-any-return]
        except (ValueError, OSError) as exc:
            raise DataError(f"{self._where(name)}: cannot be read ({_first_line(exc)})") from exc

    def batches(self, name: str, rows: int) -> Iterator[np.ndarray]:
        """The array's rows, at most ``rows`` at a time (fewer when a batch would pass ``max_bytes``);
        only one batch is decompressed (``.npz``) or touched (``.npy``) at a time, so the whole array
        is not bounded by ``max_bytes``, only by ``max_rows``."""
        info = self.info(name)
        if rows < 1:
            raise DataError(f"batch size must be at least 1 row, got {rows}")
        self.limits.check_rows(info.rows, f"{self.path}: {info.describe()}")
        self.limits.check_bytes(info.row_bytes, f"{self.path}: one row of {info.describe()}")
        step = self.limits.batch_rows(rows, info.row_bytes)
        if self._zip is None:
            mm = self._load_npy(name)
            for i in range(0, info.rows, step):
                yield np.array(mm[i : i + step])
        elif info.fortran_order or not info.shape:  # not stored row by row: read whole, within the limit
            whole = self.read(name)
            for i in range(0, info.rows, step):
                yield whole[i : i + step] if info.shape else whole
        else:
            yield from self._zip_batches(info, step)

    def _zip_batches(self, info: ArrayInfo, step: int) -> Iterator[np.ndarray]:
        with self._open(info.name) as fp:
            _read_header(fp, self._where(info.name))
            for start in range(0, info.rows, step):
                n = min(step, info.rows - start)
                out = np.empty((n, *info.shape[1:]), dtype=info.dtype)
                view = out.data.cast("B")
                got = 0
                while got < len(view):
                    chunk = fp.read(min(_READ_CHUNK, len(view) - got))
                    if not chunk:
                        raise DataError(f"{self._where(info.name)}: the data ends early; the file is damaged")
                    view[got : got + len(chunk)] = chunk
                    got += len(chunk)
                yield out

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None

    def __enter__(self) -> ArrayFile:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
