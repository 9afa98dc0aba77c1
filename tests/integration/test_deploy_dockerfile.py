"""The Dockerfile (no Docker engine runs here): multi-stage, slim base, numeric non-root user,
``icos-agent`` entrypoint, nothing from the build stage but the virtualenv, writable paths declared
as volumes; hadolint lints it when installed. The files its build stage copies build the project, and
the image it builds (``make image``) has one name across the chart, the manifests and the docs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

from tests.support.requirements import require

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for op, rest in _instructions():
        if op == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((op, rest))
    return stages


def test_multi_stage_slim_and_non_root() -> None:
    stages = _stages()
    assert len(stages) >= 2
    args = dict(rest.split("=", 1) for op, rest in _instructions() if op == "ARG" and "=" in rest)
    assert "slim" in args["PYTHON_IMAGE"]
    final = stages[-1]
    users = [rest for op, rest in final if op == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", users[-1]), users
    assert ("ENTRYPOINT", '["icos-agent"]') in final
    cmd = next(rest for op, rest in final if op == "CMD")
    assert '"serve"' in cmd


def test_final_stage_has_no_build_tools() -> None:
    final = _stages()[-1]
    runs = " ".join(rest for op, rest in final if op == "RUN")
    for tool in ("pip install", "apt-get install", "gcc", "build-essential", "git "):
        assert tool not in runs, tool
    copies = [rest for op, rest in final if op == "COPY"]
    assert copies == ["--from=build /opt/icos-agent /opt/icos-agent"]


def test_read_only_root_filesystem_ready() -> None:
    final = dict(_stages()[-1])
    assert "/var/lib/icos-agent" in final["VOLUME"] and "/tmp" in final["VOLUME"]
    env = " ".join(rest for op, rest in _stages()[-1] if op == "ENV")
    for var in ("HOME=/tmp", "TMPDIR=/tmp", "PYTHONDONTWRITEBYTECODE=1"):
        assert var in env


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert lines[[ln.strip() for ln in lines].index("*")] == "*"
    copies = [rest for op, rest in _instructions() if op == "COPY" and not rest.startswith("--from")]
    copied = {src for rest in copies for src in rest.split()[:-1]}
    for src in copied:
        assert f"!{src.rstrip('/')}/" in lines or f"!{src}" in lines, src


def test_hadolint() -> None:
    hadolint = require("hadolint")
    res = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_image_installs_the_tested_versions() -> None:
    """The image installs with the same constraints as every make target, so it runs what CI tested."""
    build = " ".join(rest for op, rest in _stages()[0] if op in ("RUN", "COPY"))
    assert "requirements.lock" in build and "pip install -c requirements.lock ." in build


def _copied_context(dest: Path) -> None:
    """The build stage's ``COPY`` sources, as the Dockerfile copies them from the build context."""
    for op, rest in _stages()[0]:
        if op != "COPY" or rest.startswith("--from"):
            continue
        *sources, _target = rest.split()
        for src in sources:
            path = ROOT / src
            if path.is_dir():
                shutil.copytree(path, dest / src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(path, dest / src)


def test_the_build_stage_copies_what_the_install_needs(tmp_path: Path) -> None:
    """``pip install .`` of the build stage, on exactly the files it copies (no Docker engine here):
    the project builds from them (pyproject.toml names README.md and LICENSE, for one)."""
    context = tmp_path / "src"
    context.mkdir()
    _copied_context(context)
    hook = "import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))"
    proc = subprocess.run(  # noqa: S603
        [sys.executable, "-c", hook, str(tmp_path)], cwd=context, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with zipfile.ZipFile(tmp_path / proc.stdout.split()[-1]) as wheel:
        names = set(wheel.namelist())
    licence = f"icos_agent-{_version()}.dist-info/licenses/LICENSE"
    assert {"agent/shipped_models/mnist_cnn.onnx", "agent/cli.py", licence} <= names


def _version() -> str:
    match = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert match is not None
    return match.group(1)


def test_one_image_name_everywhere() -> None:
    """The name ``make image`` builds is the one the chart, the manifests, the examples and the docs
    use; no other name of the agent's image appears (none that nobody builds)."""
    chart = yaml.safe_load((ROOT / "helm/icos-agent/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "helm/icos-agent/values.yaml").read_text())
    assert chart["appVersion"] == _version() and values["image"]["tag"] == ""
    name = f"{values['image']['repository']}:{chart['appVersion']}"
    assert name == f"icos-agent:{_version()}"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^IMAGE\s*\?= icos-agent:\$\(VERSION\)$", makefile, re.M)
    assert re.search(r"^image:\n\tdocker build -f deploy/Dockerfile -t \$\(IMAGE\) \.$", makefile, re.M)
    assert f"docker build -f deploy/Dockerfile -t {name} ." in DOCKERFILE.read_text()
    deploy_doc = (ROOT / "docs/deploy.md").read_text()
    assert "make image" in deploy_doc and f"docker build -f deploy/Dockerfile -t {name} ." in deploy_doc
    manifests = [d for f in (ROOT / "deploy/kubernetes/base").glob("*.yaml") for d in yaml.safe_load_all(f.read_text())]
    images = [
        c["image"]
        for d in manifests
        if d
        for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    ]
    assert images == [name]
    # every image reference that names the agent, in the chart, deploy/, the docs and the README
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "helm").rglob("*.y*ml")]
    files += [p for p in (ROOT / "deploy").rglob("*") if p.suffix in (".yaml", ".yml", ".md")]
    found = {
        (str(f.relative_to(ROOT)), ref)
        for f in files
        for ref in re.findall(r"image:\s*[\"']?([^\s\"'#]*icos-agent[^\s\"'#]*)", f.read_text(encoding="utf-8"))
    }
    assert found and {ref for _, ref in found} == {name}, found
    for f in files:
        assert "ghcr.io" not in f.read_text(encoding="utf-8"), f
