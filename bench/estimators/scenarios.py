"""Shift scenarios of the estimator benchmark.

Every scenario turns a labeled pool (the test split of a data set) into a *shifted pool*: the same
samples after a seeded transformation, with their true labels kept. Operational sets are then
drawn from the shifted pool (see :mod:`bench.estimators.sampling`), optionally with class weights
(label shift).

The transformations are this module's own code, with strengths fixed below. The agent's
calibration (:mod:`agent.estimation.shifts`) uses a generic family of corruptions (elastic warps,
occlusion, pixelation, gamma, salt-and-pepper, feature dropout ...) and the metamorphic audit's
transformations at random strengths; several scenarios are of the same *kind* as an audit
transformation (Gaussian noise, pixel shifts, brightness/contrast, rotation, blur). Every scenario
names these kin (``calibration_kin``), so the benchmark also measures ``shift_aware`` calibrated
without them: a drift of a kind it has not seen.

Strengths are expressed relative to the image size and pixel range (so that 8×8 digits and 28×28
MNIST get comparable shifts) and are fixed a priori, not tuned on the results:

=================  ===============================  ===============================
scenario           mild                             strong
=================  ===============================  ===============================
label shift        class prior ~ Dirichlet(5)       class prior ~ Dirichlet(0.5)
gaussian noise     σ = 10% of the pixel range       σ = 30% of the pixel range
translation        7% of the width (2 px on 28)     14% of the width (4 px on 28)
brightness/contr.  contrast ×0.7, +10% brightness   contrast ×0.4, +30% brightness
rotation           ±15°                             ±35°
blur               Gaussian σ = 3.5% of the width   Gaussian σ = 7% of the width
mixture            each sample gets one of the above (or none), random strength
=================  ===============================  ===============================

Tabular models get the analogous covariate shifts on standardised features: Gaussian noise
(0.3 / 0.8 feature std), an offset of a random third of the features (0.5 / 1.5 std), a rescaling
of a random third of the features (×1.5 / ×3), and missing values imputed by the training mean
(20% / 50% of the features), each at two strengths, plus label shift and a mixture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

Transform = Callable[[np.ndarray, np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class ImageSpec:
    """Pixel range of an image data set (images are ``[N, 1, H, W]`` in raw pixel scale)."""

    max_value: float


@dataclass(frozen=True)
class TabularSpec:
    """Per-feature mean and standard deviation of the training data."""

    mean: np.ndarray
    std: np.ndarray


@dataclass(frozen=True)
class Scenario:
    """A named shift: ``transform`` maps a pool to its shifted copy; ``prior_alpha`` (if set) makes
    every operational set draw its class prior from ``Dirichlet(prior_alpha)`` (label shift)."""

    name: str
    family: str
    strength: str
    transform: Transform | None = None
    prior_alpha: float | None = None
    #: Calibration sets of the same kind of shift (``agent.estimation.shifts`` set names).
    calibration_kin: tuple[str, ...] = ()


# -- image transformations -----------------------------------------------------------------------


def _clip(x: np.ndarray, spec: ImageSpec) -> np.ndarray:
    return np.clip(x, 0.0, spec.max_value).astype(np.float32)


def gaussian_noise(spec: ImageSpec, sigma: float) -> Transform:
    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return _clip(x + rng.normal(0.0, sigma * spec.max_value, x.shape), spec)

    return f


def translation(spec: ImageSpec, fraction: float) -> Transform:
    """Shift every image by ``fraction`` of its width in one of 8 compass directions (bilinear)."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = np.empty_like(x, dtype=np.float32)
        dist = fraction * x.shape[-1]
        angles = rng.integers(0, 8, len(x)) * (np.pi / 4)
        for i, a in enumerate(angles):
            dy, dx = dist * np.sin(a), dist * np.cos(a)
            if abs(np.sin(a)) > 0.1 and abs(np.cos(a)) > 0.1:  # diagonal: same distance per axis
                dy, dx = np.sign(dy) * dist, np.sign(dx) * dist
            out[i, 0] = ndimage.shift(x[i, 0], (dy, dx), order=1, mode="constant", cval=0.0)
        return _clip(out, spec)

    return f


def brightness_contrast(spec: ImageSpec, contrast: float, brightness: float) -> Transform:
    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return _clip(contrast * x + brightness * spec.max_value, spec)

    return f


def rotation(spec: ImageSpec, degrees: float) -> Transform:
    """Rotate every image by ±``degrees`` (random sign) around its centre (bilinear)."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = np.empty_like(x, dtype=np.float32)
        signs = rng.choice([-1.0, 1.0], len(x))
        for i, s in enumerate(signs):
            out[i, 0] = ndimage.rotate(x[i, 0], s * degrees, reshape=False, order=1, mode="constant", cval=0.0)
        return _clip(out, spec)

    return f


def blur(spec: ImageSpec, fraction: float) -> Transform:
    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        sigma = fraction * x.shape[-1]
        return _clip(ndimage.gaussian_filter(x, sigma=(0, 0, sigma, sigma), mode="constant"), spec)

    return f


# -- tabular transformations ---------------------------------------------------------------------


def _subset(d: int, share: float, rng: np.random.Generator) -> np.ndarray:
    k = max(1, int(round(share * d)))
    return rng.choice(d, k, replace=False)


def tab_noise(spec: TabularSpec, sigma: float) -> Transform:
    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return (x + rng.normal(0.0, 1.0, x.shape) * sigma * spec.std).astype(np.float32)

    return f


def tab_offset(spec: TabularSpec, delta: float) -> Transform:
    """Add ``±delta`` standard deviations to a random third of the features (one draw per pool)."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        cols = _subset(x.shape[1], 1 / 3, rng)
        out = x.copy()
        out[:, cols] += rng.choice([-1.0, 1.0], len(cols)) * delta * spec.std[cols]
        return out.astype(np.float32)

    return f


def tab_scale(spec: TabularSpec, factor: float) -> Transform:
    """Multiply the deviation from the mean of a random third of the features by ``factor``."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        cols = _subset(x.shape[1], 1 / 3, rng)
        out = x.copy()
        out[:, cols] = spec.mean[cols] + factor * (x[:, cols] - spec.mean[cols])
        return out.astype(np.float32)

    return f


def tab_missing(spec: TabularSpec, share: float) -> Transform:
    """Replace ``share`` of every sample's features (random per sample) by the training mean."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        mask = rng.uniform(size=x.shape) < share
        return np.where(mask, spec.mean[None, :], x).astype(np.float32)

    return f


# -- scenario lists --------------------------------------------------------------------------------


def _mixture(parts: list[Transform]) -> Transform:
    """Every sample gets one of ``parts`` (or stays as it is) at random."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        choice = rng.integers(0, len(parts) + 1, len(x))
        out = x.astype(np.float32, copy=True)
        for k, part in enumerate(parts):
            idx = np.flatnonzero(choice == k + 1)
            if idx.size:
                out[idx] = part(x[idx], rng)
        return out

    return f


Shift = tuple[str, Transform, Transform, tuple[str, ...]]


def image_scenarios(spec: ImageSpec) -> list[Scenario]:
    """The image suite (see the module docstring for the strengths)."""
    shifts: list[Shift] = [
        ("gaussian_noise", gaussian_noise(spec, 0.10), gaussian_noise(spec, 0.30), ("audit:gaussian_noise",)),
        ("translation", translation(spec, 0.07), translation(spec, 0.14), ("audit:shift",)),
        (
            "brightness_contrast",
            brightness_contrast(spec, 0.7, 0.10),
            brightness_contrast(spec, 0.4, 0.30),
            ("audit:brightness", "audit:contrast"),
        ),
        ("rotation", rotation(spec, 15.0), rotation(spec, 35.0), ("audit:rotation",)),
        ("blur", blur(spec, 0.035), blur(spec, 0.07), ("audit:blur",)),
    ]
    return _assemble(shifts)


def tabular_scenarios(spec: TabularSpec) -> list[Scenario]:
    """The tabular suite (see the module docstring for the strengths)."""
    shifts: list[Shift] = [
        ("gaussian_noise", tab_noise(spec, 0.3), tab_noise(spec, 0.8), ("audit:noise",)),
        ("feature_offset", tab_offset(spec, 0.5), tab_offset(spec, 1.5), ()),
        ("feature_scale", tab_scale(spec, 1.5), tab_scale(spec, 3.0), ("audit:scale",)),
        ("missing_values", tab_missing(spec, 0.2), tab_missing(spec, 0.5), ()),
    ]
    return _assemble(shifts)


def _assemble(shifts: list[Shift]) -> list[Scenario]:
    out = [
        Scenario("in_distribution", "in_distribution", "-"),
        Scenario("label_shift_mild", "label_shift", "mild", prior_alpha=5.0),
        Scenario("label_shift_strong", "label_shift", "strong", prior_alpha=0.5),
    ]
    for name, mild, strong, kin in shifts:
        out.append(Scenario(f"{name}_mild", name, "mild", transform=mild, calibration_kin=kin))
        out.append(Scenario(f"{name}_strong", name, "strong", transform=strong, calibration_kin=kin))
    parts = [t for _, mild, strong, _ in shifts for t in (mild, strong)]
    all_kin = tuple(k for *_, kin in shifts for k in kin)
    out.append(Scenario("mixture", "mixture", "mixed", transform=_mixture(parts), calibration_kin=all_kin))
    return out
