"""Label-preserving perturbations of images and tables, by name.

Shared by the metamorphic audit (:mod:`agent.audits.metamorphic`, LAMPION §3: a transformed input
must keep the oracle's label) and the calibration shifts of the accuracy estimators
(:mod:`agent.offline.calibration.corruptions`), so both perturb data the same way.

* images ``[N, C, H, W]`` (or ``[N, H, W]``): ``shift``, ``brightness``, ``contrast``,
  ``gaussian_noise``, ``rotation``, ``blur``, ``hflip``/``vflip`` (flips only when declared safe);
  results are clipped to the data's value range.
* tables ``[N, D]``: ``scale`` (every value ``×(1 + u)``) and ``noise`` (``N(0, (sigma·std_j)²)``).

Each transformation draws its random parameters per sample from the generator it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["TRANSFORMS", "Transform", "TransformContext", "TransformFn"]


@dataclass(frozen=True)
class TransformContext:
    """What transformations may need to know about the audited data."""

    value_range: tuple[float, float]
    column_std: np.ndarray | None = None
    flips_safe: bool = False


TransformFn = Callable[[np.ndarray, np.random.Generator, TransformContext, Mapping[str, float]], np.ndarray]


@dataclass(frozen=True)
class Transform:
    """A transformation: its function, default parameters, whether it needs images, whether it flips."""

    fn: TransformFn
    defaults: Mapping[str, float]
    images_only: bool
    is_flip: bool = False


def _clip(x: np.ndarray, ctx: TransformContext) -> np.ndarray:
    lo, hi = ctx.value_range
    return np.clip(x, lo, hi)


def _span(ctx: TransformContext) -> float:
    lo, hi = ctx.value_range
    return float(hi - lo) if hi > lo else 1.0


def _per_sample(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Broadcast one value per sample over the remaining axes of ``x``."""
    return values.reshape((len(x),) + (1,) * (x.ndim - 1))


def _shift(x: np.ndarray, rng: np.random.Generator, ctx: TransformContext, p: Mapping[str, float]) -> np.ndarray:
    m = int(p["max_pixels"])
    fill = float(p["fill"])
    dy = rng.integers(-m, m + 1, len(x))
    dx = rng.integers(-m, m + 1, len(x))
    out = np.full_like(x, fill)
    h, w = x.shape[-2], x.shape[-1]
    for sy, sx in set(zip(dy.tolist(), dx.tolist(), strict=True)):
        idx = np.flatnonzero((dy == sy) & (dx == sx))
        src_r = slice(max(0, -sy), h - max(0, sy))
        dst_r = slice(max(0, sy), h - max(0, -sy))
        src_c = slice(max(0, -sx), w - max(0, sx))
        dst_c = slice(max(0, sx), w - max(0, -sx))
        out[idx, ..., dst_r, dst_c] = x[idx, ..., src_r, src_c]
    return out


def _brightness(x: np.ndarray, rng: np.random.Generator, ctx: TransformContext, p: Mapping[str, float]) -> np.ndarray:
    d = float(p["delta"])
    offset = rng.uniform(-d, d, len(x)) * _span(ctx)
    return _clip(x + _per_sample(offset, x), ctx)


def _contrast(x: np.ndarray, rng: np.random.Generator, ctx: TransformContext, p: Mapping[str, float]) -> np.ndarray:
    a = float(p["amount"])
    factor = _per_sample(rng.uniform(1 - a, 1 + a, len(x)), x)
    mean = x.reshape(len(x), -1).mean(axis=1)
    mean = _per_sample(mean, x)
    return _clip((x - mean) * factor + mean, ctx)


def _noise_image(x: np.ndarray, rng: np.random.Generator, ctx: TransformContext, p: Mapping[str, float]) -> np.ndarray:
    return _clip(x + rng.normal(0.0, float(p["sigma"]) * _span(ctx), x.shape), ctx)


def _rotation(x: np.ndarray, rng: np.random.Generator, ctx: TransformContext, p: Mapping[str, float]) -> np.ndarray:
    from scipy.ndimage import rotate  # scipy stays out of start-up until it is needed

    m = float(p["max_degrees"])
    angles = rng.uniform(-m, m, len(x))
    out = np.empty_like(x)
    for i, angle in enumerate(angles):
        out[i] = rotate(
            x[i], float(angle), axes=(-1, -2), reshape=False, order=1, mode="constant", cval=float(p["fill"])
        )
    return _clip(out, ctx)


def _blur(x: np.ndarray, rng: np.random.Generator, ctx: TransformContext, p: Mapping[str, float]) -> np.ndarray:
    from scipy.ndimage import gaussian_filter  # scipy stays out of start-up until it is needed

    s = float(p["sigma"])
    sigma = (0.0,) * (x.ndim - 2) + (s, s)
    return _clip(gaussian_filter(x, sigma=sigma, mode="constant", cval=float(p["fill"])), ctx)


def _hflip(x: np.ndarray, rng: np.random.Generator, ctx: TransformContext, p: Mapping[str, float]) -> np.ndarray:
    return np.ascontiguousarray(x[..., ::-1])


def _vflip(x: np.ndarray, rng: np.random.Generator, ctx: TransformContext, p: Mapping[str, float]) -> np.ndarray:
    return np.ascontiguousarray(x[..., ::-1, :])


def _scale(x: np.ndarray, rng: np.random.Generator, ctx: TransformContext, p: Mapping[str, float]) -> np.ndarray:
    e = float(p["epsilon"])
    return x * (1.0 + rng.uniform(-e, e, x.shape))


def _noise_table(x: np.ndarray, rng: np.random.Generator, ctx: TransformContext, p: Mapping[str, float]) -> np.ndarray:
    flat = x.reshape(len(x), -1)
    std = ctx.column_std if ctx.column_std is not None else flat.std(axis=0)
    noisy = flat + rng.normal(0.0, 1.0, flat.shape) * (float(p["sigma"]) * std)
    return noisy.reshape(x.shape)


#: Registry: name → function, default parameters, whether it needs images ``[N, (C,) H, W]``.
TRANSFORMS: dict[str, Transform] = {
    "shift": Transform(_shift, {"max_pixels": 2, "fill": 0.0}, True),
    "brightness": Transform(_brightness, {"delta": 0.1}, True),
    "contrast": Transform(_contrast, {"amount": 0.2}, True),
    "gaussian_noise": Transform(_noise_image, {"sigma": 0.03}, True),
    "rotation": Transform(_rotation, {"max_degrees": 10.0, "fill": 0.0}, True),
    "blur": Transform(_blur, {"sigma": 0.5, "fill": 0.0}, True),
    "hflip": Transform(_hflip, {}, True, is_flip=True),
    "vflip": Transform(_vflip, {}, True, is_flip=True),
    "scale": Transform(_scale, {"epsilon": 0.01}, False),
    "noise": Transform(_noise_table, {"sigma": 0.01}, False),
}
