"""The demo's live traffic: phases of MNIST-5k test images whose truth the demo knows.

Each phase draws ``n`` labeled images from the MNIST-5k test split (1,000 images the shipped CNN
never saw in training) and transforms them:

1. **in distribution** — the test images as they are;
2. **label shift** — the same images, but the classes the CNN finds hardest (2, 3, 5, 8, 9) are
   four times as frequent; every single image is still in distribution;
3. **translation** — every digit moved by 3–4 pixels in one of eight directions (zero fill);
4. **noise** — Gaussian pixel noise of σ = 30 % of the pixel range, clipped;
5. **recovery** — in distribution again (a new draw; all 1,000 test images in a new order when
   a phase holds 1,000).

Everything is seeded; the transformations are plain numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: Classes made more frequent in the label-shift phase, and by how much.
SHIFTED_CLASSES = (2, 3, 5, 8, 9)
SHIFT_WEIGHT = 4.0
#: Translation of the drift phase, pixels (the direction is one of eight, per image).
TRANSLATION_PIXELS = (3, 4)
#: Noise of the noise-drift phase, as a share of the pixel range 0..255.
NOISE_SIGMA = 0.30


@dataclass(frozen=True)
class Phase:
    """One phase of traffic: a name, a one-line description, the inputs and their true labels."""

    key: str
    name: str
    description: str
    x: np.ndarray
    y: np.ndarray

    @property
    def n(self) -> int:
        return len(self.y)


def translate(x: np.ndarray, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Move image ``i`` of ``x [N, C, H, W]`` by ``dx[i]`` columns and ``dy[i]`` rows, zero fill."""
    out = np.zeros_like(x)
    h, w = x.shape[-2:]
    for i in range(len(x)):
        sx, sy = int(dx[i]), int(dy[i])
        out[i, ..., max(sy, 0) : h + min(sy, 0), max(sx, 0) : w + min(sx, 0)] = x[
            i, ..., max(-sy, 0) : h + min(-sy, 0), max(-sx, 0) : w + min(-sx, 0)
        ]
    return out


def _draw(y: np.ndarray, n: int, rng: np.random.Generator, weights: np.ndarray | None = None) -> np.ndarray:
    if weights is None and n <= len(y):
        return rng.permutation(len(y))[:n]
    p = None if weights is None else weights / weights.sum()
    return rng.choice(len(y), size=n, replace=True, p=p)


def _label_shift(x: np.ndarray, y: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    w = np.where(np.isin(y, SHIFTED_CLASSES), SHIFT_WEIGHT, 1.0)
    idx = _draw(y, n, rng, w)
    return x[idx], y[idx]


def _translation(x: np.ndarray, y: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    idx = _draw(y, n, rng)
    angle = rng.integers(0, 8, n) * (np.pi / 4)
    dist = rng.integers(TRANSLATION_PIXELS[0], TRANSLATION_PIXELS[1] + 1, n)
    dx = np.rint(np.cos(angle) * dist).astype(int)
    dy = np.rint(np.sin(angle) * dist).astype(int)
    return translate(x[idx], dx, dy), y[idx]


def _noise(x: np.ndarray, y: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    idx = _draw(y, n, rng)
    noisy = x[idx] + rng.normal(0.0, NOISE_SIGMA * 255.0, x[idx].shape)
    return np.clip(noisy, 0.0, 255.0).astype(np.float32), y[idx]


def _plain(x: np.ndarray, y: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    idx = _draw(y, n, rng)
    return x[idx], y[idx]


Builder = Callable[[np.ndarray, np.ndarray, int, np.random.Generator], tuple[np.ndarray, np.ndarray]]

PHASES: tuple[tuple[str, str, str, Builder], ...] = (
    ("in_distribution", "in distribution", "MNIST test images as they are", _plain),
    (
        "label_shift",
        "label shift",
        f"classes {', '.join(map(str, SHIFTED_CLASSES))} {SHIFT_WEIGHT:g}x as frequent; images unchanged",
        _label_shift,
    ),
    (
        "translation",
        "translation",
        f"digits moved {TRANSLATION_PIXELS[0]}-{TRANSLATION_PIXELS[1]} px in one of 8 directions",
        _translation,
    ),
    ("noise", "noise", f"Gaussian pixel noise, sigma {NOISE_SIGMA:.0%} of the range", _noise),
    ("recovery", "recovery", "in distribution again (a new draw, or all test images in a new order)", _plain),
)


def build_phases(x: np.ndarray, y: np.ndarray, n: int, seed: int) -> list[Phase]:
    """The five phases of ``n`` images each, drawn from ``(x, y)`` with ``seed``."""
    out = []
    for i, (key, name, description, builder) in enumerate(PHASES):
        rng = np.random.default_rng([seed, i])
        px, py = builder(x, y, n, rng)
        out.append(Phase(key, name, description, np.ascontiguousarray(px, dtype=np.float32), py.astype(np.int64)))
    return out
