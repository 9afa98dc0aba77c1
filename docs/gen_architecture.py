"""Refresh the line counts of the layers table in ``docs/architecture.md`` from the code.

    python docs/gen_architecture.py     # rewrite the counts (rounded to tens)

The prose of the page is written by hand; only the ``lines`` column is generated. A test
(``tests/e2e/test_architecture_doc.py``) fails when a count is more than 15% off.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
COUNTS = re.compile(r"[\d,]+( \\\| [\d,]+)*")


def lines_of(name: str) -> int:
    """Lines of the Python files of ``agent/<name>`` (a package, recursively, or one module)."""
    path = ROOT / "agent" / name.rstrip("/")
    files = [path] if path.is_file() else sorted(path.rglob("*.py"))
    return sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)


def refreshed(text: str) -> str:
    out = []
    for line in text.splitlines():
        cells = line.strip("|").split(" | ") if line.startswith("| `") else []
        if len(cells) >= 3 and COUNTS.fullmatch(cells[1].strip()):
            names = re.findall(r"`([^`]+)`", cells[0])
            cells[1] = " \\| ".join(f"{round(lines_of(n), -1):,}" for n in names)
            line = "|" + " | ".join(cells) + "|"
        out.append(line)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    DOC.write_text(refreshed(DOC.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {DOC}")
