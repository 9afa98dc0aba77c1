"""Benchmark: what reading the fleet's labels from the shared PostgreSQL store costs the fleet evaluator
per refresh, as a function of the labeled predictions in its longest window.

A PostgreSQL server is started for the run (``tests/support/postgres.py``, ``fsync=on``). Predictions of
one model identity (10 classes, with the ``shift_aware`` extras, a third of them in the labeling sample)
are written through :class:`agent.labels.store.PredictionStore` over the last hour, every one labeled,
beside as many predictions of another identity (which the read must skip by the index). Then
:meth:`agent.fleet.labels.FleetLabels.read` — the evaluator's read: one capped range query, the rows
decoded, the realized windows and the labeling-sample sums of the 5m and 1h windows — runs ``--repeat``
times at each row cap.

Prints, per cap: rows read, the best and median wall time of a read, and the time per row.

    python -m bench.fleet.labels [--labels 50000] [--repeat 5] [--out docs/labels.md]
    python -m bench fleet_labels
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from agent.estimation.calibration import EstimatorCalibration
from agent.fleet.labels import FleetLabels
from agent.labels.postgres_backend import PostgresBackend
from agent.labels.rows import PendingBatch
from agent.labels.store import PredictionStore
from bench.generated_docs import provenance, write_block

ROOT = Path(__file__).resolve().parents[2]

K = 10
IDENTITY = "0123456789abcdef:fedcba9876543210"
OTHER = "aaaaaaaaaaaaaaaa:bbbbbbbbbbbbbbbb"
WINDOWS = {"5m": 300.0, "1h": 3600.0}
PER_REQUEST = 100
#: The block of docs/labels.md this benchmark rewrites (``--out docs/labels.md``).
DOC_BEGIN = "<!-- BEGIN GENERATED: python -m bench.fleet.labels --out docs/labels.md -->"
CAL = EstimatorCalibration(tpr=0.6, fpr=0.05, n_wrong=100, n_right=900, accuracy=0.9, avg_conf=0.92, atc_threshold=0.7)


def fill(store: PredictionStore, n: int, at: float, rng: np.random.Generator) -> None:
    """``n`` labeled predictions of :data:`IDENTITY` spread over the hour before ``at``, and ``n``
    unlabeled ones of :data:`OTHER`."""
    labels: list[tuple[str, int]] = []
    for r in range(0, n, PER_REQUEST):
        m = min(PER_REQUEST, n - r)
        ts = at - 3600.0 * (1 - (r + 0.5) / n)
        for identity, rid in ((IDENTITY, f"m-{r}"), (OTHER, f"o-{r}")):
            p = rng.dirichlet(np.ones(K), m).astype(np.float32)
            sampled = np.flatnonzero(rng.random(m) < 1 / 3)
            extras = rng.normal(size=(m, 5))
            store.enqueue(PendingBatch(rid, ts, identity, p, p.argmax(axis=1), np.zeros(m, np.int8), extras, sampled))
        labels += [(f"m-{r}:{i}", int(rng.integers(K))) for i in range(m)]
        if len(labels) >= 10_000:
            store.flush(now=at)
            store.apply_labels(labels, now=at)
            labels = []
    store.flush(now=at)
    if labels:
        store.apply_labels(labels, now=at)


def timed_reads(backend: PostgresBackend, cap: int, at: float, repeat: int) -> dict[str, float]:
    """``repeat`` reads at row cap ``cap``: rows read, best and median seconds."""
    labels = FleetLabels(backend, IDENTITY, WINDOWS, cap, [str(k) for k in range(K)], per_class_cap=20)
    times, rows = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        read = labels.read(at, CAL)
        times.append(time.perf_counter() - t0)
        rows = read.rows
    return {"cap": cap, "rows": rows, "best_s": min(times), "median_s": statistics.median(times)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--labels", type=int, default=50_000, help="labeled predictions of the model in the hour")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="rewrite this page's generated block with the table")
    args = ap.parse_args(argv)
    from tests.support.postgres import running_postgres

    at = time.time()
    rng = np.random.default_rng(0)
    caps = sorted({min(c, args.labels) for c in (1_000, 10_000, args.labels)})
    with running_postgres(fsync=True) as pg:
        store = PredictionStore(None, max_predictions=10 * args.labels, max_age_seconds=1e9, store_url=pg.url)
        store.open()
        fill(store, args.labels, at, rng)
        store.stop()
        backend = PostgresBackend(pg.url, max_predictions=10 * args.labels, max_age_seconds=1e9, pool_size=1)
        backend.open()
        try:
            results = [timed_reads(backend, cap, at, args.repeat) for cap in caps]
        finally:
            backend.close()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"fleet label read: {args.labels} labeled predictions in the hour (K={K}), windows 5m and 1h")
    print(f"{'cap':>8} {'rows':>8} {'best s':>8} {'median s':>9} {'us/row':>7}")
    for r in results:
        per_row = 1e6 * r["best_s"] / max(r["rows"], 1)
        print(f"{r['cap']:>8.0f} {r['rows']:>8.0f} {r['best_s']:>8.3f} {r['median_s']:>9.3f} {per_row:>7.1f}")
    if args.out is not None:
        write_block(args.out, DOC_BEGIN, markdown(results, args))
        print(f"wrote {args.out}")
    return 0


def markdown(results: list[dict[str, float]], args: argparse.Namespace) -> str:
    """The table of docs/labels.md's generated block."""
    command = "python -m bench.fleet.labels --out docs/labels.md"
    if args.labels != 50_000 or args.repeat != 5:
        command += f" --labels {args.labels} --repeat {args.repeat}"
    lines = [
        provenance(command, ROOT),
        "",
        f"{args.labels} labeled predictions of the model over the hour before the read ({K} classes, a third of",
        "them in the labeling sample), beside as many of another model; windows 5m and 1h; PostgreSQL on the",
        f"same machine; best and median of {args.repeat} reads.",
        "",
        "| row cap | rows read | best read, s | median read, s | µs per row |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        per_row = 1e6 * r["best_s"] / max(r["rows"], 1)
        lines.append(f"| {r['cap']:.0f} | {r['rows']:.0f} | {r['best_s']:.3f} | {r['median_s']:.3f} | {per_row:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
