"""``resnet224`` and ``resnet224_nhwc_uint8``: a ResNet-style CNN on 224×224 colour images, shipped trained.

Both files live in ``bench/zoo/models/`` (made by ``python -m bench.zoo.train_resnet224``, which needs
torch); the data are generated here by :func:`bench.zoo.images.generate`, so tests need no torch.

* ``resnet224``: input ``input`` float32 NCHW ``[N, 3, 224, 224]``, raw pixels 0..255;
* ``resnet224_nhwc_uint8``: the same network behind input ``input`` uint8 NHWC ``[N, 224, 224, 3]``
  (``Cast`` and ``Transpose`` inside the graph), as a camera pipeline sends frames.

Output ``logits`` ``[N, 6]``; the value ``features`` ``[N, 64]`` is the pooled penultimate representation.
Shifts: ``blur`` (Gaussian, up to σ = 3 pixels) and ``brightness`` (see :mod:`.images`).

The generated images are cached in the work directory as ``.npy`` files and read memory-mapped, so a
split of a few hundred 224×224 images costs page cache, not process memory, until it is used.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bench.zoo.core import Split, ZooModel, cache_dir, graph_inputs, source_digest
from bench.zoo.files import write_npy
from bench.zoo.images import PATTERNS, blur, brightness, generate, nchw_float

MODELS_DIR = Path(__file__).resolve().parent / "models"
SIZES = (300, 150, 150)
MAX_BLUR_SIGMA = 3.0
PARTS = ("train", "val", "test")


def _read_npy(directory: Path) -> Split:
    return Split(
        {"input": np.load(directory / "input.npy", mmap_mode="r")}, np.load(directory / "y.npy", allow_pickle=False)
    )


def _splits(workdir: str | os.PathLike[str], seed: int, sizes: tuple[int, int, int], nchw: bool) -> dict[str, Split]:
    """The images of one seed, generated once per work directory (uint8 NHWC; float32 NCHW made from them)."""
    images_py = __file__.replace("resnet224.py", "images.py")
    where = cache_dir(workdir, "images224", seed, sizes, source_digest(images_py))
    out = {}
    for i, (part, n) in enumerate(zip(PARTS, sizes, strict=True)):
        nhwc_dir, nchw_dir = where / part / "nhwc", where / part / "nchw"
        if not (nhwc_dir / "y.npy").is_file():
            x, y = generate(n, seed * 10 + i)
            write_npy(Split({"input": x}, y), nhwc_dir)
        if nchw and not (nchw_dir / "y.npy").is_file():
            nhwc = _read_npy(nhwc_dir)
            write_npy(Split({"input": nchw_float(nhwc.inputs["input"])}, nhwc.y), nchw_dir)
        out[part] = _read_npy(nchw_dir if nchw else nhwc_dir)
    return out


def _build(name: str, workdir: str | os.PathLike[str], seed: int, sizes: tuple[int, int, int]) -> ZooModel:
    nchw = name == "resnet224"
    path = MODELS_DIR / f"{name}.onnx"
    splits = _splits(workdir, seed, sizes, nchw)
    layout = "NCHW" if nchw else "NHWC"
    return ZooModel(
        name=name,
        kind="image",
        path=path,
        inputs=graph_inputs(path.read_bytes()),
        classes=PATTERNS,
        train=splits["train"],
        val=splits["val"],
        test=splits["test"],
        scores_output="logits",
        scores_kind="logits",
        shifts={"blur": blur(layout, MAX_BLUR_SIGMA), "brightness": brightness(layout)},
        penultimate="features",
        batch_size=32,
    )


def build_nchw(workdir: str | os.PathLike[str], seed: int = 0, sizes: tuple[int, int, int] = SIZES) -> ZooModel:
    return _build("resnet224", workdir, seed, sizes)


def build_nhwc_uint8(workdir: str | os.PathLike[str], seed: int = 0, sizes: tuple[int, int, int] = SIZES) -> ZooModel:
    return _build("resnet224_nhwc_uint8", workdir, seed, sizes)
