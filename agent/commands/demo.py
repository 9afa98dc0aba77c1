"""``icos-agent demo``: the whole story on the shipped MNIST CNN."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("demo", help="fit invariants for the shipped MNIST CNN and compare estimates with the truth")
    p.add_argument("--state-dir", default="icos-state", help="where the fitted bundle is kept (default ./icos-state)")
    p.add_argument("--refit", action="store_true", help="fit the invariants again even if a bundle exists")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from agent.demo import run_demo

    return run_demo(state_dir=args.state_dir, refit=args.refit, seed=args.seed)
