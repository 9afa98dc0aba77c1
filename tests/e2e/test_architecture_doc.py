"""docs/architecture.md stays true: every module, class and function it names exists, and every
subpackage of ``agent`` has a place in the layers contract that ``make lint`` enforces."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
NAME = re.compile(r"`((?:agent|invariants|exporters)(?:\.[A-Za-z_]\w*)+)")


#: Run in a fresh interpreter: the agent's gRPC messages would collide, in protobuf's pool, with the
#: tritonclient messages that other tests load into this process.
RESOLVE = """
import importlib, json, sys

def resolve(dotted):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)

missing = []
for dotted in json.loads(sys.stdin.read()):
    try:
        resolve(dotted)
    except (ModuleNotFoundError, AttributeError):
        missing.append(dotted)
print(json.dumps(missing))
"""


def test_every_name_in_the_map_exists() -> None:
    names = sorted(set(NAME.findall(DOC.read_text(encoding="utf-8"))))
    assert len(names) > 30
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE], input=json.dumps(names), capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    missing = json.loads(done.stdout)
    assert not missing, f"docs/architecture.md names what the code does not have: {missing}"


def test_every_agent_subpackage_sits_in_a_layer() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(
        c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers" and c["containers"] == ["agent"]
    )
    layered = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    packages = {p.parent.name for p in (ROOT / "agent").glob("*/__init__.py")}
    modules = {p.stem for p in (ROOT / "agent").glob("*.py")} - {"__init__", "__main__"}
    assert packages | modules == layered
    text = DOC.read_text(encoding="utf-8")
    for name in packages:
        assert f"`{name}/`" in text, f"docs/architecture.md does not place agent/{name}/"


def _lines(path: Path) -> int:
    files = [path] if path.is_file() else sorted(path.rglob("*.py"))
    return sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)


def test_the_line_counts_of_the_layers_table_hold() -> None:
    """Each package's stated line count is within 15% of its Python files' lines (rounded counts drift
    a little with every change; a package that doubled does not pass)."""
    text = DOC.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `") and "|" in line[3:]]
    checked = 0
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        if len(cells) < 3 or not re.fullmatch(r"[\d,]+( \\\| [\d,]+)*", cells[1]):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        counts = [int(c.replace(",", "")) for c in cells[1].split(" \\| ")]
        assert len(names) == len(counts), row
        for name, stated in zip(names, counts, strict=True):
            actual = _lines(ROOT / "agent" / name.rstrip("/"))
            assert abs(actual - stated) <= 0.15 * actual + 10, f"{name}: the map says {stated} lines, it holds {actual}"
            checked += 1
    assert checked >= 15


def test_each_walk_takes_at_most_five_steps() -> None:
    text = DOC.read_text(encoding="utf-8")
    for heading in ("## One V2 request", "## One label"):
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        steps = re.findall(r"^(\d+)\. ", section, re.M)
        assert steps and len(steps) <= 5, f"{heading}: {len(steps)} steps"
