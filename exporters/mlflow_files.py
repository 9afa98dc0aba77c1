"""Local files on either side of MLflow: record artifacts and model files staged for upload, and a
downloaded model's ONNX file and invariant bundle located (no mlflow import).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from exporters.run_record import check_artifact_path

BUNDLE_DIR = "bundle"


def write_tree(root: Path, files: Mapping[str, bytes]) -> None:
    """Write artifacts (relative path → bytes) under ``root``; paths are checked to stay inside it."""
    for rel, content in files.items():
        target = root.joinpath(*check_artifact_path(rel).split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bytes(content))


@dataclass(frozen=True)
class DownloadedModel:
    """Local copy of a model from MLflow: the ONNX file and the invariant bundle next to it, if any."""

    onnx_path: Path
    bundle_dir: Path | None
    root: Path


@dataclass(frozen=True)
class RegisteredModelVersion:
    """What :func:`log_model` registered."""

    name: str
    version: str
    run_id: str
    model_uri: str


def locate_model(path: Path) -> DownloadedModel:
    """The ONNX file (exactly one outside ``bundle/``, else ``model.onnx``) and bundle of a download."""
    if path.is_file():
        if path.suffix != ".onnx":
            raise ValueError(f"downloaded artifact {path} is not an .onnx file")
        bundle = path.parent / BUNDLE_DIR
        return DownloadedModel(path, bundle if bundle.is_dir() else None, path.parent)
    candidates = sorted(p for p in path.rglob("*.onnx") if BUNDLE_DIR not in p.relative_to(path).parts[:-1])
    if len(candidates) != 1:
        preferred = path / "model.onnx"
        if preferred not in candidates:
            found = ", ".join(str(p.relative_to(path)) for p in candidates) or "none"
            raise ValueError(f"expected exactly one .onnx model outside {BUNDLE_DIR}/ in {path}; found: {found}")
        candidates = [preferred]
    onnx_path = candidates[0]
    bundle = onnx_path.parent / BUNDLE_DIR
    if not bundle.is_dir():
        bundle = path / BUNDLE_DIR
    return DownloadedModel(onnx_path, bundle if bundle.is_dir() else None, path)


def stage_model_files(onnx_path: Path, bundle_dir: Path | None, staged: Path) -> None:
    """Copy the ONNX file, and the bundle directory as ``bundle/``, into ``staged`` for one upload."""
    (staged / onnx_path.name).write_bytes(onnx_path.read_bytes())
    if bundle_dir is not None:
        for file in sorted(Path(bundle_dir).rglob("*")):
            if file.is_file():
                target = staged / BUNDLE_DIR / file.relative_to(bundle_dir)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(file.read_bytes())
