"""The metrics history's text (``exporters.openmetrics``): readings added in any order come out as one block per
family, each series' samples together and in increasing time, in seconds; label values escaped so that
the OpenMetrics parser reads back what was written; ``# EOF`` last; counters and twice-stamped samples refused.
The ``window`` label of a lake's windows is their width as the agent's config writes it, and only time windows
have one."""

from __future__ import annotations

import io

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from agent.core.durations import duration_name, parse_duration
from agent.errors import UserError
from agent.offline.backfill import window_label
from agent.offline.windowed import Windowing
from exporters.openmetrics import MetricsHistory

HOSTILE = 'seg "a"\\b\nc'
HOUR_NS = 3_600_000_000_000
T0 = 1_769_936_400 * 10**9  # 2026-02-01 09:00 UTC


def _reading(value: float) -> list[GaugeMetricFamily]:
    acc = GaugeMetricFamily("icos_x_ratio", "An accuracy.", labels=["model", "segment"])
    acc.add_metric(["m", HOSTILE], value)
    acc.add_metric(["m", "plain"], value / 2)
    n = GaugeMetricFamily("icos_x_samples", "Rows.", labels=["model"])
    n.add_metric(["m"], 10 * value)
    return [acc, n]


def _text(history: MetricsHistory) -> str:
    out = io.StringIO()
    history.write(out)
    return out.getvalue()


def test_readings_in_any_order_come_out_grouped_sorted_and_escaped() -> None:
    history = MetricsHistory()
    for hour, value in ((2, 0.75), (0, 0.5), (1, 0.625)):
        history.add(T0 + hour * HOUR_NS + 1, _reading(value))  # 1 ns past the hour: kept exactly
    text = _text(history)
    lines = text.splitlines()
    assert lines[-1] == "# EOF" and text.endswith("# EOF\n") and text.count("# EOF") == 1
    assert [ln for ln in lines if ln.startswith("# TYPE")] == [
        "# TYPE icos_x_ratio gauge",
        "# TYPE icos_x_samples gauge",
    ]
    assert history.series == 3 and history.samples == 9
    samples = [ln for ln in lines if not ln.startswith("#")]
    assert samples[0] == 'icos_x_ratio{model="m",segment="seg \\"a\\"\\\\b\\nc"} 0.5 1769936400.000000001'
    # one series after the other, each in increasing time
    series = [ln.rsplit(" ", 2)[0] for ln in samples]
    assert series == sorted(series, key=series.index) and len(set(series)) == 3
    times = [float(ln.rsplit(" ", 1)[1]) for ln in samples]
    assert all(times[i] < times[i + 1] for i in range(len(times) - 1) if series[i] == series[i + 1])

    parsed = {
        (s.name, s.labels.get("segment"), s.timestamp.sec * 10**9 + s.timestamp.nsec): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert parsed[("icos_x_ratio", HOSTILE, T0 + 1)] == 0.5
    assert parsed[("icos_x_ratio", "plain", T0 + 2 * HOUR_NS + 1)] == 0.375
    assert parsed[("icos_x_samples", None, T0 + HOUR_NS + 1)] == 6.25
    assert len(parsed) == 9


def test_counters_and_a_second_sample_at_one_time_are_refused() -> None:
    history = MetricsHistory()
    history.add(T0, _reading(0.5))
    with pytest.raises(ValueError, match="two samples of icos_x_ratio"):
        history.add(T0, _reading(0.5))
    counter = CounterMetricFamily("icos_y", "Counted.", labels=["model"])
    counter.add_metric(["m"], 3)
    with pytest.raises(ValueError, match="only gauges"):
        MetricsHistory().add(T0, [counter])
    assert _text(MetricsHistory()) == "# EOF\n"


@pytest.mark.parametrize(
    ("ns", "name"),
    [
        (HOUR_NS, "1h"),
        (5 * 60 * 10**9, "5m"),
        (90 * 60 * 10**9, "90m"),
        (86_400 * 10**9, "1d"),
        (1_500_000_000, "1500ms"),
    ],
)
def test_a_width_is_named_as_the_config_writes_it(ns: int, name: str) -> None:
    assert duration_name(ns) == name and parse_duration(name) * 10**9 == ns
    assert window_label(Windowing(width_ns=ns)) == name


def test_only_time_windows_of_whole_milliseconds_from_a_second_have_a_label() -> None:
    for windowing in (Windowing(rows=100), Windowing()):
        with pytest.raises(UserError, match="only time windows"):
            window_label(windowing)
    for width in (500_000_000, 10**9 + 1):
        with pytest.raises(UserError, match="cannot be an agent's window"):
            window_label(Windowing(width_ns=width))
    with pytest.raises(ValueError, match="whole number of milliseconds"):
        duration_name(1)
