"""The fleet's sums against a real store holding hand-made replica series: Prometheus (backfilled with
``promtool tsdb create-blocks-from openmetrics``) and VictoriaMetrics (``/api/v1/import/prometheus``),
which must give the same sums: replicas joining, leaving and restarting, two versions side by side,
and statistics of several bundles, which are refused rather than mixed. The sums at every window's start
come from one range query whose lookback reaches before the span: replicas gone, and series a restarted
process no longer exports, just before the span must count nothing."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from agent.config.settings import AgentSettings
from agent.estimation.calibration import EstimatorCalibration
from agent.fleet.evaluator import FleetEvaluator
from agent.fleet.prometheus_api import PrometheusAPI
from tests.support.prometheus import PrometheusServer
from tests.support.requirements import require
from tests.support.victoria import VictoriaMetricsServer

STEP = 15  # seconds between two scrapes
END = (int(time.time()) // 60 - 10) * 60  # ten minutes ago, on a minute
AT = END - 5  # the refresh runs between two scrapes
# (version, bundle, instance) -> n counter per scrape over the last 30 minutes (121 scrapes); None: no sample
STEPS = 121


def _series() -> dict[tuple[str, str, str], Sequence[float | None]]:
    ramp = [float(10 * i) for i in range(STEPS)]  # 10 predictions per scrape
    joined = [None] * 100 + [float(10 * i) for i in range(1, 22)]  # born 5 minutes before the end
    left = [float(10 * i) for i in range(110)] + [None] * 11  # gone 2.5 minutes before the end
    restarted = [float(10 * i) for i in range(100)] + [float(3 * i) for i in range(21)]  # reset, then 3 per scrape
    # restarted at index 90 (3 per scrape from zero), again at 117 (2 per scrape from zero)
    twice = [float(10 * i) for i in range(90)] + [3.0 * (i - 89) for i in range(90, 117)]
    twice += [2.0 * (i - 116) for i in range(117, STEPS)]
    # unscraped from index 108 to 116 (2.5 minutes, longer than the lookback)
    gap = [float(10 * i) for i in range(108)] + [None] * 9 + [float(10 * i) for i in range(117, STEPS)]
    # restarted at index 50 (before every span), then 72 (the span's first scrape): see PASSING_FROM
    early = [float(10 * i) for i in range(50)] + [float(10 * (i - 50)) for i in range(50, STEPS)]
    at_span = [float(10 * i) for i in range(72)] + [float(10 * (i - 72)) for i in range(72, STEPS)]
    return {
        ("3", "ours", "r1"): ramp,
        ("3", "ours", "r2"): joined,
        ("3", "ours", "r3"): left,
        ("3", "ours", "r4"): restarted,
        ("4", "ours", "r5"): ramp,  # a second version of the same bundle, side by side
        ("5", "ours", "r9"): twice,
        ("5", "ours", "r10"): gap,
        # version 6: replicas gone, and series no longer exported, before the span (AT − 12 minutes: the 10m
        # window and the lookback of 2 minutes) but after the range query's reach from a window's start
        ("6", "ours", "r11"): [float(10 * i) for i in range(61)] + [None] * 60,  # gone at index 60
        ("6", "ours", "r12"): [float(10 * i) for i in range(72)] + [None] * 49,  # gone at 71: the 1m window's too
        ("6", "ours", "r13"): ramp,
        ("6", "ours", "r14"): early,
        ("6", "ours", "r15"): at_span,
        ("1", "ours", "r6"): ramp,  # version 1: replicas of two bundles
        ("1", "theirs", "r7"): ramp,
        ("2", "theirs", "r8"): ramp,  # version 2: another bundle only
    }


#: Every statistic's counter from the ``n`` counter of one scrape, consistent as one agent's are: one
#: prediction in ten fails its IDI rules, every confidence is 0.92 (pass → cell 3, fail:idi → cell 9).
_STATS: dict[str, Callable[[float], float]] = {
    "n": lambda n: n,
    "fails": lambda n: n // 10,
    "fails_by_family:idi": lambda n: n // 10,
    "cells:3": lambda n: n - n // 10,
    "cells:9": lambda n: n // 10,
    "atc_above": lambda n: n * 9 // 10,
    "conf_sum": lambda n: 0.92 * n,
    "conf_sq_sum": lambda n: 0.85 * n,
}
#: instance → the scrape from which it is a process whose predictions all passed its rules: it exports no
#: failing series (``fails``, ``fails_by_family:idi``, ``cells:9``), so those of the process before it end
_PASSING_FROM = {"r14": 50, "r15": 72}
_PASSING: dict[str, Callable[[float], float]] = {
    "n": lambda n: n,
    "cells:3": lambda n: n,
    "atc_above": lambda n: n * 9 // 10,
    "conf_sum": lambda n: 0.92 * n,
    "conf_sq_sum": lambda n: 0.85 * n,
}


def _samples() -> Iterator[tuple[str, float, int]]:
    """(series, value, unix time) of every sample."""
    for (version, bundle, inst), values in _series().items():
        for stat in _STATS:
            labels = f'model="m",version="{version}",bundle="{bundle}",instance="{inst}",job="icos-agent",stat="{stat}"'
            for i, v in enumerate(values):
                of = _PASSING if i >= _PASSING_FROM.get(inst, STEPS) else _STATS
                if v is not None and stat in of:
                    yield f"icos_window_stat_total{{{labels}}}", of[stat](v), END - STEP * (STEPS - 1 - i)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("prometheus", marks=pytest.mark.needs("prometheus", "promtool")),
        pytest.param("victoria-metrics", marks=pytest.mark.needs("victoria-metrics")),
    ],
)
def prometheus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The store's URL, holding :func:`_samples`."""
    root = tmp_path_factory.mktemp("fleet-sums")
    if request.param == "victoria-metrics":
        vm = VictoriaMetricsServer(root).start()
        try:
            vm.import_text("".join(f"{name} {v:.6f} {t * 1000}\n" for name, v, t in _samples()).encode())
            yield vm.url
        finally:
            vm.stop()
        return
    lines = ["# TYPE icos_window_stat counter"]
    lines += [f"{name} {v:.6f} {t}" for name, v, t in _samples()]
    lines.append("# EOF")
    (root / "series.om").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "tsdb").mkdir()
    subprocess.run(
        [require("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(root / "series.om"), str(root / "tsdb")],
        check=True,
        capture_output=True,
    )
    prom = PrometheusServer(root, {"global": {"scrape_interval": "1m"}}, retention=None).start()
    try:
        yield prom.url
    finally:
        prom.stop()


def _evaluator(url: str, windows: list[str], tpr: float = 0.8, fpr: float = 0.05) -> FleetEvaluator:
    settings = AgentSettings.model_validate(
        {
            "mode": "fleet",
            "model": {"name": "m", "version": "3"},
            "bundle": {"path": "."},
            "windows": {"time": windows},
            "fleet": {"prometheus_url": url, "lookback_seconds": 120, "selector": 'job="icos-agent"'},
        }
    )
    cal = EstimatorCalibration.from_dict(
        {
            "tpr": tpr,
            "fpr": fpr,
            "n_wrong": 100,
            "n_right": 900,
            "accuracy": 0.9,
            "avg_conf": 0.92,
            "atc_threshold": 0.7,
        }
    )
    return FleetEvaluator(settings, cal, "ours", PrometheusAPI(url, 30), clock=lambda: float(AT))


def test_joins_leaves_and_restarts_are_counted_exactly(prometheus: str) -> None:
    result = _evaluator(prometheus, ["10m", "1m"]).evaluate(float(AT))
    w10 = result.versions["3"].windows["10m"]
    stats10, ests = w10.stats, w10.estimates
    # (AT − 10m, AT] holds the scrapes at END − 600 … END − 15 (indices 80 … 119), the baseline is index 79.
    # r1: 1190 − 790; r2 (born at index 100 at 10): 200 from zero; r3 (last sample at index 109): 1090 − 790;
    # r4: 990 − 790 before its reset at index 100, then 0, 3, …, 57 counting from zero
    assert stats10.n == 400 + 200 + 300 + (200 + 57)
    assert abs(stats10.fails - 0.1 * stats10.n) < 1
    assert result.versions["3"].replicas["10m"] == 4 and result.restarted_replicas == 2  # r4 and version 5's r9
    assert set(ests) >= {"icos", "icos_corrected", "avg_conf", "atc", "doc"}
    assert ests["avg_conf"].value == pytest.approx(0.92, abs=1e-6)
    stats1 = result.versions["3"].windows["1m"].stats
    # (AT − 1m, AT]: indices 116 … 119: r1 40, r2 40, r3 gone (its last value at both ends), r4 4 × 3
    assert stats1.n == 40 + 40 + 12
    assert result.versions["3"].replicas["1m"] == 3


def test_restarts_before_and_within_a_window_and_a_scrape_gap_across_its_start(prometheus: str) -> None:
    result = _evaluator(prometheus, ["10m", "1m"]).evaluate(float(AT))
    version = result.versions["5"]
    # r9, 10m (indices 80 … 119, baseline 790 at 79): 10 × 10, then 3 from zero and 26 × 3 after the restart
    # at 90, then 2 from zero and 2 × 2 after the one at 117; r10 1190 − 790
    assert version.windows["10m"].stats.n == (100 + 3 + 78 + 2 + 4) + 400
    assert version.windows["10m"].stats.fails == (100 + 3 + 78 + 2 + 4) // 10 + 40
    # 1m (indices 116 … 119, baseline index 115): r9 3, then 2 from zero and 2 × 2; r10, unscraped from 108 to
    # 116 (longer than the lookback): its last value before the gap (1070 at 107) is its baseline, so the gap's
    # growth counts (not its whole life, as if it had joined)
    assert version.windows["1m"].stats.n == (3 + 2 + 4) + (1190 - 1070)
    assert version.replicas == {"10m": 2, "1m": 2} and result.restarted_replicas == 2


@pytest.mark.parametrize("windows", [["10m", "1m"], ["10m", "47s"]], ids=["one-grid", "a-range-per-window"])
def test_replicas_and_series_gone_just_before_the_span_count_nothing(prometheus: str, windows: list[str]) -> None:
    """The range query reads a window's start with the span's lookback, so it sees samples up to a window
    before the span: r11 and r12 left there, r14's and r15's failing series ended there (their processes
    restarted, the new ones export none), and each must add nothing. With 10m and 47s the windows' grid has
    more points than one range query may ask for: a range query per window, the same sums."""
    result = _evaluator(prometheus, windows).evaluate(float(AT))
    version = result.versions["6"]
    w10 = version.windows["10m"].stats
    # 10m (indices 80 … 119, baseline 79): r13 1190 − 790 with a failing tenth; r14 and r15 400 each, none failing
    assert (w10.n, w10.fails, w10.cells[3], w10.cells[9]) == (1200, 40, 360 + 400 + 400, 40)
    assert version.replicas["10m"] == 3
    short = version.windows[windows[1]].stats
    scrapes = 4 if windows[1] == "1m" else 3  # (AT − 1m, AT]: indices 116 … 119; (AT − 47s, AT]: 117 … 119
    assert (short.n, short.fails, short.cells[9]) == (30 * scrapes, scrapes, scrapes)
    assert result.restarted_replicas == 2  # r4 and r9: r14's and r15's restarts are before every window
    assert result.versions["3"].windows["10m"].stats.n == 400 + 200 + 300 + (200 + 57)


def test_versions_side_by_side_and_bundles_never_mixed(prometheus: str) -> None:
    result = _evaluator(prometheus, ["10m"]).evaluate(float(AT))
    assert set(result.versions) == {"3", "4", "5", "6"}  # versions of our bundle, estimated apart
    assert result.versions["4"].windows["10m"].stats.n == 400
    assert result.mismatches == {("1", "mixed"), ("2", "other_bundle")}
    snap = _evaluator(prometheus, ["10m"])
    assert snap.refresh() and ("1", "mixed") in snap.snapshot().mismatches
    body = snap.estimates("1")
    assert body["windows"] == {} and {"version": "1", "reason": "mixed"} in body["fleet"]["mismatches"]


def test_the_fleet_marks_unreliable_estimates_as_an_agent_does(prometheus: str) -> None:
    """The fleet's ``/v1/estimates`` is rendered as an agent's: under an oracle that separates right from
    wrong predictions poorly (TPR − FPR 0.1), the estimates resting on its verdicts are marked
    ``unreliable`` with the reason, the others not; the bundle's reference accuracy is there too."""
    weak = _evaluator(prometheus, ["10m"], tpr=0.3, fpr=0.2)
    assert weak.refresh()
    body = weak.estimates("3")
    ests = body["windows"]["10m"]["estimates"]
    for name in ("icos", "icos_corrected"):
        assert "the oracle separates right from wrong predictions poorly" in ests[name]["unreliable"], ests[name]
    assert not [name for name in ("avg_conf", "atc", "doc") if "unreliable" in ests[name]]
    assert body["reference"] == {"accuracy": 0.9} and body["headline_note"]
    strong = _evaluator(prometheus, ["10m"])
    assert strong.refresh()
    assert not [n for n, e in strong.estimates("3")["windows"]["10m"]["estimates"].items() if "unreliable" in e]
