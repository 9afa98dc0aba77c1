"""The benchmarks import the project as packages (run as ``python -m bench...`` from the repository root):
none edits ``sys.path`` to find it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _edits_sys_path(tree: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
        for node in ast.walk(tree)
    )


def test_no_benchmark_edits_sys_path() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "bench").rglob("*.py"))
        if _edits_sys_path(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not offenders, f"import the project as a package instead: {offenders}"


def test_the_check_sees_an_edit() -> None:
    assert _edits_sys_path(ast.parse("import sys\nsys.path.insert(0, '.')"))
    assert not _edits_sys_path(ast.parse("import os\nos.path.join('a', 'b')"))


def test_a_benchmark_runs_as_a_module_from_the_root() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.serving", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
