"""The oldest Python the project runs on is stated once and held everywhere: ``requires-python`` in
pyproject.toml is what ruff's ``target-version`` and mypy's ``python_version`` check the code against
(mypy reads the standard library's stubs of that version, so ``datetime.UTC`` under 3.10 fails ``make
lint``), what the README and the image say, and what ``make`` refuses to go below, in one line."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _minimum() -> tuple[int, int]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    match = re.fullmatch(r">=(\d+)\.(\d+)", spec)
    assert match, f"requires-python {spec!r} is not of the form >=X.Y"
    return int(match[1]), int(match[2])


def test_every_statement_of_the_minimum_agrees() -> None:
    major, minor = _minimum()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert config["tool"]["mypy"]["python_version"] == f"{major}.{minor}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.findall(r"Python ≥ (\d+\.\d+)", readme) == [f"{major}.{minor}"]
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    image = re.search(r"PYTHON_IMAGE=python:(\d+)\.(\d+)", dockerfile)
    assert image and (int(image[1]), int(image[2])) >= (major, minor)
    assert sys.version_info[:2] >= (major, minor), "the tests run on a Python the project says it does not support"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The files ``make venv`` reads, copied so that pyproject.toml can be changed."""
    for name in ("Makefile", "pyproject.toml", "requirements.lock", ".ci/python-version.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def _make(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(where), *args, f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_make_venv_refuses_an_older_python_in_one_line(checkout: Path) -> None:
    # This interpreter is older than a requirement one minor version above it.
    need = f"{sys.version_info.major}.{sys.version_info.minor + 1}"
    pyproject = checkout / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    pyproject.write_text(re.sub(r'requires-python = ">=[\d.]+"', f'requires-python = ">={need}"', text))
    done = _make(checkout, "venv")
    assert done.returncode != 0
    have = ".".join(str(part) for part in sys.version_info[:3])
    said = [line for line in done.stderr.splitlines() if not line.startswith("make")]
    assert said == [f"icos-agent needs Python >= {need}: {sys.executable} is Python {have} (make PYTHON=python{need})"]
    assert not (checkout / ".venv").exists(), "the check runs before the virtual environment is made"


def test_make_accepts_this_python(checkout: Path) -> None:
    done = _make(checkout, "python-version")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
