"""Architecture rules that a reviewer should not have to check by hand."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "invariants", "exporters")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("invariants", {"agent", "exporters", "fastapi", "starlette", "uvicorn", "mlflow", "apscheduler"}),
        ("exporters", {"agent", "fastapi", "starlette", "uvicorn", "httpx"}),
    ],
)
def test_layering(package: str, forbidden: set[str]) -> None:
    offenders = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _modules(package)
        for name in _imports(p)
        if _top(name) in forbidden
    ]
    assert not offenders, offenders


@pytest.mark.parametrize(
    ("library", "adapter"),
    [
        ("onnxruntime", "invariants/onnx_session.py"),
        ("mlflow", "exporters/mlflow_logger.py"),
        ("apscheduler", "agent/core/scheduler.py"),
        ("psycopg", "agent/labels/postgres_backend.py"),
        ("psycopg_pool", "agent/labels/postgres_backend.py"),
        ("grpc", "agent/server/grpc_server.py"),
        ("aiohttp", "agent/dataplane/upstream.py"),
    ],
)
def test_third_party_clients_behind_one_adapter(library: str, adapter: str) -> None:
    users = sorted(
        str(p.relative_to(ROOT))
        for pkg in PACKAGES
        for p in _modules(pkg)
        if any(_top(n) == library for n in _imports(p))
    )
    assert users in ([], [adapter]), f"{library} imported outside {adapter}: {users}"


UNSAFE = re.compile(
    r"\bimport pickle\b|\bimport joblib\b|\bfrom (pickle|joblib)\b|yaml\.load\(|yaml\.unsafe_load"
    r"|\beval\(|\bexec\(|allow_pickle=True"
)


def test_no_unsafe_loading_or_evaluation() -> None:
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for pkg in PACKAGES
        for p in _modules(pkg)
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if UNSAFE.search(line)
    ]
    assert not hits, hits
