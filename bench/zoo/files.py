"""Splits written as the files users hand the agent: ``.npy`` per input, sharded ``.npz``, ImageFolder.

* :func:`write_npy`: one ``<input>.npy`` per graph input and ``y.npy``; ``np.load(path, mmap_mode="r")``
  maps them without reading (strings are stored as fixed-width unicode, never as pickled objects);
* :func:`write_npz_shards`: ``shard-00000.npz`` … of at most ``rows`` samples, each holding every input by
  name and ``y``;
* :func:`write_image_folder`: torchvision's ImageFolder layout, ``root/<class>/<index>.png`` (or ``.jpg``),
  from uint8 NHWC images; :func:`read_image_folder` reads it back in the same order (classes sorted by name,
  files by name within a class), as ImageFolder does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bench.zoo.core import Split

IMAGE_SUFFIXES = {"png": ".png", "jpeg": ".jpg"}


def _plain(arr: np.ndarray) -> np.ndarray:
    """Strings as fixed-width unicode (loadable without pickle); everything else unchanged."""
    return np.asarray(arr).astype(np.str_) if np.asarray(arr).dtype == object else np.asarray(arr)


def write_npy(split: Split, directory: str | Path) -> dict[str, Path]:
    """``<directory>/<input>.npy`` per input and ``y.npy``; returns the paths by name (``y`` included)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, arr in {**split.inputs, "y": split.y}.items():
        path = out / f"{name}.npy"
        tmp = out / f".{name}.npy.tmp"
        with open(tmp, "wb") as fh:
            np.save(fh, _plain(arr), allow_pickle=False)
        tmp.replace(path)
        paths[name] = path
    return paths


def write_npz_shards(split: Split, directory: str | Path, rows: int, compressed: bool = False) -> list[Path]:
    """Shards of at most ``rows`` samples, ``shard-00000.npz`` …, each with every input and ``y``."""
    if rows <= 0:
        raise ValueError(f"rows per shard must be positive, got {rows}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save = np.savez_compressed if compressed else np.savez
    paths = []
    for i, start in enumerate(range(0, len(split), rows)):
        part = split.take(slice(start, start + rows))
        path = out / f"shard-{i:05d}.npz"
        arrays: dict[str, Any] = {"y": part.y, **{k: _plain(v) for k, v in part.inputs.items()}}
        save(path, **arrays)
        paths.append(path)
    return paths


def write_image_folder(
    images: np.ndarray,
    y: np.ndarray,
    classes: tuple[str, ...],
    root: str | Path,
    image_format: str = "png",
    quality: int = 90,
) -> Path:
    """uint8 NHWC ``images`` as ``root/<class>/<index:05d>.<ext>`` (``image_format``: png or jpeg)."""
    from PIL import Image

    if image_format not in IMAGE_SUFFIXES:
        raise ValueError(f"image_format must be one of {sorted(IMAGE_SUFFIXES)}, got {image_format!r}")
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(f"images must be uint8 NHWC with 1 or 3 channels, got {images.dtype} {images.shape}")
    out = Path(root)
    for name in classes:
        (out / name).mkdir(parents=True, exist_ok=True)
    suffix = IMAGE_SUFFIXES[image_format]
    for i, (img, label) in enumerate(zip(images, y, strict=True)):
        pil = Image.fromarray(img[..., 0] if img.shape[-1] == 1 else img)
        target = out / classes[int(label)] / f"{i:05d}{suffix}"
        if image_format == "jpeg":
            pil.save(target, format="JPEG", quality=quality)
        else:
            pil.save(target, format="PNG")
    return out


def read_image_folder(root: str | Path) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """uint8 NHWC images, class indices and class names of an ImageFolder tree, in ImageFolder's order."""
    from PIL import Image

    base = Path(root)
    classes = tuple(sorted(p.name for p in base.iterdir() if p.is_dir()))
    images, labels = [], []
    for index, name in enumerate(classes):
        for path in sorted((base / name).iterdir()):
            if path.suffix.lower() in (".png", ".jpg", ".jpeg"):
                with Image.open(path) as im:
                    arr = np.asarray(im.convert("RGB") if im.mode not in ("L", "RGB") else im)
                images.append(arr[..., None] if arr.ndim == 2 else arr)
                labels.append(index)
    return np.stack(images), np.array(labels, np.int64), classes
