"""Image folders read lazily: the ImageFolder layout (one subfolder per class, PNG or JPEG files) and the
preprocessing that turns a file into the model's input tensor, declared at ``fit`` and kept in the bundle.

10,000 images of 3×224×224 are 6 GB of float32: :class:`ImageSource` never holds them. It lists the files
and their labels, and decodes a batch at a time (:meth:`ImageSource.batches`) or the few samples asked for
(:meth:`ImageSource.take`). :class:`Preprocess` says how a file becomes a tensor: the size it is resized
to, the scale of its pixel values, a per-channel mean and standard deviation to normalise by, the layout
(``nchw`` or ``nhwc``), the dtype and the number of channels; by default all of it comes from the model's
input (:meth:`Preprocess.for_input`): its shape and dtype, and pixels scaled to [0, 1] for a float input.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.data.limits import DataError, DataLimits

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class Preprocess:
    """How an image file becomes a model input (recorded in the bundle, the same at ``check``)."""

    height: int
    width: int
    layout: str = "nchw"
    channels: int = 3
    dtype: str = "float32"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.layout not in ("nchw", "nhwc"):
            raise DataError(f"image layout must be nchw or nhwc, got {self.layout!r}")
        if self.channels not in (1, 3):
            raise DataError(f"images must have 1 or 3 channels, got {self.channels}")
        for name, v in (("mean", self.mean), ("std", self.std)):
            if v and len(v) != self.channels:
                raise DataError(f"image {name} needs {self.channels} values (one per channel), got {len(v)}")
        if self.std and any(s <= 0 for s in self.std):
            raise DataError("image std values must be positive")

    @classmethod
    def for_input(cls, name: str, shape: Sequence[int | None], dtype: np.dtype) -> Preprocess:
        """The preprocessing a model's image input implies (its shape per sample and dtype): ``[C, H, W]``
        or ``[H, W, C]``, pixels scaled to [0, 1] for a float input (kept as 0..255 for an integer one)."""
        s = tuple(shape)
        if len(s) != 3 or any(d is None for d in s):
            raise DataError(f"input {name!r} of shape {list(s)} is not a fixed-size image [C, H, W] or [H, W, C]")
        c0, c2 = int(s[0] or 0), int(s[2] or 0)
        if c0 in (1, 3):
            layout, channels, h, w = "nchw", c0, int(s[1] or 0), c2
        elif c2 in (1, 3):
            layout, channels, h, w = "nhwc", c2, c0, int(s[1] or 0)
        else:
            raise DataError(f"input {name!r} of shape {list(s)} has no channel axis of 1 or 3")
        integer = np.dtype(dtype).kind in "iu"
        return cls(h, w, layout, channels, str(np.dtype(dtype)), 1.0 if integer else 1.0 / 255.0)

    def with_options(self, text: str | None) -> Preprocess:
        """Overrides from ``fit --preprocess "scale=1 mean=0.485,0.456,0.406 std=0.229,0.224,0.225"``."""
        if not text:
            return self
        out = self
        for item in text.split():
            key, sep, value = item.partition("=")
            if not sep:
                raise DataError(f"--preprocess: {item!r} is not key=value (keys: scale, mean, std)")
            try:
                if key == "scale":
                    num, _, den = value.partition("/")
                    out = replace(out, scale=float(num) / (float(den) if den else 1.0))
                elif key == "mean":
                    out = replace(out, mean=tuple(float(v) for v in value.split(",")))
                elif key == "std":
                    out = replace(out, std=tuple(float(v) for v in value.split(",")))
                else:
                    raise DataError(f"--preprocess: unknown key {key!r} (keys: scale, mean, std)")
            except ValueError:
                raise DataError(f"--preprocess: {item!r} is not a number or a list of numbers") from None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Preprocess:
        return cls(
            int(d["height"]),
            int(d["width"]),
            str(d.get("layout", "nchw")),
            int(d.get("channels", 3)),
            str(d.get("dtype", "float32")),
            float(d.get("scale", 1.0 / 255.0)),
            tuple(float(v) for v in d.get("mean", ())),
            tuple(float(v) for v in d.get("std", ())),
        )

    def load(self, path: Path) -> np.ndarray:
        """One file as the model's input tensor (without the batch axis)."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as img:
                img.draft("RGB" if self.channels == 3 else "L", (self.width, self.height))  # JPEG: decode smaller
                im = img.convert("RGB" if self.channels == 3 else "L")
                if im.size != (self.width, self.height):
                    im = im.resize((self.width, self.height), Image.Resampling.BILINEAR)
                a = np.asarray(im, dtype=np.float32)
        except (OSError, UnidentifiedImageError, Image.DecompressionBombError) as exc:
            raise DataError(f"{path}: not a readable image ({exc})") from None
        if a.ndim == 2:
            a = a[:, :, None]
        dtype = np.dtype(self.dtype)
        if dtype.kind == "f":
            a *= np.float32(self.scale)
            if self.mean:
                a -= np.asarray(self.mean, np.float32)
            if self.std:
                a /= np.asarray(self.std, np.float32)
        if self.layout == "nchw":
            a = a.transpose(2, 0, 1)
        return np.ascontiguousarray(a.astype(dtype, copy=False))


def is_image_folder(path: Path) -> bool:
    """A directory whose subfolders hold image files (the ImageFolder layout)."""
    return path.is_dir() and any(
        f.suffix.lower() in IMAGE_SUFFIXES for d in path.iterdir() if d.is_dir() for f in d.iterdir()
    )


def folder_labels(root: Path, folders: list[str], labels: np.ndarray, classes: list[str]) -> np.ndarray:
    """Labels of an image folder for a model's ``classes``: the folder names when they are class names,
    else, as ImageFolder numbers classes, the index of each folder in sorted order (when there are as
    many folders as classes)."""
    if set(folders) <= set(classes):
        return labels
    if len(folders) == len(classes):
        index = {name: i for i, name in enumerate(folders)}
        return np.array([index[str(v)] for v in labels], dtype=np.int64)
    unknown = sorted(set(folders) - set(classes))
    raise DataError(
        f"{root}: class folder(s) {', '.join(unknown[:5])} are no class of the model, and its {len(folders)} folders "
        f"are not its {len(classes)} classes in sorted order; name the folders after the classes (--classes)"
    )


class ImageSource:
    """The images of an ImageFolder directory, read a batch at a time (``n`` samples, labels by folder)."""

    def __init__(
        self,
        root: Path,
        name: str,
        preprocess: Preprocess,
        classes: Sequence[str] | None = None,
        limits: DataLimits | None = None,
    ) -> None:
        self.root = root
        self.name = name
        self.preprocess = preprocess
        folders = sorted(d for d in root.iterdir() if d.is_dir())
        if not folders:
            raise DataError(f"{root}: no class subfolders (ImageFolder layout: <root>/<class>/<image>.png)")
        self.folder_classes = [d.name for d in folders]
        files: list[Path] = []
        labels: list[str] = []
        for d in folders:
            for f in sorted(d.iterdir()):
                if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file():
                    files.append(f)
                    labels.append(d.name)
        if not files:
            raise DataError(f"{root}: no PNG or JPEG files in its class subfolders")
        if limits is not None:
            limits.check_rows(len(files), str(root))
        self.files = files
        self.y = np.asarray(labels, dtype=object)
        if classes is not None:
            self.y = folder_labels(root, self.folder_classes, self.y, [str(c) for c in classes])

    @property
    def n(self) -> int:
        return len(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def _read(self, paths: Sequence[Path]) -> dict[str, np.ndarray]:
        return {self.name: np.stack([self.preprocess.load(p) for p in paths])}

    def take(self, index: np.ndarray | slice) -> dict[str, np.ndarray]:
        """The samples at ``index``, decoded (the model's input by name)."""
        idx = np.arange(self.n)[index]
        return self._read([self.files[i] for i in idx])

    def batches(self, size: int) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, self.n, size):
            yield self._read(self.files[start : start + size])
