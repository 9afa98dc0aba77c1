"""The serve process caps numpy's BLAS pool (``server.blas_threads``): idle OpenBLAS threads busy-wait
after every product and took as much CPU as inference on batch-32 requests."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent.config.settings import ServerConfig


def test_the_default_is_one_thread() -> None:
    assert ServerConfig().blas_threads == 1


@pytest.mark.parametrize("n", [1, 2])
def test_limit_applies_to_every_blas_pool_of_the_process(n: int) -> None:
    # a fresh interpreter, so that the limit does not leak into the other tests
    code = (
        "import numpy, json\n"
        "from agent.commands.serve import limit_blas_threads\n"
        f"print(json.dumps([p['num_threads'] for p in limit_blas_threads({n})]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    pools = [int(v) for v in out.stdout.strip().strip("[]").split(",") if v.strip()]
    assert pools, "numpy links no BLAS that threadpoolctl can see"
    assert set(pools) == {n}
