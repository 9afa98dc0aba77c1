"""``make dist``: the sdist of icos-agent, then its wheel built from that sdist (as ``python -m build``
does: a file the sdist lacks is missing from the wheel too, and nothing stale under ``build/`` gets in),
both written to ``dist/`` (or the folder given). It calls the PEP 517 hooks of the running interpreter's
setuptools (the project's ``.venv``, where ``make venv`` installed it): nothing is downloaded.

    .venv/bin/python .ci/dist.py [OUT_DIR]

Prints the paths of the sdist and the wheel.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOK = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"


def _hook(name: str, out: Path, cwd: Path) -> Path:
    """Run the setuptools hook ``name`` in ``cwd`` (a project root) and return the file it wrote in ``out``."""
    proc = subprocess.run(  # noqa: S603 - this interpreter, a fixed program
        [sys.executable, "-c", HOOK, name, str(out)], cwd=cwd, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out / proc.stdout.strip().splitlines()[-1]


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else ROOT / "dist").resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("icos_agent-*.tar.gz"), *out.glob("icos_agent-*.whl")]:
        old.unlink()
    sdist = _hook("build_sdist", out, ROOT)
    with tempfile.TemporaryDirectory(prefix="icos-dist-") as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        (unpacked,) = Path(tmp).iterdir()
        wheel = _hook("build_wheel", out, unpacked)
    print(sdist)
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
