"""Benchmark: the sustained write rate of the PostgreSQL prediction store against the SQLite one,
measured in the same run, and the bytes each stored prediction takes.

Both stores are :class:`agent.labels.store.PredictionStore` as the agent runs them: SQLite in a
temporary state directory (WAL, ``synchronous=NORMAL``), PostgreSQL started here for the run
(``initdb`` in a temporary directory, ``fsync=on``, on a free loopback port; see
``tests/support/postgres.py``; as root the cluster belongs to the ``postgres`` user). The
writer is driven directly: each flush writes ``--requests-per-flush`` queued requests (one prediction
of 10 classes each, with the ``shift_aware`` extras, as the serve path queues them) in one
transaction, as one replica at that request rate does every second; flushes follow each other for
``--seconds``. Eviction is off (bounds far away), so the rate is the insert path's.

Prints predictions written per second for each store, the ratio PostgreSQL ÷ SQLite, and the
storage per prediction (PostgreSQL: table and index sizes; SQLite: the file).

    python -m bench.bench_store [--seconds 5] [--requests-per-flush 100]
    python -m bench store
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from agent.labels.rows import PendingBatch
from agent.labels.store import PredictionStore

K = 10


def batches(n: int, start: int, rng: np.random.Generator) -> list[PendingBatch]:
    p = rng.dirichlet(np.ones(K), n).astype(np.float32)
    extras = rng.normal(size=(n, 5))
    now = time.time()
    return [
        PendingBatch(
            f"req-{start + i:012d}",
            now,
            "mnist:1:0123456789abcdef",
            p[i : i + 1],
            p[i : i + 1].argmax(axis=1),
            np.asarray([i % 4], np.int8),
            extras[i : i + 1],
        )
        for i in range(n)
    ]


def sustained(store: PredictionStore, per_flush: int, seconds: float) -> tuple[float, int]:
    """Predictions written per second over ``seconds`` of back-to-back flushes, and the total."""
    rng = np.random.default_rng(0)
    pre = [batches(per_flush, k * per_flush, rng) for k in range(8)]  # made before timing
    written, k = 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for b in pre[k % len(pre)]:
            store.enqueue(replace(b, request_id=f"{b.request_id}-{k}"))  # every request id new
        written += store.flush()
        k += 1
    return written / (time.perf_counter() - t0), written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="measuring time per store")
    ap.add_argument("--requests-per-flush", type=int, default=100, help="requests written per transaction")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from tests.support.postgres import running_postgres

    bounds = {"max_predictions": 100_000_000, "max_age_seconds": 1e9, "queue_limit": 10_000_000}
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, running_postgres(fsync=True) as pg:
        lite = PredictionStore(Path(tmp), **bounds)  # type: ignore[arg-type]
        lite.open()
        rate, n = sustained(lite, args.requests_per_flush, args.seconds)
        lite.stop()
        size = sum(f.stat().st_size for f in Path(tmp).glob("predictions.sqlite3*"))
        out["sqlite"] = {"predictions_per_s": rate, "predictions": n, "bytes_per_prediction": size / n}
        pgs = PredictionStore(None, store_url=pg.url, **bounds)  # type: ignore[arg-type]
        pgs.open()
        rate, n = sustained(pgs, args.requests_per_flush, args.seconds)
        per = args.requests_per_flush
        flushes = max(1, min(n // per, 5000 // per))  # label up to 5,000 predictions of the first flushes
        labels = [(f"req-{(k % 8) * per + i:012d}-{k}:0", i % K) for k in range(flushes) for i in range(per)]
        outcome = pgs.apply_labels(labels, time.time())
        pgs.stop()
        import psycopg

        with psycopg.connect(pg.url) as conn:
            sizes = conn.execute(
                "SELECT pg_total_relation_size('icos_requests'), pg_total_relation_size('icos_labels')"
            ).fetchone()
        assert sizes is not None
        out["postgresql"] = {
            "predictions_per_s": rate,
            "predictions": n,
            "bytes_per_prediction": sizes[0] / n,
            "bytes_per_label": sizes[1] / max(outcome.n_accepted, 1),
            "labels": outcome.n_accepted,
        }
    ratio = out["postgresql"]["predictions_per_s"] / out["sqlite"]["predictions_per_s"]
    if args.json:
        print(json.dumps({**out, "postgresql_over_sqlite": ratio}, indent=2))
        return 0
    print(f"prediction store, {args.requests_per_flush} requests (1 prediction, K={K}) per transaction")
    print(f"{'store':<11} {'pred/s':>9} {'written':>9} {'bytes/pred':>11}")
    for name, r in out.items():
        print(f"{name:<11} {r['predictions_per_s']:>9.0f} {r['predictions']:>9.0f} {r['bytes_per_prediction']:>11.0f}")
    pgr = out["postgresql"]
    print(f"PostgreSQL labels table: {pgr['bytes_per_label']:.0f} bytes per label ({pgr['labels']:.0f} labeled)")
    print(f"PostgreSQL / SQLite write rate: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
