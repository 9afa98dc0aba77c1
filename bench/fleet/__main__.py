"""The fleet evaluator's refresh against Prometheus and VictoriaMetrics holding many simulated replicas.

Simulates ``--replicas`` agents (default 1,000) at ``--rate`` predictions per second each (default
100), scraped every ``--scrape`` seconds for 1 h 10 min: every replica's ``icos_window_stat_total``
series (the statistics one agent exports for a 10-class model, with a bundle's per-input statistics
when ``--bundle`` has a ``shift_aware`` part and its per-segment sums, change sums included, when it has
segments), one replica
in twenty restarting once mid-hour (a counter reset). The samples are written once, as OpenMetrics for
``promtool tsdb create-blocks-from openmetrics`` (a real Prometheus then serves the blocks) and in
Prometheus's text format for VictoriaMetrics's ``/api/v1/import/prometheus``: both stores hold every
replica's series.

Prints, per store, for the 5m and 1h windows of one ``FleetEvaluator.evaluate`` (every query and every
estimator): its wall time (best of ``--repeat``), its queries, the evaluator's own CPU, and the error
of the summed prediction count against the simulated truth; beside it the same sums by ``increase()``
(one query per window) with their own error. Then a Markdown table of both; ``--out docs/scaling.md``
rewrites that page's generated block with it.

Run: ``python -m bench.fleet [--replicas 1000] [--bundle DIR] [--backends prometheus,victoria-metrics]``
(needs ``prometheus``, ``promtool`` and ``victoria-metrics``: ``make system-tools``). Without
``--bundle`` the estimators run with a calibration that has no ``shift_aware`` part and the replicas
export no per-input statistics (fewer series per replica).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from agent.config.settings import AgentSettings
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.segments.segmentation import Segmentation
from agent.estimation.segments.sketch import CLIP
from agent.estimation.statistics.items import stat_items
from agent.estimation.statistics.reference import InputReference
from agent.estimation.statistics.window import SampleExtras, WindowStats
from agent.fleet.evaluator import FleetEvaluator
from agent.fleet.prometheus_api import PrometheusAPI
from agent.fleet.window_sums import STAT_METRIC, range_plan
from bench.generated_docs import provenance, write_block
from invariants.bundle import Bundle
from tests.support.prometheus import PrometheusServer
from tests.support.victoria import VictoriaMetricsServer

WINDOWS = {"5m": 300.0, "1h": 3600.0}
SPAN = 70 * 60  # the longest window, its lookback and a margin
MODEL, VERSION = "mnist", "1"
ROOT = Path(__file__).resolve().parents[2]
#: The generated block of docs/scaling.md this benchmark rewrites (``--out``).
BEGIN = "<!-- BEGIN GENERATED: python -m bench.fleet --out docs/scaling.md -->"
#: The programs each store needs.
TOOLS = {"prometheus": ("prometheus", "promtool"), "victoria-metrics": ("victoria-metrics",)}


def _calibration(bundle: Path | None) -> tuple[EstimatorCalibration, InputReference | None, str]:
    """The estimators' calibration and its input reference (None without a ``shift_aware`` part: the
    replicas then export no per-input statistics)."""
    if bundle is not None:
        b = Bundle.load(bundle)
        cal = EstimatorCalibration.from_dict(b.estimator_calibration)
        return cal, cal.shift.reference if cal.shift is not None else None, "bundle " + str(bundle)
    cal = EstimatorCalibration.from_dict(
        {
            "tpr": 0.8,
            "fpr": 0.05,
            "n_wrong": 200,
            "n_right": 1300,
            "accuracy": 0.95,
            "avg_conf": 0.96,
            "atc_threshold": 0.7,
        }
    )
    return cal, None, "synthetic calibration (no shift_aware part)"


def _segment_sums(stats: WindowStats, segments: Segmentation | None, rng: np.random.Generator) -> WindowStats:
    """``stats`` with the per-segment sums of its predictions spread at random over the bundle's segments (and
    the sums of its change columns, when it has them)."""
    if segments is None:
        return stats
    n = stats.n
    ids = np.stack(
        [
            off + rng.integers(0, len(d.segments), n)
            for d, off in zip(segments.dimensions, segments.offsets, strict=True)
        ]
    )
    conf = np.full(n, stats.conf_sum / n if n else 0.0)
    stats.add_segment_sums(ids, segments.size, conf, np.zeros(n, np.int8), rng.random(n) < 0.01)
    columns, _ = segments.change_sizes
    if columns and n:  # what changed where: the change columns' sums, as a replica exports them
        z = np.clip(rng.normal(CLIP, 1.0, (n, columns)), 0.0, 2 * CLIP)
        stats.add_change_sums(ids, segments.size, z, segments.change_cross(z))
    return stats


def _templates(
    ref: InputReference | None,
    per_scrape: int,
    rng: np.random.Generator,
    segments: Segmentation | None = None,
    k: int = 32,
) -> list[list[float]]:
    """``k`` statistics of one scrape interval's predictions, as flat values in :func:`stat_items` order."""
    out = []
    for _ in range(k):
        n = int(rng.poisson(per_scrape))
        extras = None
        if ref is not None:
            extras = SampleExtras(
                margin=rng.random(n),
                rules=rng.integers(0, ref.n_rules, n),
                agree=rng.random(n) < 0.9,
                covered=rng.random(n) < 0.6,
                pca_error=rng.random(n) * 0.3,
                label=rng.integers(0, ref.n_classes or 10, n),
            )
        conf = np.clip(rng.beta(20, 1.5, n), 0, 1)
        verdicts = np.where(rng.random(n) < 0.08, rng.integers(1, 4, n), 0)
        s = _segment_sums(WindowStats.of_samples(verdicts, conf, 0.7, extras, ref), segments, rng)
        out.append([v for _, v in stat_items(s)])
    return out


def _write_series(
    om: Path | None,
    text: Path | None,
    replicas: int,
    scrape: int,
    end: int,
    ref: InputReference | None,
    rate: float,
    segments: Segmentation | None = None,
) -> dict[str, float]:
    """The simulated series, as OpenMetrics (``om``, seconds: promtool's input) and Prometheus's text
    format (``text``, milliseconds: VictoriaMetrics's import), each only where a store that reads it is
    measured (None: not written; at 1,000 replicas of a bundle with segments each is tens of GB); returns the
    true prediction count of each window ending at the evaluation time."""
    rng = np.random.default_rng(1)
    templates = _templates(ref, int(rate * scrape), rng, segments)
    names = [k for k, _ in stat_items(_sample_stats(ref, segments))]
    steps = SPAN // scrape
    times = end - scrape * np.arange(steps, -1, -1)
    stamps_s = [str(int(t)) for t in times]
    stamps_ms = [str(int(t) * 1000) for t in times]
    truth = dict.fromkeys(WINDOWS, 0.0)
    n_index = names.index("n")
    at = _evaluation_time(end, scrape)
    with contextlib.ExitStack() as stack:
        f = stack.enter_context(om.open("w", encoding="utf-8")) if om is not None else None
        g = stack.enter_context(text.open("w", encoding="utf-8")) if text is not None else None
        if f is not None:
            f.write(f"# TYPE {STAT_METRIC.removesuffix('_total')} counter\n")
        for r in range(replicas):
            picks = rng.integers(0, len(templates), steps + 1)
            incs = np.asarray([templates[i] for i in picks])  # [steps+1, stats]
            incs[0] = 0.0
            values = np.cumsum(incs, axis=0)
            if r % 20 == 7:  # 5% of the replicas restart once mid-hour: counters from zero again
                cut = steps - int(1800 // scrape) + r % 11
                values[cut:] = np.cumsum(incs[cut:], axis=0)
            for name, tw in WINDOWS.items():
                truth[name] += float(incs[(times > at - tw) & (times <= at), n_index].sum())
            labels = f'model="{MODEL}",version="{VERSION}",bundle="b",job="icos-agent",instance="r{r:04d}"'
            for j, stat in enumerate(names):
                head = f'{STAT_METRIC}{{{labels},stat="{stat}"}} '
                col = [f"{v:.17g}" for v in values[:, j].tolist()]
                if f is not None:
                    f.writelines(f"{head}{v} {t}\n" for t, v in zip(stamps_s, col, strict=True))
                if g is not None:
                    g.writelines(f"{head}{v} {t}\n" for t, v in zip(stamps_ms, col, strict=True))
        if f is not None:
            f.write("# EOF\n")
    return truth


def _evaluation_time(end: int, scrape: int) -> float:
    """When the refresh runs: between two scrapes, as in production (not on a sample's timestamp)."""
    return end - 0.4 * scrape


def _sample_stats(ref: InputReference | None, segments: Segmentation | None = None) -> WindowStats:
    rng = np.random.default_rng(2)
    if ref is None:
        return _segment_sums(WindowStats.of_samples(np.zeros(4), np.ones(4), 0.7), segments, rng)
    extras = SampleExtras(
        rng.random(4),
        rng.integers(0, ref.n_rules, 4),
        rng.random(4) < 1,
        rng.random(4) < 1,
        rng.random(4),
        rng.integers(0, 10, 4),
    )
    return _segment_sums(WindowStats.of_samples(np.zeros(4), np.ones(4), 0.7, extras, ref), segments, rng)


@contextlib.contextmanager
def _prometheus(root: Path, om: Path, samples: int) -> Iterator[str]:
    """A real Prometheus serving ``om`` turned into TSDB blocks by promtool, allowed to load the ``samples`` a
    refresh reads at once (``--query.max-samples``, 50 million by default); yields its URL."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    assert prometheus is not None and promtool is not None
    tsdb = root / "tsdb"
    tsdb.mkdir()
    t0 = time.perf_counter()
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(f"prometheus: blocks written ({time.perf_counter() - t0:.0f} s)", flush=True)
    flags = [f"--query.max-samples={max(50_000_000, 2 * samples)}"]
    server = PrometheusServer(root, {"global": {"scrape_interval": "1m"}}, retention=None, flags=flags)
    server.start(timeout=300)
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def _victoria_metrics(root: Path, text: Path, series: int) -> Iterator[str]:
    """A real single-node VictoriaMetrics holding ``text`` (imported through ``/api/v1/import/prometheus``
    in parts of about 16 MB), allowed to match the ``series`` one query selects (``-search.maxUniqueTimeseries``,
    300,000 or less by default, by memory); yields its URL."""
    (root / "vm").mkdir()
    flags = [f"-search.maxUniqueTimeseries={max(300_000, 2 * series)}"]
    server = VictoriaMetricsServer(root / "vm", flags=flags).start()
    try:
        t0 = time.perf_counter()
        with text.open("rb") as f, httpx.Client(timeout=600) as client:
            while part := f.read(16 << 20):
                part += f.readline()  # whole lines only
                client.post(f"{server.url}/api/v1/import/prometheus", content=part).raise_for_status()
            client.get(f"{server.url}/internal/force_flush").raise_for_status()
        print(f"victoria-metrics: samples imported ({time.perf_counter() - t0:.0f} s)", flush=True)
        yield server.url
    finally:
        server.stop()


BACKENDS = {"prometheus": _prometheus, "victoria-metrics": _victoria_metrics}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=100.0, help="predictions per second per replica")
    ap.add_argument("--scrape", type=int, default=30, help="scrape interval of the simulated series (s)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--bundle", type=Path, default=None, help="a bundle whose calibration the estimators use")
    ap.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, of {', '.join(BACKENDS)}")
    ap.add_argument("--out", type=Path, default=None, help="rewrite this page's generated block (docs/scaling.md)")
    args = ap.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        ap.error(f"--backends: unknown {unknown}; known: {', '.join(BACKENDS)}")
    missing = [tool for b in backends for tool in TOOLS[b] if shutil.which(tool) is None]
    if missing:
        print(f"needs {', '.join(missing)} (Debian: `make system-tools`)", file=sys.stderr)
        return 2
    cal, ref, what = _calibration(args.bundle)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        root = Path(tmp)
        end = int(time.time()) // 60 * 60 - 120
        t0 = time.perf_counter()
        om = root / "series.om" if "prometheus" in backends else None
        text = root / "series.prom" if "victoria-metrics" in backends else None
        truth = _write_series(om, text, args.replicas, args.scrape, end, ref, args.rate, cal.segments)
        series = args.replicas * len(list(stat_items(_sample_stats(ref, cal.segments))))
        written = next(p for p in (om, text) if p is not None)
        print(
            f"{args.replicas} replicas, {series} series, {written.stat().st_size / 1e6:.0f} MB of samples "
            f"({time.perf_counter() - t0:.0f} s); estimators with a {what}",
            flush=True,
        )
        for backend in backends:
            (root / backend).mkdir()
            source = om if backend == "prometheus" else text
            assert source is not None
            limit = series if backend == "victoria-metrics" else series * (SPAN // args.scrape + 1)
            with BACKENDS[backend](root / backend, source, limit) as url:
                rows.append(_measure(backend, url, _evaluation_time(end, args.scrape), truth, cal, args.repeat))
    table = _table(rows, args.replicas, series)
    print(table)
    if args.out is not None:
        command = "python -m bench.fleet " + " ".join(argv if argv is not None else sys.argv[1:])
        write_block(args.out, BEGIN, provenance(command, ROOT) + "\n\n" + table)
        print(f"wrote {args.out}")
    return 0


@dataclass(frozen=True)
class Row:
    backend: str
    refresh: float
    cpu: float
    queries: int
    restarted: int
    baseline: float
    errors: dict[str, float]
    baseline_errors: dict[str, float]


def _measure(
    backend: str, url: str, end: float, truth: dict[str, float], cal: EstimatorCalibration, repeat: int
) -> Row:
    settings = AgentSettings.model_validate(
        {
            "mode": "fleet",
            "model": {"name": MODEL, "version": VERSION},
            "bundle": {"path": "."},
            "windows": {"time": list(WINDOWS)},
            "fleet": {"prometheus_url": url, "query_timeout_seconds": 120, "refresh_timeout_seconds": 3600},
        }
    )
    api = PrometheusAPI(url, 120)
    evaluator = FleetEvaluator(settings, cal, "b", api)
    best, cpu, result = float("inf"), float("inf"), None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = evaluator.evaluate(float(end))
        best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    assert result is not None
    base_best, base_n = float("inf"), {}

    async def baseline() -> None:
        async with api.connected():
            for name in WINDOWS:
                res = await api.vector(
                    f'sum by (model, version, bundle, stat) (increase({STAT_METRIC}{{model="{MODEL}"}}[{name}]))',
                    float(end),
                )
                base_n[name] = next(s.value for s in res if dict(s.labels)["stat"] == "n")

    for _ in range(repeat):
        t0 = time.perf_counter()
        asyncio.run(baseline())
        base_best = min(base_best, time.perf_counter() - t0)
    version = result.versions[VERSION]
    print(f"{backend}:")
    _largest_answer(url, end)
    print(
        f"  refresh (evaluate, windows {', '.join(WINDOWS)}): {best:.3f} s best of {repeat}, {result.queries} queries, "
        f"{result.restarted_replicas} restarted replicas; the evaluator's own CPU "
        f"{cpu:.3f} s (the rest is the store's)"
    )
    print(f"  baseline increase() sums, same windows: {base_best:.3f} s; ratio refresh/baseline {best / base_best:.2f}")
    errors, base_errors = {}, {}
    for name in WINDOWS:
        stats, ests = version.windows[name].stats, version.windows[name].estimates
        errors[name], base_errors[name] = stats.n - truth[name], base_n[name] - truth[name]
        head = ests.get("shift_aware") or ests.get("icos")
        print(
            f"  {name}: n {stats.n} (truth {truth[name]:.0f}, error {errors[name]:+.0f}); "
            f"increase(): {base_n[name]:.1f} (error {base_errors[name]:+.1f}); "
            f"replicas {version.replicas.get(name)}; headline {head.value:.4f} [{head.lower:.4f}, {head.upper:.4f}]"
            if head
            else f"  {name}: n {stats.n}"
        )
    return Row(backend, best, cpu, result.queries, result.restarted_replicas, base_best, errors, base_errors)


def _table(rows: list[Row], replicas: int, series: int) -> str:
    """The figures as a Markdown table."""

    def errs(e: dict[str, float]) -> str:
        return " / ".join(f"{v:+.0f}" for v in e.values())

    out = [
        f"{replicas:,} simulated replicas, {series:,} series, windows {' and '.join(WINDOWS)} in one refresh:",
        "",
        "| store | refresh (best) | evaluator CPU | queries | restarted replicas "
        f"| n error ({' / '.join(WINDOWS)}) | `increase()` sums | its n error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r.backend} | {r.refresh:.2f} s | {r.cpu:.2f} s | {r.queries} | {r.restarted} | {errs(r.errors)} "
            f"| {r.baseline:.2f} s | {errs(r.baseline_errors)} |"
        )
    return "\n".join(out) + "\n"


def _largest_answer(url: str, end: float) -> None:
    """The size of the largest answer a refresh reads: the range query of the sums over every replica, one
    value per statistic series of one replica and point (what ``fleet.max_response_bytes`` must hold)."""
    at_ms = round(end * 1000)
    (start, stop, step), *_ = range_plan(at_ms, [round(s * 1000) for s in WINDOWS.values()])
    seconds = int(max(WINDOWS.values()) + 300)
    expr = f'sum by (model, version, bundle, stat) (last_over_time({STAT_METRIC}{{model="{MODEL}"}}[{seconds}s]))'
    form = {"query": expr, "start": f"{start / 1000:.3f}", "end": f"{stop / 1000:.3f}", "step": f"{step / 1000:.3f}"}
    r = httpx.post(f"{url}/api/v1/query_range", data={**form, "nocache": "1"}, timeout=120)
    result = r.json()["data"]["result"]
    if result:
        points = sum(len(s["values"]) for s in result)
        print(
            f"  largest answer: the range query of the sums over every replica: {len(r.content)} bytes "
            f"({len(result)} series, {points // len(result)} points each, "
            f"{len(r.content) / points:.1f} bytes per point)"
        )


if __name__ == "__main__":
    sys.exit(main())
