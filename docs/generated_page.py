"""The command line shared by the docs generators: write the page, or ``--check`` that it is current."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def main(out: Path, render: Callable[[], str], description: str, argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help=f"fail when docs/{out.name} is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not out.exists() or out.read_text(encoding="utf-8") != text:
            print(f"{out} is stale: run `python docs/{Path(sys.argv[0]).name}`", file=sys.stderr)
            return 1
        return 0
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    return 0
