"""One tree of exception types: every one the agent defines derives from a kind of ``agent/errors.py``, and
the tree drawn in that module's docstring is the tree of the code, ``invariants`` and ``exporters`` included
(a new type, or one moved, fails here until the drawing shows it; the message holds the drawing to paste)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import agent.errors

ROOT = Path(__file__).resolve().parents[2]

#: Run in a fresh interpreter: it imports every module that defines an exception type, and the agent's gRPC
#: messages would collide, in protobuf's pool, with the tritonclient messages other tests load. Prints, for
#: each exception type of the three packages, its place, its bases and whether it derives from a kind.
COLLECT = """
import ast, builtins, importlib, json, pathlib, sys
from agent.errors import Abort, DamagedData, Unavailable, UserError

KINDS = (UserError, Unavailable, DamagedData, Abort)
found = []
for package in ("agent", "invariants", "exporters"):
    for path in sorted(pathlib.Path(package).rglob("*.py")):
        if "grpc_stubs" in path.parts:
            continue
        module = ".".join(path.with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.bases:
                found.append((module, node.name, node.lineno))
out = []
for module, name, line in found:
    cls = getattr(importlib.import_module(module), name, None)
    if cls is None:
        out.append({"module": module, "name": name, "nested": True})
        continue
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        continue
    out.append({
        "module": module,
        "name": name,
        "line": line,
        "bases": [[b.__module__, b.__qualname__] for b in cls.__bases__],
        "kind": issubclass(cls, KINDS),
    })
json.dump(out, sys.stdout)
"""


def _collect() -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", COLLECT], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return [e for e in json.loads(done.stdout) if not e.get("nested")]


def _display(module: str, name: str) -> str:
    return name if module == "builtins" else f"{module}.{name}"


def draw(types: list[dict[str, Any]]) -> list[str]:
    """The tree: each type under its first base among the packages' types (else under its first base, a
    Python or library type drawn as a root), its other bases in parentheses, its module on the right."""
    ours = {(t["module"], t["name"]): t for t in types}
    children: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    roots: list[tuple[str, str]] = []
    for t in types:
        bases = [tuple(b) for b in t["bases"]]
        parent = next((b for b in bases if b in ours), bases[0])
        t["others"] = [_display(*b) for b in bases if b != parent]
        children[parent].append(t)
        if parent not in ours and parent not in roots:
            roots.append(parent)

    def order(t: dict[str, Any]) -> tuple[bool, str, int]:
        return t["module"] != "agent.errors", t["module"], t["line"]

    rows: list[tuple[str, str]] = []

    def walk(key: tuple[str, str], prefix: str) -> None:
        kids = sorted(children[key], key=order)
        for i, t in enumerate(kids):
            last = i == len(kids) - 1
            also = f" ({', '.join(t['others'])})" if t["others"] else ""
            rows.append((f"{prefix}{'└── ' if last else '├── '}{t['name']}{also}", t["module"]))
            walk((t["module"], t["name"]), prefix + ("    " if last else "│   "))

    for root in sorted(roots, key=lambda r: (r != ("builtins", "Exception"), _display(*r))):
        rows.append((_display(*root), ""))
        walk(root, "")
    width = max(len(left) for left, _ in rows) + 2
    return [f"{left:<{width}}{module}".rstrip() for left, module in rows]


def test_every_exception_of_the_agent_derives_from_a_kind_and_the_docstring_draws_the_tree() -> None:
    types = _collect()
    outside = [f"{t['module']}.{t['name']}" for t in types if t["module"].startswith("agent.") and not t["kind"]]
    assert not outside, f"derive these from a kind of agent/errors.py: {outside}"
    names = [t["name"] for t in types]
    assert len(names) == len(set(names)), "two exception types share a name"
    block = "\n".join(f"    {line}" for line in draw(types))
    stale = "the tree in agent/errors.py's docstring is stale; it is now:\n"
    assert block in (agent.errors.__doc__ or ""), stale + block


def test_the_drawing_nests_a_type_under_its_first_base_of_the_packages() -> None:
    types = [
        {"module": "agent.errors", "name": "UserError", "line": 2, "bases": [["builtins", "Exception"]]},
        {
            "module": "agent.x",
            "name": "Leaf",
            "line": 9,
            "bases": [["agent.errors", "UserError"], ["builtins", "ValueError"]],
        },
        {"module": "invariants.y", "name": "Pure", "line": 1, "bases": [["builtins", "ValueError"]]},
    ]
    assert draw(types) == [
        "Exception",
        "└── UserError              agent.errors",
        "    └── Leaf (ValueError)  agent.x",
        "ValueError",
        "└── Pure                   invariants.y",
    ]
