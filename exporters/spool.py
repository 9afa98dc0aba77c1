"""A durable on-disk queue of :class:`~exporters.run_record.RunRecord` waiting for MLflow.

Layout of the spool directory::

    <record_id>.json      one pending record (strict JSON, artifacts base64 inline)
    rejected/<id>.json    records MLflow refused (HTTP 400), kept for inspection, never retried
    corrupt/<name>        files that could not be parsed, kept for inspection, never retried

A pending file is ``{"format": "icos-agent/mlflow-spool", "version": 1, "spooled_at_ns": <int>,
"record": <RunRecord.to_json()>}`` (plus ``"error"`` in ``rejected/``). Files are written
atomically: a temporary file in the same directory, ``fsync``, ``rename`` over the final name, then
``fsync`` of the directory, so a crash leaves either the old state or the complete new file.
Records are delivered in the order they were spooled (``spooled_at_ns``, then ``record_id``).

Any failure to write (disk full, read-only file system, permissions, size cap) raises
:class:`SpoolError`, which the caller counts; it never takes the process down.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporters.redaction import RedactingFilter
from exporters.run_record import RunRecord

log = logging.getLogger(__name__)
log.addFilter(RedactingFilter())  # tracking URIs and MLflow's errors may carry credentials

SPOOL_FORMAT = "icos-agent/mlflow-spool"
SPOOL_VERSION = 1
SUFFIX = ".json"
REJECTED_DIR = "rejected"
CORRUPT_DIR = "corrupt"
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
_STALE_TEMP_SECONDS = 600.0


class SpoolError(Exception):
    """The spool could not store or remove a record (disk full, read-only, permissions, size cap)."""


@dataclass(frozen=True)
class SpoolEntry:
    """A pending file: its path, record id and when it was spooled."""

    path: Path
    record_id: str
    spooled_at_ns: int


def encode(record: RunRecord, spooled_at_ns: int, error: str | None = None) -> bytes:
    """The bytes of a spool file for ``record``."""
    payload: dict[str, Any] = {
        "format": SPOOL_FORMAT,
        "version": SPOOL_VERSION,
        "spooled_at_ns": int(spooled_at_ns),
        "record": record.to_json(),
    }
    if error is not None:
        payload["error"] = error
    return json.dumps(payload, allow_nan=False, separators=(",", ":"), sort_keys=True).encode("utf-8")


def decode(data: bytes) -> tuple[int, RunRecord]:
    """``(spooled_at_ns, record)`` from the bytes of a spool file; ``ValueError`` if malformed."""
    try:
        payload = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise ValueError("spool file must hold a JSON object")
    if payload.get("format") != SPOOL_FORMAT or payload.get("version") != SPOOL_VERSION:
        raise ValueError(f"not a {SPOOL_FORMAT} v{SPOOL_VERSION} file")
    spooled_at = payload.get("spooled_at_ns")
    if isinstance(spooled_at, bool) or not isinstance(spooled_at, int):
        raise ValueError("spooled_at_ns must be an integer")
    return spooled_at, RunRecord.from_json(payload.get("record"))  # type: ignore[arg-type]


def _fsync_dir(directory: Path) -> None:
    # Makes the rename/unlink durable. Some file systems refuse fsync on directories; the data file
    # itself is already synced, so that is not an error worth failing for.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _describe(exc: OSError) -> str:
    return exc.strerror or str(exc)


class Spool:
    """Pending records as one JSON file each in ``directory`` (created on first write)."""

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._remove_stale_temp_files()

    # -- writing -----------------------------------------------------------------------------
    def put(self, record: RunRecord) -> Path:
        """Store ``record`` durably as ``<record_id>.json``; :class:`SpoolError` if that fails."""
        data = encode(record, time.time_ns())
        used = self.size_bytes()
        if used + len(data) > self.max_bytes:
            raise SpoolError(
                f"spool {self.directory} is full ({used} + {len(data)} bytes > cap {self.max_bytes}); "
                f"record {record.record_id} ({record.kind}) dropped"
            )
        return self._write(self.directory / f"{record.record_id}{SUFFIX}", data)

    def reject(self, record: RunRecord, error: str) -> Path:
        """Keep a record MLflow refused in ``rejected/`` (and drop it from the queue)."""
        path = self._write(self.directory / REJECTED_DIR / f"{record.record_id}{SUFFIX}", encode(record, 0, error))
        self.remove(record.record_id)
        return path

    def remove(self, record_id: str) -> None:
        """Delete a pending record (a missing file is fine); :class:`SpoolError` if it cannot be deleted."""
        path = self.directory / f"{record_id}{SUFFIX}"
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise SpoolError(f"cannot delete delivered spool file {path}: {_describe(exc)}") from exc
        _fsync_dir(self.directory)

    def _write(self, final: Path, data: bytes) -> Path:
        directory = final.parent
        tmp: str | None = None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=directory)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            tmp = None
            _fsync_dir(directory)
        except OSError as exc:
            raise SpoolError(f"cannot write spool file {final}: {_describe(exc)}") from exc
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        return final

    # -- reading -----------------------------------------------------------------------------
    def _pending_paths(self) -> list[Path]:
        try:
            return [p for p in self.directory.iterdir() if p.suffix == SUFFIX and p.is_file()]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise SpoolError(f"cannot list spool directory {self.directory}: {_describe(exc)}") from exc

    def count(self) -> int:
        """Number of pending records."""
        return len(self._pending_paths())

    def size_bytes(self) -> int:
        """Bytes held by pending records."""
        total = 0
        for path in self._pending_paths():
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total

    def entries(self) -> list[SpoolEntry]:
        """Pending records in delivery order; unreadable files are moved to ``corrupt/``."""
        found: list[SpoolEntry] = []
        for path in self._pending_paths():
            try:
                spooled_at, record = decode(path.read_bytes())
                if f"{record.record_id}{SUFFIX}" != path.name:
                    raise ValueError(f"file name does not match record_id {record.record_id!r}")
            except (OSError, ValueError) as exc:
                self._quarantine(path, str(exc))
                continue
            found.append(SpoolEntry(path=path, record_id=record.record_id, spooled_at_ns=spooled_at))
        found.sort(key=lambda e: (e.spooled_at_ns, e.record_id))
        return found

    def load(self, entry: SpoolEntry) -> RunRecord | None:
        """The record of ``entry``; ``None`` if it vanished or became unreadable (then quarantined)."""
        try:
            return decode(entry.path.read_bytes())[1]
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self._quarantine(entry.path, str(exc))
            return None

    def rejected_count(self) -> int:
        """Number of records kept in ``rejected/``."""
        try:
            return sum(1 for p in (self.directory / REJECTED_DIR).iterdir() if p.suffix == SUFFIX)
        except OSError:
            return 0

    def _quarantine(self, path: Path, reason: str) -> None:
        log.warning("spool file %s is unreadable (%s); moving it to %s/", path, reason, CORRUPT_DIR)
        target = self.directory / CORRUPT_DIR / path.name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
            _fsync_dir(self.directory)
        except OSError as exc:
            log.warning("cannot move %s aside: %s", path, _describe(exc))

    def _remove_stale_temp_files(self) -> None:
        # Temporary files are only left behind by a crash between mkstemp and rename.
        cutoff = time.time() - _STALE_TEMP_SECONDS
        try:
            candidates = [p for p in self.directory.iterdir() if p.name.startswith(".") and p.suffix == ".tmp"]
        except OSError:
            return
        for path in candidates:
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
