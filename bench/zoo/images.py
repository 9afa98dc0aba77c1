"""Synthetic 224×224 colour images of six textures, and the image shifts (blur, brightness).

One image: a background of a random colour under a coarse grating of random orientation, a few distractor
blobs, an object (a disc or a square of random size and place) of a contrasting colour, and Gaussian pixel
noise. The class is the object's fine texture (period 6 to 12 pixels, of random contrast): ``checker``,
``dots``, ``solid``, diagonal, horizontal or vertical ``stripes``. Faint textures under strong noise
are ambiguous, so a good model is not perfect; blur wipes fine textures out. Pixels are uint8 NHWC
``[N, 224, 224, 3]``; :func:`nchw_float` gives the float32 NCHW layout of ``resnet224`` (raw pixels,
scaled inside the graph).

The generator is what the shipped ``resnet224`` models were trained on (``bench/zoo/train_resnet224.py``):
changing it changes the data those models see, so retrain them after any change.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bench.zoo.core import Shift, Split, balanced_labels

#: Sorted by name, as torchvision's ImageFolder numbers classes, so folder order and the model's agree.
PATTERNS = ("checker", "dots", "solid", "stripes_diagonal", "stripes_horizontal", "stripes_vertical")
SIZE = 224
_YY, _XX = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)


def _pattern(kind: int, period: float, phase: np.ndarray) -> np.ndarray:
    """Texture ``kind`` in {-1, 1} (``[SIZE, SIZE]``) of ``period`` pixels, shifted by ``phase``."""
    k = 2 * np.pi / period
    y, x = _YY + phase[0], _XX + phase[1]
    name = PATTERNS[kind]
    if name == "solid":
        return np.zeros((SIZE, SIZE), np.float32)
    if name == "stripes_horizontal":
        return np.sign(np.sin(k * y))
    if name == "stripes_vertical":
        return np.sign(np.sin(k * x))
    if name == "stripes_diagonal":
        return np.sign(np.sin(k * (x + y) / np.sqrt(2.0)))
    if name == "checker":
        return np.sign(np.sin(k * y) * np.sin(k * x))
    # dots: discs of a quarter period's radius on a square grid
    dy, dx = (y % period) - period / 2, (x % period) - period / 2
    return np.where(dy * dy + dx * dx <= (period / 3.5) ** 2, 1.0, -1.0).astype(np.float32)


def _image(kind: int, rng: np.random.Generator) -> np.ndarray:
    bg = rng.uniform(40, 215, 3)
    theta, period, phase = rng.uniform(0, np.pi), rng.uniform(20, 50), rng.uniform(0, 2 * np.pi)
    grating = np.sin(2 * np.pi / period * (np.cos(theta) * _XX + np.sin(theta) * _YY) + phase)
    img = bg[None, None, :] + rng.uniform(8, 25) * grating[..., None]
    for _ in range(int(rng.integers(1, 5))):  # distractor blobs
        by, bx, br = rng.uniform(0, SIZE), rng.uniform(0, SIZE), rng.uniform(4, 12)
        img[(_YY - by) ** 2 + (_XX - bx) ** 2 <= br * br] = rng.uniform(0, 255, 3)
    sign = np.where(rng.random(3) < 0.5, -1.0, 1.0)
    fg = bg + sign * rng.uniform(40, 90, 3)
    fg = np.where((fg < 0) | (fg > 255), bg - sign * rng.uniform(40, 90, 3), fg)
    r = rng.uniform(30, 75)
    cy, cx = rng.uniform(r + 2, SIZE - r - 2, 2)
    if rng.random() < 0.5:
        mask = (_YY - cy) ** 2 + (_XX - cx) ** 2 <= r * r
    else:
        mask = (np.abs(_YY - cy) <= 0.85 * r) & (np.abs(_XX - cx) <= 0.85 * r)
    texture = _pattern(kind, rng.uniform(6, 12), rng.uniform(0, 12, 2))
    img[mask] = fg[None, :] + rng.uniform(20, 60) * texture[mask][:, None]
    img += rng.normal(0, rng.uniform(5, 25), img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def generate(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images uint8 ``[n, 224, 224, 3]`` and their classes, balanced, from ``seed``."""
    rng = np.random.default_rng([seed, 601])
    y = balanced_labels(n, len(PATTERNS), rng)
    x = np.empty((n, SIZE, SIZE, 3), np.uint8)
    for i, kind in enumerate(y):
        x[i] = _image(int(kind), rng)
    return x, y


def nchw_float(x: np.ndarray) -> np.ndarray:
    """uint8 NHWC → float32 NCHW raw pixels (what ``resnet224`` takes)."""
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2), dtype=np.float32)


# -- shifts ----------------------------------------------------------------------------------------------
def _map_images(split: Split, layout: str, fn: Callable[[np.ndarray], np.ndarray]) -> Split:
    """Apply ``fn`` to float32 NHWC pixels of the split's one input and restore its layout and dtype."""
    ((name, x),) = split.inputs.items()
    nhwc = x.transpose(0, 2, 3, 1) if layout == "NCHW" else x
    out = np.clip(fn(nhwc.astype(np.float32)), 0, 255)
    if x.dtype == np.uint8:
        out = np.rint(out)
    out = out.astype(x.dtype)
    return split.with_inputs(**{name: np.ascontiguousarray(out.transpose(0, 3, 1, 2) if layout == "NCHW" else out)})


def blur(layout: str, max_sigma: float) -> Shift:
    """Gaussian blur of ``max_sigma * strength`` pixels (a camera out of focus)."""

    def blur_shift(split: Split, strength: float, seed: int) -> Split:
        del seed  # deterministic
        from scipy.ndimage import gaussian_filter

        sigma = max_sigma * strength
        if sigma == 0:
            return split
        return _map_images(split, layout, lambda x: gaussian_filter(x, sigma=(0, sigma, sigma, 0), mode="nearest"))

    return blur_shift


def brightness(layout: str) -> Shift:
    """Pixels times ``1 + strength`` plus ``60 * strength``, clipped (over-exposure washes contrast out)."""

    def brightness_shift(split: Split, strength: float, seed: int) -> Split:
        del seed  # deterministic
        return _map_images(split, layout, lambda x: x * (1.0 + strength) + 60.0 * strength)

    return brightness_shift
