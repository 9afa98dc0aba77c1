"""Benchmark: what hostile data files cost the CLI. Small on disk, huge once read; each case runs the
real ``icos-agent`` and reports its exit status, peak RSS and time:

* ``check`` of a 4 MB ``.npz`` whose unused array inflates to 4 GiB;
* ``check`` of a 3 MB ``.npz`` declaring 10⁶ MNIST images (2.9 GiB);
* ``check`` and ``fit --reference`` of a 20 MB CSV with 2 million columns.

    python -m bench.hostile.files [--agent-root DIR] [--timeout 150]
    python -m bench hostile_files

``--agent-root`` runs the ``agent`` package of another checkout (e.g. an older commit, to compare).
The tests (``tests/integration/test_data_file_bounds.py``) use the same files and measurement.

Helpers:

* :func:`write_npz` writes a real ``.npz`` (zip64) whose arrays are given, or declared all zeros:
  a zero array is deflated as one repeated block (``Z_FULL_FLUSH`` resets the history, so every
  1 MiB of zeros compresses to the same ~1 KB), so 4 GiB of zeros take about 4 MB and a second to
  write (the CRC is computed over every byte, as a reader checks it).
* :func:`wide_csv` writes a CSV with millions of columns.
* :func:`run_measured` runs ``icos-agent`` and returns its exit status, output and peak RSS
  (``os.wait4`` in a small wrapper process: the rusage of that one command).
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_BLOCK = 1 << 20
_ZIP64 = 0xFFFFFFFF


@dataclass(frozen=True)
class Zeros:
    """An array of zeros declared by shape and dtype, never allocated."""

    shape: tuple[int, ...]
    dtype: str = "<f4"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def _npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _deflate_zeros(out: io.BufferedWriter, header: bytes, n_zero: int) -> tuple[int, int]:
    """Write ``header`` then ``n_zero`` zero bytes, deflated; return (crc32, compressed size)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    written = out.write(c.compress(header) + c.flush(zlib.Z_FULL_FLUSH))
    crc = zlib.crc32(header)
    zero = bytes(_BLOCK)
    full, rest = divmod(n_zero, _BLOCK)
    block = b""
    for i in range(full):
        if i < 2:  # the first two blocks come from the compressor: they must be the same bytes
            compressed = c.compress(zero) + c.flush(zlib.Z_FULL_FLUSH)
            assert not block or compressed == block
            block = compressed
        written += out.write(block)
        crc = zlib.crc32(zero, crc)
    written += out.write(c.compress(bytes(rest)) + c.flush())
    return zlib.crc32(bytes(rest), crc), written


def write_npz(path: Path, arrays: Mapping[str, np.ndarray | Zeros]) -> None:
    """A zip64 ``.npz`` of ``arrays`` (deflated), each ``Zeros`` streamed without being allocated."""
    central: list[bytes] = []
    with open(path, "wb") as out:
        for name, arr in arrays.items():
            entry = f"{name}.npy".encode()
            if isinstance(arr, Zeros):
                header, n_zero = _npy_header(arr.shape, arr.dtype), arr.nbytes
            else:
                buf = io.BytesIO()
                np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
                header, n_zero = buf.getvalue(), 0
            size = len(header) + n_zero
            offset = out.tell()
            out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0x21, 0, _ZIP64, _ZIP64, len(entry), 20))
            out.write(entry + struct.pack("<HHQQ", 1, 16, size, 0))
            start = out.tell()
            if n_zero:
                crc, csize = _deflate_zeros(out, header, n_zero)
            else:
                c = zlib.compressobj(6, zlib.DEFLATED, -15)
                data = c.compress(header) + c.flush()
                crc, csize = zlib.crc32(header), out.write(data)
            end = out.tell()
            out.seek(offset + 14)  # crc in the local header
            out.write(struct.pack("<I", crc))
            out.seek(start - 16)  # the zip64 extra's sizes
            out.write(struct.pack("<QQ", size, csize))
            out.seek(end)
            central.append(
                struct.pack(
                    "<IHHHHHHIIIHHHHHII",
                    0x02014B50,
                    45,
                    45,
                    0,
                    8,
                    0,
                    0x21,
                    crc,
                    _ZIP64,
                    _ZIP64,
                    len(entry),
                    28,
                    0,
                    0,
                    0,
                    0,
                    _ZIP64,
                )  # fmt: skip
                + entry
                + struct.pack("<HHQQQ", 1, 24, size, csize, offset)
            )
        cd_offset = out.tell()
        for rec in central:
            out.write(rec)
        cd_size = out.tell() - cd_offset
        eocd64 = out.tell()
        n = len(central)
        out.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, cd_size, cd_offset))
        out.write(struct.pack("<IIQI", 0x07064B50, 0, eocd64, 1))
        out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, _ZIP64, _ZIP64, 0))


def wide_csv(path: Path, columns: int, rows: int = 1) -> None:
    """A CSV of ``columns`` columns named ``c0, c1, …`` and ``rows`` rows of zeros."""
    with open(path, "w", encoding="ascii") as out:
        out.write(",".join(f"c{i}" for i in range(columns)) + "\n")
        row = ",".join("0" for _ in range(columns)) + "\n"
        for _ in range(rows):
            out.write(row)


@dataclass
class Measured:
    returncode: int
    stdout: str
    stderr: str
    peak_rss: int  # bytes

    @property
    def peak_mb(self) -> float:
        return self.peak_rss / 1e6


#: Runs ``argv[3:]``, kills it after ``argv[2]`` seconds, and writes its exit status and peak RSS
#: (KiB) to ``argv[1]``. A child's peak RSS counts the
#: memory of the process it was forked from (Linux carries the parent's high-water mark across
#: fork/vfork and exec), so the command is started from this small interpreter, not from pytest.
_WRAPPER = """
import os, signal, sys
pid = os.posix_spawn(sys.argv[3], sys.argv[3:], os.environ)
signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
signal.alarm(int(sys.argv[2]))
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def run_measured(args: Sequence[str], tmp: Path, timeout: float = 300.0, root: Path | None = None) -> Measured:
    """Run ``python -m agent *args`` (the package under ``root`` when given); its exit status, output
    and peak RSS (killed past ``timeout``)."""
    env = {k: v for k, v in os.environ.items() if k != "ICOS_AGENT_DEBUG"}
    env.setdefault("OMP_NUM_THREADS", "1")
    if root is not None:
        env["PYTHONPATH"] = str(root)
    result = tmp / "measured.txt"
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-S", "-c", _WRAPPER, str(result), str(int(timeout)), sys.executable, "-m", "agent", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 60, check=True, cwd=root)
    code, peak_kib = (int(v) for v in result.read_text().split())
    return Measured(code, proc.stdout, proc.stderr, peak_kib * 1024)


def _cases(tmp: Path, model: str, bundle: Path) -> dict[str, list[str]]:
    from agent.data.datasets import mnist_splits

    test = mnist_splits().test
    write_npz(tmp / "bomb.npz", {"x": test.x[:200], "y": test.y[:200], "pad": Zeros((4 << 30,), "|u1")})
    write_npz(tmp / "million.npz", {"x": Zeros((10**6, 1, 28, 28)), "y": Zeros((10**6,), "<i8")})
    wide_csv(tmp / "wide.csv", 2_000_000)
    check = ["check", "--model", model, "--bundle", str(bundle), "--data"]
    reference = ["--proba-columns", "c0", "--label-column", "c1", "--out", str(tmp / "table-bundle")]
    return {
        "check, 4 MB .npz, unused array of 4 GiB": [*check, str(tmp / "bomb.npz")],
        "check, 3 MB .npz, 10^6 samples": [*check, str(tmp / "million.npz")],
        "check, 20 MB CSV, 2*10^6 columns": [*check, str(tmp / "wide.csv")],
        "fit --reference, the same CSV": ["fit", "--reference", str(tmp / "wide.csv"), *reference],
    }


def main(argv: list[str]) -> int:
    import argparse
    import tempfile
    import time

    from agent.data.datasets import mnist_splits
    from agent.model.classifier import default_model_path

    p = argparse.ArgumentParser(prog="python -m bench.hostile.files", description=__doc__.splitlines()[0])
    p.add_argument("--agent-root", type=Path, help="checkout whose agent package runs (default: this one)")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds before a case is killed (default 150)")
    args = p.parse_args(argv)
    model = str(default_model_path())
    with tempfile.TemporaryDirectory(prefix="hostile-files-") as d:
        tmp = Path(d)
        s = mnist_splits()
        np.savez(tmp / "train.npz", x=s.train.x, y=s.train.y)
        np.savez(tmp / "val.npz", x=s.val.x, y=s.val.y)
        fit = ["fit", "--model", model, "--train", str(tmp / "train.npz"), "--val", str(tmp / "val.npz")]
        r = run_measured([*fit, "--trees", "10", "--out", str(tmp / "bundle")], tmp, root=args.agent_root)
        if r.returncode != 0:
            print(r.stderr[-2000:], file=sys.stderr)
            return 1
        print(f"{'case':<42}{'exit':>6}{'peak RSS':>12}{'seconds':>9}  message")
        for name, case in _cases(tmp, model, tmp / "bundle").items():
            started = time.perf_counter()
            r = run_measured(case, tmp, args.timeout, root=args.agent_root)
            took = time.perf_counter() - started
            lines = r.stderr.strip().splitlines()
            message = lines[-1][:150] if r.returncode == 2 and lines else ("killed" if r.returncode < 0 else "")
            print(f"{name:<42}{r.returncode:>6}{r.peak_mb:>9.0f} MB{took:>9.1f}  {message}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
