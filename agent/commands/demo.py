"""``icos-agent demo``: the whole story on the shipped MNIST CNN (see :mod:`agent.demo`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="run the agent on the shipped MNIST CNN with live traffic, estimates vs truth, audits, MLflow, a report",
        description=(
            "Fit (or load) the invariants of the shipped MNIST CNN, start the agent on 127.0.0.1, replay live "
            "traffic in phases (in distribution, label shift, translation and noise drift, recovery) and show "
            "every estimate beside the truth; then run a D-Score, a mutation and a metamorphic audit, log "
            "everything to MLflow and write an HTML report."
        ),
    )
    p.add_argument(
        "--state-dir", default="icos-state", help="bundle, agent config, MLflow store (default ./icos-state)"
    )
    p.add_argument(
        "--report-dir", default="demo-report", help="where index.html and its plots go (default ./demo-report)"
    )
    p.add_argument("--quick", action="store_true", help="reduced mode: 250 images per phase, smaller audits")
    p.add_argument("--serve", action="store_true", help="keep the agent running after the story (Ctrl-C stops it)")
    p.add_argument("--port", type=int, help="the agent's port on 127.0.0.1 (default: a free port)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fit and of the traffic (default 0)")
    p.add_argument("--refit", action="store_true", help="fit the invariants again even if the state dir has a bundle")
    p.add_argument(
        "--no-live",
        action="store_true",
        help="plain line output instead of the live table (automatic when not a terminal)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # lazy: keeps httpx, pydantic and numpy out of CLI start-up
    from agent.demo import DemoOptions, run_demo
    from agent.demo.live import LiveView

    if args.port is not None and not 1 <= args.port <= 65535:
        raise UserError("--port must be within 1..65535")
    opts = DemoOptions(
        state_dir=Path(args.state_dir),
        report_dir=Path(args.report_dir),
        quick=args.quick,
        serve=args.serve,
        port=args.port,
        seed=args.seed,
        refit=args.refit,
        live=LiveView.wanted(args.no_live),
    )
    return run_demo(opts)
