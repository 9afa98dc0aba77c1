"""The serving benchmark runs end to end (short): the agent against the bare server over HTTP and gRPC,
and in proxy mode in front of the bare server, every request answered 200 / OK. Figures are not
asserted (timings never are in tests); the benchmark raises on any failed request, which is what this
catches (e.g. a proxy that cannot speak to the bare server)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_serving_benchmark_measures_http_grpc_and_proxy(mnist_bundle_dir: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.serving", "--model", "mnist", "--bundle", str(mnist_bundle_dir)]
        + ["--seconds", "0.2", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)["mnist"]
    settings = {(s["protocol"], s["concurrency"], s["batch"]) for s in results["settings"]}
    assert settings == {(p, c, b) for p in ("http", "grpc") for c in (1, 16) for b in (1, 32)}
    for s in results["settings"]:
        for run in ("agent", "agent_with_verdict", "bare"):
            assert s[run]["requests_per_s"] > 0 and s[run]["server_cpu_ms_per_request"] > 0
    assert [p["batch"] for p in results["proxy"]] == [1, 32]
    for p in results["proxy"]:
        assert p["proxy"]["requests_per_s"] > 0 and p["proxy_with_verdict"]["requests_per_s"] > 0
    assert results["agent_exit_code_on_sigterm"] == 0
    assert not results["serve_path_imports"]["mlflow"]
    assert results["errors"] == []


def test_serving_benchmark_serves_the_lightgbm_table_model() -> None:
    """The zoo's LightGBM model (onnxmltools' export: an INT64 label first, then the probabilities), its bundle
    fitted by the run: served over HTTP and gRPC, and proxied, every request answered."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.serving", "--model", "lightgbm", "--seconds", "0.2", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)["lightgbm"]
    assert results["errors"] == []
    assert {s["protocol"] for s in results["settings"]} == {"http", "grpc"} and len(results["settings"]) == 8
    assert [p["batch"] for p in results["proxy"]] == [1, 32]


def test_a_failing_setting_is_named_with_its_cause_and_the_run_goes_on(tmp_path: Path) -> None:
    """An agent that cannot start fails serve mode and proxy mode, each reported with the cause, and the run
    still ends with its report (exit status 1)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.serving", "--model", "mnist", "--bundle", str(tmp_path / "none")]
        + ["--seconds", "0.2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    failed = [line for line in out.stdout.splitlines() if line.startswith("FAILED ")]
    assert [line.split(":")[0] for line in failed] == ["FAILED serve mode", "FAILED proxy mode"], out.stdout
    assert all("exited with 2" in line and "none" in line for line in failed), failed
    assert "imported on the serve path" in out.stdout and "2 setting(s) failed" in out.stderr


def test_serving_benchmark_measures_a_challenger_on_a_share(
    mnist_bundle_dir: Path, challenger_bundle_dir: Path
) -> None:
    """``--challenger-share``: the agent without and with the challenger, each answering every request, and the
    challenger's own CPU per prediction from its metrics."""
    argv = ["--model", "mnist", "--challenger-share", "0.5", "--bundle", str(mnist_bundle_dir)]
    argv += ["--challenger-bundle", str(challenger_bundle_dir), "--seconds", "0.3", "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "bench.serving", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)
    assert [s["concurrency"] for s in results["settings"]] == [1, 16]
    for s in results["settings"]:
        for run in ("without", "with"):
            assert s[run]["requests_per_s"] > 0 and s[run]["champion_cpu_ms_per_request"] > 0
        assert s["without"]["challenger_cpu_ms_per_request"] == 0  # no challenger thread there
    assert results["challenger_predictions"] > 0 and results["challenger_cpu_ms_per_prediction"] > 0
