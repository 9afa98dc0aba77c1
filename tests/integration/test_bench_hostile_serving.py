"""The hostile-serving benchmark runs end to end (``--quick``) against this checkout's agent: every
quick case gives its rows, printed as a table and written as JSON, and the statuses are what the
current code's bounds answer (a 400 for a long id or another datatype, 413 for large parameters, 401
for labels without the labelers' token, 429 after five wrong admin tokens). Figures (memory, times)
are not asserted: the benchmark reports them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120, func_only=True)  # about 40 s; the bundle is fitted in setup
def test_quick_hostile_serving_benchmark_against_the_current_code(mnist_bundle_dir: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.hostile.serving", "--quick", "--bundle", str(mnist_bundle_dir)]
        + ["--json", str(tmp_path / "rows.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r["case"]: r for r in json.loads((tmp_path / "rows.json").read_text())}
    table = [line for line in out.stdout.splitlines() if line.startswith("| ") and not line.startswith("| case")]
    assert len(table) == len(rows) == 8, out.stdout
    assert all(r["agent_exit"] is None and r["rss_peak"] >= r["rss_before"] > 0 for r in rows.values())

    assert rows["id 100 KiB × batch 256, HTTP"]["status"] == "400"
    assert rows["id 100 KiB × batch 256, gRPC"]["status"] == "INVALID_ARGUMENT"
    assert rows["request parameter of 5.0 MB, batch 1, HTTP"]["status"] == "413"
    datatypes = rows["INT64, FP64, FP16 inputs for an FP32 model, HTTP and gRPC"]
    assert datatypes["status"] == "400 ×3 / INVALID_ARGUMENT ×3" and "send FP32" in datatypes["outcome"]
    attack = rows["aimed wrong labels, labelers token set"]
    assert attack["status"] == "401 / 401" and "with_labels none" in attack["outcome"]
    labeler = rows["the real labeler's labels after it"]
    assert labeler["status"] == "200" and "accepted" in labeler["outcome"] and "duplicate" not in labeler["outcome"]
    guesses = rows["100 admin token guesses"]
    assert guesses["status"] == "403 ×5, 429 ×95" and "429 from the guesser" in guesses["outcome"]
    assert rows["4 concurrent batches of 512 (1.6 MB), grpc"]["status"] == "OK ×4"
