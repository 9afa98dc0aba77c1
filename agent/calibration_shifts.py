"""Labeled shifted data for calibrating the accuracy estimators (used by ``icos-agent fit``).

The validation data has labels; corrupting it with transformations whose label is known (the
original one) gives labeled examples of how the model, the oracle and the confidence behave
when the operational data drifts. The estimators are calibrated on these examples (see
:mod:`agent.estimators`, estimator ``shift_aware``).

The family is deliberately *generic* and different from the shifts of the estimator benchmark
(``bench/estimators``: Gaussian noise, translation, brightness/contrast, rotation, blur): elastic
warps, random occlusion, pixelation, gamma changes, salt-and-pepper noise, zoom/shear and the
overlay of two images for images; for tables, feature dropout to the mean, heavy-tailed noise,
quantisation, monotone warps and feature swaps. Each generated set uses one transformation at a
random strength (from harmless to label-breaking), so the calibration sees a continuum from
in-distribution to badly shifted data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from agent.estimators import InputReference, JudgedSet, SampleExtras, ShiftCalibration, fit_shift_calibration

if TYPE_CHECKING:
    from agent.model import OnnxClassifier
    from invariants.oracle import Oracle

Corruption = Callable[[np.ndarray, float, np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class ShiftedSet:
    """One corrupted copy of the calibration data: ``x`` in the model's input shape, its name/strength."""

    name: str
    strength: float
    x: np.ndarray


# -- images ([N, C, H, W] or [N, H, W] in the model's raw scale) -------------------------------------


def _as_nchw(x: np.ndarray) -> np.ndarray:
    if x.ndim == 3:
        return x[:, None]
    return x


def _elastic(x: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
    from scipy import ndimage

    n, c, h, w = x.shape
    alpha = s * 0.35 * w
    sigma = max(0.12 * w, 1.0)
    out = np.empty_like(x)
    yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    for i in range(n):
        dy = ndimage.gaussian_filter(rng.uniform(-1, 1, (h, w)), sigma)
        dx = ndimage.gaussian_filter(rng.uniform(-1, 1, (h, w)), sigma)
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
    from scipy import ndimage

    n, c, h, w = x.shape
    amount = 0.8 * s
    field = ndimage.gaussian_filter(rng.uniform(size=(n, 1, h, w)), sigma=(0, 0, 0.2 * h, 0.2 * w))
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

    gy = ndimage.sobel(x, axis=2, mode="constant")
    gx = ndimage.sobel(x, axis=3, mode="constant")
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


def is_image_input(input_shape: Sequence[int]) -> bool:
    """``[C, H, W]`` or ``[H, W]`` with a spatial size of at least 6 pixels is treated as an image."""
    shape = tuple(int(d) for d in input_shape)
    if len(shape) == 3:
        return shape[1] >= 6 and shape[2] >= 6 and shape[0] <= 4
    return len(shape) == 2 and shape[0] >= 6 and shape[1] >= 6


def shifted_sets(
    x: np.ndarray,
    input_shape: Sequence[int],
    *,
    train_x: np.ndarray,
    n_sets: int = 88,
    seed: int = 0,
) -> list[ShiftedSet]:
    """``n_sets`` corrupted copies of ``x`` (the model's prepared inputs), cycling through the family
    with strengths spread evenly over (0, 1] (1 = label-breaking for most inputs).

    ``train_x`` (prepared training inputs) gives the pixel range or the per-feature statistics.
    """
    rng = np.random.default_rng(seed)
    xs = np.asarray(x, dtype=np.float32)
    tr = np.asarray(train_x, dtype=np.float32)
    image = is_image_input(input_shape)
    if image:
        top = float(max(tr.max(), 1e-6))
        family = image_corruptions(top)
        lo = float(min(tr.min(), 0.0))
    else:
        flat_tr = tr.reshape(len(tr), -1)
        family = tabular_corruptions(flat_tr.mean(axis=0), flat_tr.std(axis=0) + 1e-12)
    names = sorted(family)
    strengths = (np.arange(n_sets) + rng.uniform(0.2, 0.8)) / n_sets
    rng.shuffle(strengths)
    out: list[ShiftedSet] = []
    for k in range(n_sets):
        name = names[k % len(names)]
        s = float(strengths[k])
        if image:
            img = _as_nchw(xs.reshape((len(xs), *input_shape)))
            res = family[name](img.astype(np.float64), s, rng)
            res = np.clip(res, lo, top).reshape(xs.shape)
        else:
            flat = xs.reshape(len(xs), -1).astype(np.float64)
            res = family[name](flat, s, rng).reshape(xs.shape)
        out.append(ShiftedSet(name, s, res.astype(np.float32)))
    return out


def input_reference(model: OnnxClassifier, oracle: Oracle, train_x: np.ndarray, x_cal: np.ndarray) -> InputReference:
    """The PCA of the training inputs, the TDI leaf table and the clean per-class confidences
    ``shift_aware`` compares live windows with."""
    tdi = oracle.tdi
    train_f = model.features(train_x)
    pred = model.predict_batched(x_cal)
    return InputReference.fit(
        train_f,
        model.features(x_cal),
        per_feature_scale=not is_image_input(model.input_shape),
        rule_label=[r.label for r in tdi.rules] if tdi is not None else (),
        rule_selected=[r.selected for r in tdi.rules] if tdi is not None else (),
        train_rules=tdi.rule_index(train_f) if tdi is not None else None,
        clean_labels=pred.labels,
        clean_confidences=pred.confidences,
        n_classes=model.n_classes,
    )


def judge_shifted_sets(
    model: OnnxClassifier,
    oracle: Oracle,
    x_cal: np.ndarray,
    y_cal: np.ndarray,
    *,
    train_x: np.ndarray,
    reference: InputReference,
    metadata: Mapping[str, np.ndarray] | None = None,
    feature_names: Sequence[str] | None = None,
    n_sets: int = 88,
    seed: int = 0,
) -> tuple[JudgedSet, list[JudgedSet]]:
    """Judge the clean calibration split and ``n_sets`` corrupted copies of it with the oracle.

    ``x_cal``/``train_x`` are prepared model inputs, ``y_cal`` class indices; ``metadata`` (IDI fields
    of the calibration samples) is kept for every copy, since a corruption does not change where an
    input comes from. Every set carries the per-sample inputs of the full ``shift_aware`` model.
    """
    tdi = oracle.tdi

    def judged(name: str, x: np.ndarray) -> JudgedSet:
        pred = model.predict_batched(x)
        feats = model.features(x)
        result = oracle.judge(
            feats, pred.probabilities, pred.labels, metadata=metadata or None, feature_names=feature_names
        )
        rules = tdi.rule_index(feats) if tdi is not None else np.zeros(len(x), dtype=np.int64)
        extras = SampleExtras.compute(pred.probabilities, pred.labels, feats, rules, reference)
        return JudgedSet(name, result.verdict, pred.confidences, pred.labels == y_cal, np.asarray(y_cal), extras)

    clean = judged("clean", x_cal)
    sets = shifted_sets(x_cal, model.input_shape, train_x=train_x, n_sets=n_sets, seed=seed)
    return clean, [judged(s.name, s.x.astype(x_cal.dtype, copy=False)) for s in sets]


def fit_shift_aware(
    model: OnnxClassifier,
    oracle: Oracle,
    x_cal: np.ndarray,
    y_cal: np.ndarray,
    *,
    train_x: np.ndarray,
    metadata: Mapping[str, np.ndarray] | None = None,
    feature_names: Sequence[str] | None = None,
    n_sets: int = 88,
    seed: int = 0,
) -> ShiftCalibration:
    """The ``shift_aware`` calibration of a model and its oracle (see :func:`fit_shift_calibration`)."""
    reference = input_reference(model, oracle, train_x, x_cal)
    clean, shifted = judge_shifted_sets(
        model,
        oracle,
        x_cal,
        y_cal,
        train_x=train_x,
        reference=reference,
        metadata=metadata,
        feature_names=feature_names,
        n_sets=n_sets,
        seed=seed,
    )
    return fit_shift_calibration(clean, shifted, reference, seed=seed)
