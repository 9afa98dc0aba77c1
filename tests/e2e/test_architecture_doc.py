"""docs/architecture.md stays true: every module, class and function it names exists, and every
subpackage of ``agent`` has a place in the layers contract that ``make lint`` enforces."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
NAME = re.compile(r"`((?:agent|invariants|exporters)(?:\.[A-Za-z_]\w*)+)")


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_every_name_in_the_map_exists() -> None:
    names = sorted(set(NAME.findall(DOC.read_text(encoding="utf-8"))))
    assert len(names) > 30
    missing = []
    for dotted in names:
        try:
            _resolve(dotted)
        except (ModuleNotFoundError, AttributeError):
            missing.append(dotted)
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
