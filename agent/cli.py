"""``icos-agent``: the command-line entry point.

Sub-commands live in :mod:`agent.commands`; each registers its own parser. User mistakes end with
one clear line on stderr and exit code 2; ``ICOS_AGENT_DEBUG=1`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from agent import __version__
from agent.commands import COMMAND_MODULES
from agent.errors import user_error_types


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="icos-agent",
        description="Label-free operational accuracy monitoring for ONNX classifiers (ICOS likely invariants).",
    )
    parser.add_argument("--version", action="version", version=f"icos-agent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        print("icos-agent: interrupted", file=sys.stderr)
        return 130
    except user_error_types() as exc:
        if os.environ.get("ICOS_AGENT_DEBUG"):
            raise
        msg = str(exc) or type(exc).__name__
        if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError) and exc.filename:
            msg = f"{exc.strerror}: {exc.filename}"
        print(f"icos-agent {args.command}: error: {msg}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
