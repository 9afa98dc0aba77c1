"""The corruptions of the calibration split that ``shift_aware`` learns from (used by ``icos-agent fit``).

The validation data has labels; corrupting it with transformations whose label is known (the
original one) gives labeled examples of how the model, the oracle and the confidence behave
when the operational data drifts. The estimators are calibrated on these examples (see
:mod:`agent.estimation.estimators.registry`, estimator ``shift_aware``, and :mod:`agent.offline.calibration.sets`).

Two families, each applied at random strengths from harmless to label-breaking so the
calibration sees a continuum from in-distribution to badly shifted data:

* ``generic``: corruptions the agent uses nowhere else: elastic warps, random occlusion,
  pixelation, gamma changes, salt-and-pepper noise, zoom/shear, the overlay of two images, motion
  blur, fog, strokes and edge images for images; for tables, feature dropout to the mean,
  heavy-tailed noise, quantisation, monotone warps and feature swaps.
* ``audit``: the label-preserving transformations of the metamorphic audit
  (:data:`agent.perturb.transforms.TRANSFORMS`: pixel shifts, brightness, contrast, Gaussian noise,
  rotation and Gaussian blur for images; multiplicative scaling and Gaussian noise for tables), with
  their parameters drawn over wide ranges (:data:`AUDIT_RANGES`). These are the drifts the agent
  already audits the model against, so the estimator learns how the model reacts to them.

Each generated set uses one transformation of one family. Set names are ``<transformation>`` for
the generic family and ``audit:<transformation>`` for the audit family.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from agent.perturb.transforms import TRANSFORMS, TransformContext
from invariants.fit_params import CalibrationPlan

Corruption = Callable[[np.ndarray, float, np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class ShiftedSet:
    """One corrupted copy of the calibration data: ``x`` in the model's input shape, its name/strength."""

    name: str
    strength: float
    x: np.ndarray


# -- images ([N, C, H, W] or [N, H, W] in the model's raw scale) -------------------------------------


def as_nchw(x: np.ndarray) -> np.ndarray:
    if x.ndim == 3:
        return x[:, None]
    return x


#: Images larger than this a side get their smooth random fields (elastic, fog) drawn on a coarser grid.
FIELD_SIDE = 64


def _smooth_field(
    rng: np.random.Generator, lo: float, hi: float, h: int, w: int, frac: float, sigma_h: float | None = None
) -> np.ndarray:
    """Uniform noise on ``[lo, hi)`` smoothed by a Gaussian of ``frac × w`` pixels (``sigma_h`` down the
    rows, when given), ``[h, w]``. A field that smooth has no detail finer than a few pixels of a
    :data:`FIELD_SIDE` grid, so larger images draw it there and interpolate it up: a 224×224 field costs
    a tenth of a millisecond instead of tens."""
    from scipy import ndimage

    sigma = (sigma_h if sigma_h is not None else max(frac * w, 1.0), max(frac * w, 1.0))
    if max(h, w) <= FIELD_SIDE:
        return np.asarray(ndimage.gaussian_filter(rng.uniform(lo, hi, (h, w)), sigma))
    gh, gw = max(2, round(h * FIELD_SIDE / max(h, w))), max(2, round(w * FIELD_SIDE / max(h, w)))
    coarse = ndimage.gaussian_filter(rng.uniform(lo, hi, (gh, gw)), (sigma[0] * gh / h, sigma[1] * gw / w))
    return np.asarray(ndimage.zoom(coarse, (h / gh, w / gw), order=1, grid_mode=True, mode="nearest"))[:h, :w]


def _elastic(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    from scipy import ndimage

    n, c, h, w = x.shape
    alpha = s * 0.35 * w
    out = np.empty_like(x)
    yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    for i in range(n):
        dy = _smooth_field(rng, -1.0, 1.0, h, w, 0.12)
        dx = _smooth_field(rng, -1.0, 1.0, h, w, 0.12)
        dy *= alpha / max(float(np.abs(dy).max()), 1e-9)
        dx *= alpha / max(float(np.abs(dx).max()), 1e-9)
        for ch in range(c):
            out[i, ch] = ndimage.map_coordinates(x[i, ch], [yy + dy, xx + dx], order=1, mode="constant", cval=0.0)
    return out


def _occlusion(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    n, _, h, w = x.shape
    out = x.copy()
    size = max(1, int(round(s * 0.6 * w)))
    for i in range(n):
        top, left = rng.integers(0, max(h - size, 0) + 1), rng.integers(0, max(w - size, 0) + 1)
        out[i, :, top : top + size, left : left + size] = 0.0
    return out


def _pixelate(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    _, _, h, w = x.shape
    f = 1 + int(round(s * max(w // 4, 1)))
    if f <= 1:
        return x.copy()
    hh, ww = -(-h // f) * f, -(-w // f) * f
    pad = np.pad(x, ((0, 0), (0, 0), (0, hh - h), (0, ww - w)), mode="edge")
    blocks = pad.reshape(x.shape[0], x.shape[1], hh // f, f, ww // f, f).mean(axis=(3, 5))
    return np.repeat(np.repeat(blocks, f, axis=2), f, axis=3)[:, :, :h, :w]


def _gamma(x: np.ndarray, s: float, rng: np.random.Generator, top: float) -> np.ndarray:
    g = float(np.exp(rng.choice([-1.0, 1.0]) * s * np.log(4.0)))
    return top * (np.clip(x / top, 0.0, 1.0) ** g)


def _salt_pepper(x: np.ndarray, s: float, rng: np.random.Generator, top: float) -> np.ndarray:
    p = 0.25 * s
    u = rng.uniform(size=x.shape)
    out = x.copy()
    out[u < p / 2] = 0.0
    out[(u >= p / 2) & (u < p)] = top
    return out


def _zoom_shear(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    from scipy import ndimage

    n, c, h, w = x.shape
    out = np.empty_like(x)
    centre = np.array([(h - 1) / 2, (w - 1) / 2])
    for i in range(n):
        zoom = float(np.exp(rng.uniform(-1, 1) * s * 0.5))
        shear = float(rng.uniform(-1, 1) * s * 0.6)
        m = np.array([[1.0 / zoom, 0.0], [shear, 1.0 / zoom]])
        offset = centre - m @ centre
        for ch in range(c):
            out[i, ch] = ndimage.affine_transform(x[i, ch], m, offset=offset, order=1, mode="constant", cval=0.0)
    return out


def _overlay(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    other = x[rng.permutation(len(x))]
    a = 0.6 * s
    return (1 - a) * x + a * other


def _motion_blur(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    """Average along a line segment of random direction (camera shake; MNIST-C "motion blur")."""
    n, c, h, w = x.shape
    length = 1 + int(round(s * 0.35 * w))
    if length <= 1:
        return x.copy()
    out = np.zeros_like(x)
    steps = np.linspace(-(length - 1) / 2, (length - 1) / 2, length)
    for i in range(n):
        a = rng.uniform(0, np.pi)
        dy, dx = np.sin(a), np.cos(a)
        acc = np.zeros((c, h, w))
        for t in steps:
            oy, ox = int(round(t * dy)), int(round(t * dx))
            acc += np.roll(np.roll(x[i], oy, axis=1), ox, axis=2)
        out[i] = acc / length
    return out


def _fog(x: np.ndarray, s: float, rng: np.random.Generator, top: float) -> np.ndarray:
    """Add a smooth random haze and rescale to the pixel range (ImageNet-C "fog")."""
    n, c, h, w = x.shape
    amount = 0.8 * s
    field = np.stack([_smooth_field(rng, 0.0, 1.0, h, w, 0.2, sigma_h=0.2 * h)[None] for _ in range(n)])
    lo = field.min(axis=(2, 3), keepdims=True)
    hi = field.max(axis=(2, 3), keepdims=True)
    field = (field - lo) / np.maximum(hi - lo, 1e-9)
    return (x + amount * top * field) / (1.0 + amount)


def _lines(x: np.ndarray, s: float, rng: np.random.Generator, top: float) -> np.ndarray:
    """Draw random straight strokes over the image (MNIST-C "stripe"/"dotted line")."""
    n, _, h, w = x.shape
    out = x.copy()
    k = 1 + int(round(s * 3))
    t = np.linspace(0, 1, 4 * max(h, w))
    for i in range(n):
        for _ in range(k):
            y0, y1 = rng.uniform(0, h - 1, 2)
            x0, x1 = rng.uniform(0, w - 1, 2)
            yy = np.round(y0 + (y1 - y0) * t).astype(int)
            xx = np.round(x0 + (x1 - x0) * t).astype(int)
            out[i, :, yy, xx] = np.maximum(out[i, :, yy, xx], min(1.0, 0.4 + s) * top)
    return out


def _edges(x: np.ndarray, s: float, rng: np.random.Generator, top: float) -> np.ndarray:
    """Blend the image with its gradient magnitude (MNIST-C "canny edges", a Sobel variant)."""
    from scipy import ndimage

    # Sobel within each image: ndimage.sobel would also smooth across the batch and channel axes
    gy = ndimage.correlate1d(
        ndimage.correlate1d(x, [-1, 0, 1], axis=2, mode="constant"), [1, 2, 1], axis=3, mode="constant"
    )
    gx = ndimage.correlate1d(
        ndimage.correlate1d(x, [-1, 0, 1], axis=3, mode="constant"), [1, 2, 1], axis=2, mode="constant"
    )
    mag = np.hypot(gx, gy)
    mag = mag / np.maximum(mag.max(axis=(1, 2, 3), keepdims=True), 1e-9) * top
    return (1 - s) * x + s * mag


def image_corruptions(top: float) -> dict[str, Corruption]:
    """The generic image family; ``top`` is the pixel range's maximum."""
    return {
        "elastic": _elastic,
        "occlusion": _occlusion,
        "pixelate": _pixelate,
        "gamma": lambda x, s, r: _gamma(x, s, r, top),
        "salt_pepper": lambda x, s, r: _salt_pepper(x, s, r, top),
        "zoom_shear": _zoom_shear,
        "overlay": _overlay,
        "motion_blur": _motion_blur,
        "fog": lambda x, s, r: _fog(x, s, r, top),
        "lines": lambda x, s, r: _lines(x, s, r, top),
        "edges": lambda x, s, r: _edges(x, s, r, top),
    }


# -- tables ([N, D]) ------------------------------------------------------------------------------


def _tab_dropout(x: np.ndarray, s: float, rng: np.random.Generator, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    mask = rng.uniform(size=x.shape) < 0.6 * s
    return np.where(mask, mean[None, :], x)


def _tab_heavy_noise(
    x: np.ndarray, s: float, rng: np.random.Generator, mean: np.ndarray, std: np.ndarray
) -> np.ndarray:
    return x + rng.standard_t(2.0, size=x.shape) * s * 0.6 * std[None, :]


def _tab_quantise(x: np.ndarray, s: float, rng: np.random.Generator, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    step = np.maximum(s * 2.0 * std, 1e-12)[None, :]
    return np.round((x - mean[None, :]) / step) * step + mean[None, :]


def _tab_warp(x: np.ndarray, s: float, rng: np.random.Generator, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    z = (x - mean[None, :]) / np.maximum(std, 1e-12)[None, :]
    k = 1.0 + 2.0 * s
    cols = rng.uniform(size=x.shape[1]) < 0.5
    warped = np.sign(z) * np.abs(z) ** np.where(cols, k, 1.0 / k)[None, :]
    return mean[None, :] + warped * std[None, :]


def _tab_swap(x: np.ndarray, s: float, rng: np.random.Generator, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    d = x.shape[1]
    k = max(2, int(round(s * d * 0.5)))
    cols = rng.choice(d, min(k, d), replace=False)
    z = (x - mean[None, :]) / np.maximum(std, 1e-12)[None, :]
    out = z.copy()
    out[:, cols] = z[:, np.roll(cols, 1)]
    return mean[None, :] + out * std[None, :]


def tabular_corruptions(mean: np.ndarray, std: np.ndarray) -> dict[str, Corruption]:
    """The generic tabular family; ``mean``/``std`` are per-feature statistics of the training data."""
    fns = (_tab_dropout, _tab_heavy_noise, _tab_quantise, _tab_warp, _tab_swap)
    names = ("dropout", "heavy_noise", "quantise", "warp", "swap")

    def bind(fn: Callable[..., np.ndarray]) -> Corruption:
        return lambda x, s, r: fn(x, s, r, mean, std)

    return {name: bind(fn) for name, fn in zip(names, fns, strict=True)}


#: Calibration families: see the module docstring.
FAMILIES = ("generic", "audit")

#: Corruptions that change inputs in related ways, grouped: a group is held out of a refit whole, so that
#: what the refit is measured on is a kind of change it has seen nothing like (a refit that kept
#: ``zoom_shear`` would have seen ``audit:rotation``'s kin). Images: geometry, resolution, photometry,
#: noise and occlusion; tables: noise, scale, missing values, swapped values.
RELATED: dict[str, tuple[str, ...]] = {
    "geometry": ("elastic", "zoom_shear", "audit:shift", "audit:rotation"),
    "resolution": ("pixelate", "motion_blur", "audit:blur", "edges"),
    "photometric": ("gamma", "fog", "audit:brightness", "audit:contrast"),
    "noise_occlusion": ("salt_pepper", "occlusion", "overlay", "lines", "audit:gaussian_noise"),
    "table_noise": ("heavy_noise", "audit:noise"),
    "table_scale": ("warp", "audit:scale", "quantise"),
    "table_missing": ("dropout",),
    "table_swap": ("swap",),
}


def _related_group(name: str) -> str | None:
    """The :data:`RELATED` group of a set name (``elastic``, or ``image:elastic`` for a named input)."""
    for group, members in RELATED.items():
        if any(name == m or name.endswith(":" + m) for m in members):
            return group
    return None


def corruption_groups(names: Sequence[str], folds: int) -> list[tuple[str, ...]]:
    """The corruptions ``names`` cut into groups held out in turn: each :data:`RELATED` group present, and
    the names of no such group (text, tokens, categories) dealt in turn into at most ``folds`` more."""
    names = sorted(set(names))
    grouped: dict[str, list[str]] = {}
    rest: list[str] = []
    for n in names:
        g = _related_group(n)
        (grouped.setdefault(g, []) if g is not None else rest).append(n)
    out = [tuple(v) for v in grouped.values()]
    out += [tuple(rest[i::folds]) for i in range(min(folds, len(rest)))]
    return out


#: The audit family: metamorphic transformation → (parameter, value at strength 1, unit) for images.
#: ``"width"`` values are multiplied by the image width (pixels); the others are passed as they are
#: (degrees, a contrast factor, or fractions of the pixel range, which the audit's brightness and
#: noise scale by the range themselves). Strength ``s`` in (0, 1] scales the value linearly; the
#: transformation draws each sample's own amount up to it (e.g. a brightness offset in
#: ``[-s·0.6, s·0.6]`` of the range).
AUDIT_RANGES: dict[str, tuple[str, float, str]] = {
    "shift": ("max_pixels", 0.25, "width"),
    "brightness": ("delta", 0.6, "range"),
    "contrast": ("amount", 0.9, "factor"),
    "gaussian_noise": ("sigma", 0.45, "range"),
    "rotation": ("max_degrees", 70.0, "degrees"),
    "blur": ("sigma", 0.12, "width"),
}
#: The audit family for tables: scaling by ``1 ± ε`` per value and Gaussian noise in feature stds.
AUDIT_TABLE_RANGES: dict[str, tuple[str, float]] = {"scale": ("epsilon", 1.0), "noise": ("sigma", 1.5)}


def audit_image_corruptions(lo: float, top: float) -> dict[str, Corruption]:
    """The audit family for ``[N, C, H, W]`` images in the pixel range ``[lo, top]``."""
    ctx = TransformContext((lo, top))

    def bind(name: str, param: str, value: float, unit: str) -> Corruption:
        t = TRANSFORMS[name]

        def corrupt(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
            amount = s * value * (x.shape[-1] if unit == "width" else 1.0)
            if name == "shift":
                amount = max(1.0, float(round(amount)))
            return t.fn(x, rng, ctx, {**t.defaults, param: amount, **({"fill": lo} if "fill" in t.defaults else {})})

        return corrupt

    return {f"audit:{n}": bind(n, *spec) for n, spec in AUDIT_RANGES.items()}


def audit_table_corruptions(std: np.ndarray) -> dict[str, Corruption]:
    """The audit family for tables ``[N, D]``; ``std`` is the per-feature std of the training data."""
    ctx = TransformContext((-np.inf, np.inf), column_std=std)

    def bind(name: str, param: str, value: float) -> Corruption:
        t = TRANSFORMS[name]
        return lambda x, s, rng: t.fn(x, rng, ctx, {**t.defaults, param: s * value})

    return {f"audit:{n}": bind(n, *spec) for n, spec in AUDIT_TABLE_RANGES.items()}


def is_image_input(input_shape: Sequence[int]) -> bool:
    """``[C, H, W]`` or ``[H, W]`` with a spatial size of at least 6 pixels is treated as an image."""
    shape = tuple(int(d) for d in input_shape)
    if len(shape) == 3:
        return shape[1] >= 6 and shape[2] >= 6 and shape[0] <= 4
    return len(shape) == 2 and shape[0] >= 6 and shape[1] >= 6


def calibration_family(
    input_shape: Sequence[int], train_x: np.ndarray, families: Sequence[str] = FAMILIES
) -> tuple[dict[str, Corruption], tuple[float, float] | None]:
    """The corruptions of the chosen ``families`` by set name, and the pixel range ``(lo, top)`` to
    clip images to (None for tables). ``train_x`` (prepared training inputs) gives the pixel range
    or the per-feature statistics."""
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown calibration families {unknown}; choose from {', '.join(FAMILIES)}")
    tr = np.asarray(train_x, dtype=np.float32)
    family: dict[str, Corruption] = {}
    if is_image_input(input_shape):
        top = float(max(tr.max(), 1e-6))
        lo = float(min(tr.min(), 0.0))
        if "generic" in families:
            family.update(image_corruptions(top))
        if "audit" in families:
            family.update(audit_image_corruptions(lo, top))
        return family, (lo, top)
    flat_tr = tr.reshape(len(tr), -1)
    std = flat_tr.std(axis=0) + 1e-12
    if "generic" in families:
        family.update(tabular_corruptions(flat_tr.mean(axis=0), std))
    if "audit" in families:
        family.update(audit_table_corruptions(std))
    return family, None


def schedule(names: Sequence[str], n_sets: int | None, rng: np.random.Generator) -> list[tuple[str, float]]:
    """The corrupted copies to make, in order: ``(corruption, strength)`` for ``n_sets`` copies (by default
    :meth:`~invariants.fit_params.CalibrationPlan.sets_for` the corruptions), the corruptions ``names``
    taking turns; each corruption's strengths fall one in each of equal slices of (0, 1] (random within
    the slice), so each covers the whole continuum from harmless to label-breaking."""
    total = n_sets if n_sets is not None else CalibrationPlan().sets_for(len(names))
    per_name = [total // len(names) + (1 if i < total % len(names) else 0) for i in range(len(names))]
    strengths = [rng.permutation((np.arange(c) + rng.uniform(0.1, 0.9, c)) / max(c, 1)) for c in per_name]
    return [(names[k % len(names)], float(strengths[k % len(names)][k // len(names)])) for k in range(total)]


def iter_shifted_sets(
    x: np.ndarray,
    input_shape: Sequence[int],
    *,
    train_x: np.ndarray,
    n_sets: int | None = None,
    seed: int = 0,
    families: Sequence[str] = FAMILIES,
    exclude: Collection[str] = (),
) -> Iterator[ShiftedSet]:
    """``n_sets`` corrupted copies of ``x`` (the model's prepared inputs), cycling through the
    transformations of ``families`` (minus the set names in ``exclude``) at the strengths of
    :func:`schedule` (by default :class:`~invariants.fit_params.CalibrationPlan`'s few copies per
    transformation). ``train_x`` (prepared training inputs) gives the pixel range or the per-feature
    statistics. Made one at a time: 88 corrupted copies of a calibration split of 224×224 images held at
    once are gigabytes."""
    rng = np.random.default_rng(seed)
    xs = np.asarray(x, dtype=np.float32)
    family, clip = calibration_family(input_shape, train_x, families)
    names = sorted(set(family) - set(exclude))
    if not names:
        raise ValueError("no calibration transformation left")
    kept = integer_range(x, train_x) if clip is None else None  # images are clipped to their pixel range
    for name, s in schedule(names, n_sets, rng):
        out = corrupt_copy(family[name], xs, s, rng, input_shape, clip)
        yield ShiftedSet(name, s, out if kept is None else kept(out))


def integer_range(x: np.ndarray, train_x: np.ndarray) -> Callable[[np.ndarray], np.ndarray] | None:
    """For integer inputs that are not images (token ids, codes, counts), what brings a corrupted copy back
    to them: rounded and kept within the values each position took in training, in ``x``'s type, since a
    model that looks integers up (an embedding's ``Gather``) fails on one out of its table; None for other
    inputs."""
    if np.asarray(x).dtype.kind not in "iu":
        return None
    tr = np.asarray(train_x).reshape(len(train_x), -1)
    lo, hi = tr.min(axis=0), tr.max(axis=0)
    dtype, shape = np.asarray(x).dtype, np.asarray(x).shape[1:]

    def back(out: np.ndarray) -> np.ndarray:
        flat = np.clip(np.rint(out.reshape(len(out), -1)), lo, hi)
        return flat.astype(dtype).reshape(len(out), *shape)

    return back


def corrupt_copy(
    fn: Corruption,
    xs: np.ndarray,
    s: float,
    rng: np.random.Generator,
    input_shape: Sequence[int],
    clip: tuple[float, float] | None,
) -> np.ndarray:
    """``fn`` at strength ``s`` on prepared inputs ``xs`` (float32, same shape back)."""
    if clip is not None:
        img = as_nchw(xs.reshape((len(xs), *input_shape)))
        res = np.clip(fn(img.astype(np.float64), s, rng), *clip).reshape(xs.shape)
    else:
        flat = xs.reshape(len(xs), -1).astype(np.float64)
        res = fn(flat, s, rng).reshape(xs.shape)
    return res.astype(np.float32)
