"""The way in through a package: ``make dist`` (``.ci/dist.py``) builds an sdist and, from it, a wheel
holding every module, the shipped ONNX models, ``models.json``, the gRPC service's files and the
licence; the wheel installs with its dependencies, constrained by ``requirements.lock``, into a fresh
virtual environment (from pip's cache and the package index, as ``make venv`` does: about a minute
with a warm cache), where ``icos-agent`` runs and ``serve --check`` loads the model shipped inside the
installed package. A module importing a package the wheel does not declare fails here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "invariants", "exporters", "icos_agent")
#: Files besides the modules that the installed package reads.
DATA_FILES = {
    "agent/py.typed",
    "invariants/py.typed",
    "exporters/py.typed",
    "icos_agent/py.typed",
    "agent/shipped_models/models.json",
    "agent/protocol/grpc_stubs/open_inference_grpc.proto",
    "agent/protocol/grpc_stubs/open_inference_grpc_pb2.pyi",
}


def _tracked(pattern: str) -> set[str]:
    out = subprocess.run(
        ["git", "ls-files", "--", *[f"{p}/{pattern}" for p in PACKAGES]],  # noqa: S607
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line for line in out.splitlines() if line}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(  # noqa: S603
        [sys.executable, str(ROOT / ".ci" / "dist.py"), str(out)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sdist, wheel = (Path(line) for line in proc.stdout.split())
    assert sdist.name == "icos_agent-0.1.0.tar.gz" and wheel.name == "icos_agent-0.1.0-py3-none-any.whl"
    return sdist, wheel


def test_make_dist_runs_the_script() -> None:
    recipe = re.search(r"^dist: venv\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None and "$(BIN)/python .ci/dist.py dist" in recipe.group(1)


def test_the_wheel_holds_every_module_and_data_file(dist: tuple[Path, Path]) -> None:
    sdist, wheel = dist
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read("icos_agent-0.1.0.dist-info/METADATA").decode()
        entry_points = zf.read("icos_agent-0.1.0.dist-info/entry_points.txt").decode()
        shipped_model = zf.read("agent/shipped_models/mnist_cnn.onnx")
    modules = _tracked("*.py")
    models = _tracked("*.onnx")
    assert models >= {f"agent/shipped_models/{name}.onnx" for name in ("mnist_cnn", "digits_cnn", "resnet32")}
    missing = (modules | models | DATA_FILES) - names
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert shipped_model == (ROOT / "agent/shipped_models/mnist_cnn.onnx").read_bytes()
    assert "icos_agent-0.1.0.dist-info/licenses/LICENSE" in names
    assert "License-Expression: Apache-2.0" in metadata
    assert "icos-agent = agent.cli:main" in entry_points
    assert not [n for n in names if n.startswith(("tests/", "bench/", "docs/")) or "__pycache__" in n]
    with tarfile.open(sdist) as tar:
        in_sdist = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert {"LICENSE", "README.md", "pyproject.toml"} <= in_sdist
    assert (modules | models | DATA_FILES) - in_sdist == set()


@pytest.mark.timeout(900)
def test_the_wheel_installs_and_runs(dist: tuple[Path, Path], tmp_path: Path, mnist_bundle_dir: Path) -> None:
    _, wheel = dist
    venv = tmp_path / "venv"
    try:
        _install_and_run(wheel, venv, tmp_path, mnist_bundle_dir)
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # about 1 GB: not kept among pytest's last temporary folders


def _install_and_run(wheel: Path, venv: Path, tmp_path: Path, bundle: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("ICOS_AGENT_", "VIRTUAL_ENV"))
    }
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=env)  # noqa: S603
    python, cli = venv / "bin" / "python", venv / "bin" / "icos-agent"
    install = subprocess.run(  # noqa: S603
        [str(python), "-m", "pip", "install", "--quiet", "-c", str(ROOT / "requirements.lock"), str(wheel)],
        capture_output=True,
        text=True,
        timeout=840,
        env=env,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    def run(*cmd: str | Path) -> subprocess.CompletedProcess[str]:
        # cwd: not the checkout, so nothing of it is importable
        return subprocess.run(  # noqa: S603
            [str(c) for c in cmd], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path, check=False
        )

    helped = run(cli, "--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("fit", "check", "estimate-lake", "serve", "audit", "labels", "demo"):
        assert command in helped.stdout
    assert run(cli, "--version").stdout.strip() == "icos-agent 0.1.0"
    where = run(
        python,
        "-c",
        "import agent; from agent.model.classifier import default_model_path as p; print(agent.__file__); print(p())",
    )
    assert where.returncode == 0, where.stderr
    module, model = where.stdout.split()
    assert Path(module).is_relative_to(venv) and Path(model).is_relative_to(venv), where.stdout
    # the installed package serves the model it ships: config checked, model and bundle loaded, port free
    config = tmp_path / "agent.yaml"
    server = {"host": "127.0.0.1", "port": free_port()}
    config.write_text(
        yaml.safe_dump({"model": {"name": "mnist", "path": model}, "bundle": {"path": str(bundle)}, "server": server})
    )
    checked = run(cli, "serve", "--config", config, "--check")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("config OK: serve mode, model mnist version 1"), checked.stdout
    # the notebook's package, from the installed wheel: the shipped model's bundle loads and estimates
    code = (
        "import sys, numpy as np, icos_agent; "
        "b = icos_agent.load(sys.argv[1], model=sys.argv[2]); "
        "print(b.estimate(np.zeros((3, 1, 28, 28), np.float32), progress=False).to_df()['n'].tolist())"
    )
    estimated = run(python, "-c", code, bundle, model)
    assert estimated.returncode == 0 and estimated.stdout.strip() == "[3]", estimated.stderr[-2000:]
