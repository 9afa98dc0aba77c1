"""The Dockerfile (no Docker engine runs here): multi-stage, slim base, numeric non-root user,
``icos-agent`` entrypoint, nothing from the build stage but the virtualenv, writable paths declared
as volumes; hadolint lints it when installed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

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
