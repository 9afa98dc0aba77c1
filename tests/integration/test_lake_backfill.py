"""A lake's time windows backfilled into a real Prometheus: ``Estimates.to_openmetrics`` (and ``icos-agent
estimate-lake --openmetrics``) writes the windows as the agent's metrics history, the real ``promtool tsdb
create-blocks-from openmetrics`` turns it into blocks, a real ``prometheus`` started over them answers range
queries at the windows' ends with every window's estimates, flag and segments, as ``to_df()`` and
``segments_df()`` give them. Windows of rows have no time: refused, in Python and on the command line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import icos_agent
from agent.cli import main
from agent.errors import UserError
from exporters.label_values import bounded_label
from invariants.fit_params import CalibrationPlan
from tests.support.prometheus import FAST, PrometheusServer
from tests.support.requirements import require

#: The live windows start here (a past hour: the blocks lie behind any Prometheus head).
START = pd.Timestamp("2026-02-01 09:00", tz="UTC")
HOURS = 5
ROWS_PER_HOUR = 150
MODEL_NAME = "credit"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[icos_agent.Bundle, pd.DataFrame, Path]:
    """A skl2onnx logistic regression on generated rows, its bundle, and five hours of live rows (one every 24 s,
    the later hours noisier) with a ``ts`` column; the ONNX file's directory."""
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    root = tmp_path_factory.mktemp("backfill")
    n_live = HOURS * ROWS_PER_HOUR
    x, y = make_classification(n_samples=800 + n_live, n_features=5, n_informative=3, flip_y=0.05, random_state=11)
    x = x.astype(np.float32)
    clf = LogisticRegression().fit(x[:400], y[:400])
    onnx = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}}, target_opset={"": 17, "ai.onnx.ml": 3})
    (root / "m.onnx").write_bytes(onnx.SerializeToString())
    plan = CalibrationPlan(shift_windows=300, clean_windows=40, windows_per_kind=3, bootstrap=20, min_fold_rows=20)
    train = pd.DataFrame(x[:400], columns=list("abcde")).assign(y=y[:400])
    bundle = icos_agent.fit(
        root / "m.onnx", (train, "y"), (x[400:800], y[400:800]), trees=10, shift_sets=12, plan=plan, progress=False
    )
    live_x = x[800:].copy()
    hour = np.arange(n_live) // ROWS_PER_HOUR
    live_x += np.random.default_rng(3).normal(0, 1, live_x.shape).astype(np.float32) * (hour[:, None] / 2)
    live = pd.DataFrame(live_x, columns=list("abcde"))
    live["ts"] = START + pd.to_timedelta(np.arange(n_live) * (3600 // ROWS_PER_HOUR), unit="s")
    return bundle, live, root


def _by_time(series: list[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], float]:
    """A range query's samples by ``(label values of keys..., unix seconds)``."""
    out: dict[tuple[Any, ...], float] = {}
    for s in series:
        for t, v in s["values"]:
            where = (*(s["metric"].get(k, "") for k in keys), float(t))
            assert where not in out, f"two samples at {where}"
            out[where] = float(v)
    return out


def test_backfilled_windows_read_back_from_prometheus(
    fitted: tuple[icos_agent.Bundle, pd.DataFrame, Path], tmp_path: Path
) -> None:
    promtool = require("promtool")
    bundle, live, _ = fitted
    est = bundle.estimate(live, timestamp="ts", window="1h", progress=False)
    df, segments = est.to_df(), est.segments_df()
    assert len(df) == HOURS and not segments.empty
    written = est.to_openmetrics(tmp_path / "history.om", model_name=MODEL_NAME, model_version="7")
    assert written.windows == HOURS and written.samples > HOURS * 20
    ends = [t.timestamp() for t in df["window_end"]]
    assert (written.first_ns, written.last_ns) == (int(ends[0]) * 10**9, int(ends[-1]) * 10**9)

    blocks = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(written.path), str(tmp_path / "tsdb")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert blocks.returncode == 0, blocks.stderr
    # retention counts back from the newest block: keep every backfilled hour
    prom = PrometheusServer(tmp_path, {"global": dict(FAST), "scrape_configs": []}, retention="3650d").start()
    try:
        sel = f'{{model="{MODEL_NAME}",version="7",window="1h"}}'

        def read(name: str, *keys: str) -> dict[tuple[Any, ...], float]:
            return _by_time(prom.query_range(name + sel, ends[0], ends[-1], 3600), *keys)

        head = read("icos_headline_accuracy_ratio", "estimator")
        assert head == {(r.estimator, end): r.value for r, end in zip(df.itertuples(), ends, strict=True)}
        for bound in ("lower", "upper"):
            got = read(f"icos_headline_accuracy_ratio_{bound}", "estimator")
            assert got == {(r.estimator, end): getattr(r, bound) for r, end in zip(df.itertuples(), ends, strict=True)}
        estimators = sorted(c.removesuffix("_value") for c in df.columns if c.endswith("_value"))
        for suffix, column in (("", "value"), ("_lower", "lower"), ("_upper", "upper")):
            got = read(f"icos_estimated_accuracy_ratio{suffix}", "estimator")
            want = {
                (name, end): float(row[f"{name}_{column}"])
                for (_, row), end in zip(df.iterrows(), ends, strict=True)
                for name in estimators
                if np.isfinite(row[f"{name}_{column}"])
            }
            assert got == want, suffix
        flagged = read("icos_estimate_flagged", "window")
        assert flagged == {("1h", end): float(raised) for raised, end in zip(df["flag_raised"], ends, strict=True)}
        samples = read("icos_estimated_accuracy_samples", "window")
        assert samples == {("1h", end): float(n) for n, end in zip(df["n"], ends, strict=True)}
        seg = read("icos_segment_estimated_accuracy_ratio", "kind", "segment")
        end_of = dict(zip(df["window_end"], ends, strict=True))
        want_seg = {
            (r.kind, bounded_label(r.segment), end_of[r.window_end]): r.value for r in segments.itertuples() if r.n > 0
        }
        assert seg == want_seg
        reference = f'icos_reference_accuracy_ratio{{model="{MODEL_NAME}",version="7"}}'
        for end in (ends[0], ends[-1]):
            assert [float(r["value"][1]) for r in prom.query(reference, at=end)] == [est.reference_accuracy]
        assert prom.query(reference, at=ends[-1] + 3600) == []  # history ends with the last window
    finally:
        prom.stop()


def test_estimate_lake_writes_the_same_history_and_iso_bounds(
    fitted: tuple[icos_agent.Bundle, pd.DataFrame, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    bundle, live, root = fitted
    bundle.save(tmp_path / "bundle")
    lake = tmp_path / "lake"
    lake.mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(live)), 3)):
        live.iloc[part].to_parquet(lake / f"part-{i}.parquet", index=False, row_group_size=100)
    est = bundle.estimate(live, timestamp="ts", window="1h", progress=False)
    est.to_openmetrics(tmp_path / "python.om", model_name=MODEL_NAME)
    argv = ["estimate-lake", "--model", str(root / "m.onnx"), "--bundle", str(tmp_path / "bundle")]
    argv += ["--data", str(lake), "--timestamp", "ts", "--window", "1h", "--model-name", MODEL_NAME]
    capsys.readouterr()
    assert main([*argv, "--openmetrics", str(tmp_path / "cli.om"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    starts = [w["start"] for w in report["windows"]]
    assert starts == [t.isoformat() for t in est.to_df()["window_start"]]
    assert starts[0] == "2026-02-01T09:00:00+00:00" and report["windows"][0]["end"] == "2026-02-01T10:00:00+00:00"
    assert report["openmetrics"]["last"] == report["windows"][-1]["end"]

    def samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...], float], float]:
        text = path.read_text(encoding="utf-8")
        return {
            (s.name, tuple(sorted(s.labels.items())), float(s.timestamp)): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }

    python, cli = samples(tmp_path / "python.om"), samples(tmp_path / "cli.om")
    assert report["openmetrics"]["samples"] == len(cli) and sorted(python) == sorted(cli)
    for k, v in python.items():
        assert cli[k] == pytest.approx(v, abs=1e-9), k

    rows = bundle.estimate(live.drop(columns="ts"), window=100, progress=False)
    with pytest.raises(UserError, match="only time windows"):
        rows.to_openmetrics(tmp_path / "rows.om")
    row_argv = [a if a != "1h" else "100" for a in argv]
    assert main([*row_argv, "--openmetrics", str(tmp_path / "rows.om")]) == 2
    assert "only time windows" in capsys.readouterr().err and not (tmp_path / "rows.om").exists()
