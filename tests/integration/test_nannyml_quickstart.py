"""NannyML's quickstart (its performance-estimation steps) ported to ``icos_agent`` as docs/python.md shows it: the
port changes at most ten lines, runs on NannyML's own synthetic car-loan data (read from its pinned wheel, which
``make nannyml-wheel`` downloads: nannyml itself pins an older LightGBM than the agent) and produces the estimate
and the figure; every window's estimates are those of ``icos-agent check --chunk-size 5000`` over the same rows."""

from __future__ import annotations

import difflib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import icos_agent

ROOT = Path(__file__).resolve().parents[2]
WHEEL = ROOT / "build" / "nannyml-wheel" / "nannyml-0.13.1-py3-none-any.whl"
SECTION = "## Logged predictions: `fit_reference`, and NannyML's quickstart ported"

pytestmark = pytest.mark.timeout(600)


def _code_blocks() -> tuple[list[str], list[str]]:
    """NannyML's steps and the port, the second and third Python blocks of the section."""
    text = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 3, "the section shows the API, NannyML's steps and the port"
    return blocks[1].splitlines(), blocks[2].splitlines()


#: ``nannyml``'s data loader as NannyML defines it (``read_csv`` of its three files), over the files of its wheel:
#: the module the port imports (nothing else of nannyml is used)
NANNYML_DATA = """
import zipfile

import pandas as pd


def load_synthetic_car_loan_dataset():
    with zipfile.ZipFile({wheel!r}) as wheel:
        names = ("reference", "analysis", "analysis_target")
        return tuple(pd.read_csv(wheel.open(f"nannyml/datasets/data/synthetic_car_loan_{{n}}.csv")) for n in names)
"""
#: run after the port: what the test reads of its results
AFTER = """
estimated_performance.to_df().to_parquet("estimates.parquet")
import json
json.dump(estimated_performance.report(), open("report.json", "w"))
estimator.save("bundle")
analysis_df.to_parquet("analysis.parquet", index=False)
print(type(estimator).__name__, estimator.model, type(figure).__name__)
"""


def test_the_port_changes_at_most_ten_lines() -> None:
    theirs, ours = _code_blocks()
    diff = [d for d in difflib.ndiff(theirs, ours) if d[:2] in ("+ ", "- ")]
    changed = [d for d in diff if d.startswith("+ ")]
    assert 0 < len(changed) <= 10, changed
    # what stays is NannyML's: its data, and the names of its results
    kept = set(theirs) & set(ours)
    assert "reference_df, analysis_df, analysis_targets_df = nml.load_synthetic_car_loan_dataset()" in kept


def _run(tmp_path: Path, *argv: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_port_runs_on_nannymls_data_as_check_does(tmp_path: Path) -> None:
    if not WHEEL.is_file():
        pytest.skip("NannyML's wheel is missing: `make nannyml-wheel` downloads it (the version pinned)")
    (tmp_path / "nannyml.py").write_text(NANNYML_DATA.format(wheel=str(WHEEL)))
    _theirs, ours = _code_blocks()
    (tmp_path / "port.py").write_text("\n".join([*ours, AFTER]))
    assert _run(tmp_path, "port.py").splitlines()[-1] == "Bundle None Figure"

    df = pd.read_parquet(tmp_path / "estimates.parquet")
    assert df["n"].tolist() == [5000] * 10
    assert df["window_start"].tolist() == list(range(0, 50000, 5000))
    assert ((df["lower"] <= df["value"]) & (df["value"] <= df["upper"])).all()
    assert (tmp_path / "estimated_performance.png").stat().st_size > 0

    # the bundle read back estimates the same; `icos-agent check` over the same rows gives every chunk's estimates
    analysis = pd.read_parquet(tmp_path / "analysis.parquet")
    again = icos_agent.load(tmp_path / "bundle").estimate(analysis, window=5000, progress=False).to_df()
    pd.testing.assert_frame_equal(again, df, check_exact=False, rtol=0, atol=1e-12)
    argv = ["check", "--bundle", "bundle", "--data", "analysis.parquet", "--chunk-size", "5000", "--json"]
    chunks = json.loads(_run(tmp_path, "-m", "agent", *argv))["chunks"]
    windows = json.loads((tmp_path / "report.json").read_text())["windows"]
    assert len(chunks) == len(windows) == 10
    for chunk, window in zip(chunks, windows, strict=True):
        assert (chunk["start"], chunk["end"], chunk["n"]) == (window["start"], window["end"], window["n"])
        assert chunk["verdicts"] == window["verdicts"]
        for name, e in chunk["estimates"].items():
            for key in ("value", "lower", "upper"):
                assert window["estimates"][name][key] == pytest.approx(e[key], abs=1e-9), (name, key)
        assert chunk["trust"] == window["trust"]
