"""Benchmark: hostile clients against a serving agent, measured from outside.

Each case starts a real agent (``python -m agent serve``, the shipped MNIST CNN, HTTP and gRPC on free
loopback ports, labels sampled at 10%, ``server.max_batch`` 1024 unless ``--max-batch``, the labelers'
and admin tokens set unless the case says otherwise), lets a hostile client act, and reports per step:
the request's size, the answers' statuses and the largest answer's size, the agent's resident memory
before, at its peak during the step (``VmHWM``, reset at the start, and 10 ms samples of ``VmRSS``) and
once it stops falling afterwards, the slowest liveness probe (``/v2/health/live`` every 50 ms) and the
slowest answer of another client sending batch-1 inferences meanwhile (both from another process),
and what the case is about:

* ``id-http``, ``id-grpc``: a 100 KiB request id with a batch of 256 (an answer may copy the id per
  prediction); ``id-http-huge``: a 1 MiB id with a batch of 1024 (``--huge-id-kb``,
  ``--huge-id-batch``), then a labeler's listing of the labeling sample those ids went into
  (``GET /v1/labels/requests?limit=1000``);
* ``parameters``: a 5 MB request parameter;
* ``datatypes``: INT64, FP64 and FP16 inputs for the FP32 model, HTTP and gRPC;
* ``labels-token``, ``labels-open``: 1,000 predictions; the real labeler reads the labeling sample; an
  attacker on another address (127.0.0.2, no token) reads it too and posts wrong labels for it (for
  every prediction when it cannot read it), then the labeler posts the truth; ``with_labels`` after
  each (``labels-open``: no labelers' token, and an admin drops the attacker's labels in between);
* ``guessing``: 2,000 wrong admin tokens from one address, then the right one from it and from another;
* ``burst-grpc``, ``burst-http``: 16 concurrent batches of 10240 images (~31 MiB each; past the default
  ``server.max_batch``, so the model runs them only with ``--max-batch 10240``); ``burst-model``: 16
  concurrent batches of ``server.max_batch`` images, which the model runs.

Targets (a row's last column names those missed): peak RSS ≤ 500 MB, every answer ≤ 2 × (request +
the model's whole output for its batch; a listing of the sample ≤ 2 MiB), liveness ≤ 1 s, every request
of the other clients answered 200.

    python -m bench.hostile.serving [--agent-root DIR] [--bundle DIR] [--cases a,b] [--quick]
        [--huge-id-kb 1024] [--huge-id-batch 1024] [--max-batch 1024] [--json FILE]
    python -m bench hostile_serving

``--agent-root DIR`` runs the agent of another checkout (``PYTHONPATH=DIR``, working directory DIR), so
the same script measures the code before its bounds (``git worktree add /tmp/old a91fb01``); without
``--bundle`` the bundle is fitted by that checkout's own ``fit`` (10 trees). ``--quick`` runs the small
cases at small sizes (the test does). With the defaults the code before the bounds peaks at about
3.5 GB (the 1 MiB id's answer); ``--max-batch 10240`` makes the bursts run the model (GBs on any code).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np

from bench.generated_docs import commit_of
from bench.hostile.serving_cases import (
    ADMIN_TOKEN,
    CASES,
    LABELS_TOKEN,
    MODEL,
    QUICK,
    Context,
    Sizes,
    agent_settings,
    binary_request,
    size,
)
from bench.hostile.serving_measure import Row, Runner, ServedAgent, SideClients

ROOT = Path(__file__).resolve().parents[2]
RSS_TARGET = 500_000_000
LIVENESS_TARGET = 1.0


def fit_bundle(root: Path, out: Path) -> Path:
    """A bundle of the shipped MNIST CNN, fitted by ``root``'s own ``fit`` command (10 trees)."""
    from agent.data.datasets import mnist_splits

    s = mnist_splits()
    np.savez(out.parent / "train.npz", x=s.train.x, y=s.train.y)
    np.savez(out.parent / "val.npz", x=s.val.x, y=s.val.y)
    model = root / "agent" / "shipped_models" / "mnist_cnn.onnx"
    cmd = [sys.executable, "-m", "agent", "fit", "--model", str(model), "--trees", "10", "--out", str(out)]
    cmd += ["--train", str(out.parent / "train.npz"), "--val", str(out.parent / "val.npz")]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"fit failed: {done.stderr[-2000:]}")
    return out


def missed_targets(row: Row) -> str:
    r, missed = row.result, []
    if row.rss_peak > RSS_TARGET:
        missed.append(f"RSS {row.rss_peak / 1e6:,.0f} MB")
    bound = r.bound()
    if bound is not None and r.answer_bytes > bound:
        if r.answer_bound == -1:
            missed.append(f"answer {r.answer_bytes / (r.request_bytes + r.output_bytes):,.0f}× request and output")
        else:
            missed.append(f"answer {size(r.answer_bytes)} > {size(bound)}")
    if row.side.live_max > LIVENESS_TARGET:
        missed.append(f"liveness {row.side.live_max:.1f} s")
    if row.side.live_failed or row.side.infer_failed:
        missed.append(f"{row.side.live_failed + row.side.infer_failed} other requests failed")
    if row.agent_exit is not None:
        missed.append(f"agent exited ({row.agent_exit})")
    return ", ".join(missed) or "met"


HEADER = (
    "| case | request | status | largest answer | s | RSS before → peak → after (MB) | liveness max (s) "
    "| batch-1 client max (s), ok/sent | outcome | targets missed |"
)


def table_row(row: Row) -> str:
    r, side = row.result, row.side
    mb = f"{row.rss_before / 1e6:,.0f} → {row.rss_peak / 1e6:,.0f} → "
    mb += "gone" if row.rss_after is None else f"{row.rss_after / 1e6:,.0f}"
    live = f"{side.live_max:.2f}" + (f" ({side.live_failed} failed)" if side.live_failed else "")
    infer = f"{side.infer_max:.2f}, {side.infer_n - side.infer_failed}/{side.infer_n}" if row.side_infer else "—"
    cells = [row.case, r.request, r.status, size(r.answer_bytes), f"{row.seconds:.1f}", mb, live, infer]
    cells += [r.outcome, missed_targets(row)]
    return "| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in cells) + " |"


def run_case(name: str, root: Path, bundle: Path, sizes: Sizes, data: tuple[np.ndarray, np.ndarray]) -> list[Row]:
    case = CASES[name]
    env = {"ICOS_AGENT_ADMIN_TOKEN": ADMIN_TOKEN}
    if case.labels_token:
        env["ICOS_AGENT_LABELS_TOKEN"] = LABELS_TOKEN
    with tempfile.TemporaryDirectory(prefix=f"hostile-serving-{name}-") as d:
        model = str(root / "agent" / "shipped_models" / "mnist_cnn.onnx")
        settings = agent_settings(model, str(bundle), str(Path(d) / "state"), sizes.max_batch)
        agent = ServedAgent(root, Path(d), settings, env).start()
        side = None
        try:
            body, headers = binary_request(data[0][:1])  # a first inference, so its one-off costs are not the case's
            httpx.post(f"{agent.url}/v2/models/{MODEL}/infer", content=body, headers=headers, timeout=60)
            side = SideClients(agent.url, MODEL, infer=case.side_infer)
            runner = Runner(agent, side, sizes.settle)
            case.run(runner, Context(agent, sizes, *data))
            return runner.rows
        finally:
            if side is not None:
                side.stop()
            agent.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.hostile.serving", description=__doc__.splitlines()[0])
    p.add_argument("--agent-root", type=Path, default=ROOT, help="checkout whose agent runs (default: this one)")
    p.add_argument("--bundle", type=Path, help="a bundle of the MNIST CNN that checkout can load (default: fit one)")
    p.add_argument("--cases", help=f"comma-separated, of: {', '.join(CASES)} (default: all; --quick: the quick ones)")
    p.add_argument("--quick", action="store_true", help="the quick cases at small sizes")
    p.add_argument("--huge-id-kb", type=int, default=1024, help="id-http-huge's id in KiB (default 1024)")
    p.add_argument("--huge-id-batch", type=int, default=1024, help="id-http-huge's batch (default 1024)")
    p.add_argument("--max-batch", type=int, default=1024, help="server.max_batch of every case (default 1024)")
    p.add_argument("--json", type=Path, help="also write the rows to this file")
    args = p.parse_args(argv)
    root = args.agent_root.resolve()
    names = args.cases.split(",") if args.cases else [n for n, c in CASES.items() if c.quick or not args.quick]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown case(s): {', '.join(unknown)}; choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    if not (root / "agent" / "__main__.py").is_file():
        print(f"--agent-root {root}: no agent package there; name a checkout of this project", file=sys.stderr)
        return 2
    sizes = replace(
        QUICK if args.quick else Sizes(),
        huge_id=args.huge_id_kb * 1024,
        huge_id_batch=args.huge_id_batch,
        max_batch=args.max_batch,
    )
    from agent.data.datasets import mnist_splits

    test = mnist_splits().test
    data = (np.ascontiguousarray(test.x, np.float32), np.asarray(test.y))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="hostile-serving-bundle-") as d:
        bundle = args.bundle or fit_bundle(root, Path(d) / "bundle")
        print(f"command: python -m bench.hostile.serving {shlex.join(argv)}".rstrip())
        print(f"agent code: {root} at {commit_of(root)}; benchmark at {commit_of(ROOT)}")
        print(
            f"machine: {os.cpu_count()} cores, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 1e9:.0f} GB"
        )
        print()
        print(HEADER)
        print("|" + "---|" * HEADER.count(" | ") + "---|")
        for name in names:
            case_rows = run_case(name, root, bundle, sizes, data)
            for row in case_rows:
                print(table_row(row), flush=True)
            rows += case_rows
    if args.json:
        args.json.write_text(json.dumps([{"case": r.case, **r.as_dict(), "missed": missed_targets(r)} for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
