"""Shift scenarios of the estimator benchmark.

Every scenario turns a labeled pool (the test split of a data set) into a *shifted pool*: the same
samples after a seeded transformation, with their true labels kept. Operational sets are then
drawn from the shifted pool (see :mod:`bench.estimators.sampling`), optionally with class weights
(label shift).

The transformations are this module's own code, with strengths fixed below. The agent's
calibration (:mod:`agent.offline.calibration.corruptions`) uses a generic family of corruptions (elastic warps,
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

Families of no kind in the calibration (added to widen the suite; strengths fixed a priori):

=======================  ==============================  ==============================
images                   mild                            strong
=======================  ==============================  ==============================
stroke (dilation)        grey dilation, 2-px footprint   erosion, 2-px footprint
speckle (photometric)    x·(1 + N(0, 0.3))               x·(1 + N(0, 0.8))
flip (geometry)          horizontal flip of 25%          horizontal flip of every image
invert (negatives)       20% of the images inverted      60% of the images inverted
other data set           MNIST-5k ↔ scikit-learn digits resampled to the model's size (natural)
=======================  ==============================  ==============================

=======================  ==============================  ==============================
tables                   mild                            strong
=======================  ==============================  ==============================
unit change              one feature ×10                 three features ×1000
saturation               clip at the 10/90% quantiles    clip at the 25/75% quantiles
outlier rows             5% of rows +6 std on 3 features 20% of rows
subpopulation (natural)  the upper half of the most      the upper fifth of it
                         class-informative feature
=======================  ==============================  ==============================

Inversions and the large covariate moves (outlier rows, unit changes, feature offsets, brightness and
contrast) are kin of the kinds held out of every ``shift_aware`` fit that only the flag's fit sees
(:data:`agent.offline.calibration.held_out_kinds.HELD_OUT_KINDS`): their ``calibration_kin`` names them, so that
the calibration without a scenario's kin has seen nothing like it, the flag's fit included.

``clean_or_shifted``: every window is, at random, all clean or all from one strong scenario of
the new families (a stream switching between clean and shifted traffic; what the trust signal
must tell apart).
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
    #: Calibration sets of the same kind of shift (``agent.offline.calibration.corruptions`` set names).
    calibration_kin: tuple[str, ...] = ()
    #: Keep only the pool samples this selects (a subpopulation: a natural covariate shift).
    select: Callable[[np.ndarray], np.ndarray] | None = None
    #: Replace the pool by another labeled data set in the model's raw input format (natural shift).
    pool: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None
    #: Whole windows come from one of these pool transforms (None: the clean pool), picked per window.
    segments: tuple[Transform | None, ...] = ()


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


def stroke(spec: ImageSpec, dilate: bool) -> Transform:
    """Thicker (grey dilation) or thinner (erosion) strokes with a 2-pixel footprint (scaled to 28 px)."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        size = max(2, int(round(2 * x.shape[-1] / 28)))
        op = ndimage.grey_dilation if dilate else ndimage.grey_erosion
        return _clip(op(x, size=(1, 1, size, size)), spec)

    return f


def speckle(spec: ImageSpec, sigma: float) -> Transform:
    """Multiplicative noise ``x · (1 + N(0, σ))`` (sensor gain noise; only inked pixels change)."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return _clip(x * (1.0 + rng.normal(0.0, sigma, x.shape)), spec)

    return f


def flip(spec: ImageSpec, share: float) -> Transform:
    """Mirror ``share`` of the images left to right."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = x.astype(np.float32, copy=True)
        idx = rng.uniform(size=len(x)) < share
        out[idx] = out[idx][..., ::-1]
        return out

    return f


def invert(spec: ImageSpec, share: float) -> Transform:
    """Invert ``share`` of the images in the pixel range (negatives: ``max_value − x``)."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = x.astype(np.float32, copy=True)
        idx = rng.uniform(size=len(x)) < share
        out[idx] = spec.max_value - out[idx]
        return out

    return f


def resample_images(x: np.ndarray, size: int, max_value: float) -> np.ndarray:
    """Images ``[N, 1, h, w]`` in ``[0, max(x)]`` resampled to ``size × size`` in ``[0, max_value]``."""
    top = max(float(x.max()), 1e-9)
    zoom = (1, 1, size / x.shape[-2], size / x.shape[-1])
    out = ndimage.zoom(x.astype(np.float64) / top, zoom, order=1)
    return np.clip(out * max_value, 0.0, max_value).astype(np.float32)


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


def tab_units(spec: TabularSpec, k: int, factor: float) -> Transform:
    """Multiply ``k`` random features by ``factor`` (a unit change upstream, e.g. kg → g)."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        cols = rng.choice(x.shape[1], min(k, x.shape[1]), replace=False)
        out = x.copy()
        out[:, cols] *= factor
        return out.astype(np.float32)

    return f


def tab_saturate(spec: TabularSpec, q: float) -> Transform:
    """Clip every feature at its ``q`` and ``1 − q`` quantiles of the pool (a saturating sensor)."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        lo, hi = np.quantile(x, q, axis=0), np.quantile(x, 1 - q, axis=0)
        return np.clip(x, lo, hi).astype(np.float32)

    return f


def tab_outliers(spec: TabularSpec, share: float) -> Transform:
    """``share`` of the rows get +6 standard deviations on 3 random features (corrupted records)."""

    def f(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = x.copy()
        for i in np.flatnonzero(rng.uniform(size=len(x)) < share):
            cols = rng.choice(x.shape[1], min(3, x.shape[1]), replace=False)
            out[i, cols] += 6.0 * spec.std[cols]
        return out.astype(np.float32)

    return f


def upper_share(column: int, share: float) -> Callable[[np.ndarray], np.ndarray]:
    """Select the samples whose feature ``column`` lies in its top ``share`` (a subpopulation)."""

    def select(x: np.ndarray) -> np.ndarray:
        v = x.reshape(len(x), -1)[:, column]
        return np.asarray(v >= np.quantile(v, 1 - share))

    return select


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


def image_scenarios(
    spec: ImageSpec, other: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None
) -> list[Scenario]:
    """The image suite (see the module docstring for the strengths); ``other`` loads the other data
    set of the natural shift (raw images of the model's size and scale, labels)."""
    shifts: list[Shift] = [
        ("gaussian_noise", gaussian_noise(spec, 0.10), gaussian_noise(spec, 0.30), ("audit:gaussian_noise",)),
        ("translation", translation(spec, 0.07), translation(spec, 0.14), ("audit:shift",)),
        (
            "brightness_contrast",
            brightness_contrast(spec, 0.7, 0.10),
            brightness_contrast(spec, 0.4, 0.30),
            ("audit:brightness", "audit:contrast", "far_brightness"),
        ),
        ("rotation", rotation(spec, 15.0), rotation(spec, 35.0), ("audit:rotation",)),
        ("blur", blur(spec, 0.035), blur(spec, 0.07), ("audit:blur",)),
    ]
    new: list[Shift] = [
        ("stroke", stroke(spec, True), stroke(spec, False), ()),
        ("speckle", speckle(spec, 0.3), speckle(spec, 0.8), ()),
        ("flip", flip(spec, 0.25), flip(spec, 1.0), ()),
        ("invert", invert(spec, 0.2), invert(spec, 0.6), ("invert",)),
    ]
    out = _assemble(shifts, new)
    if other is not None:
        out.insert(-1, Scenario("other_dataset", "other_dataset", "natural", pool=other))
    return out


def tabular_scenarios(spec: TabularSpec, informative: int = 0) -> list[Scenario]:
    """The tabular suite (see the module docstring for the strengths); ``informative``: the feature
    whose upper part forms the subpopulation."""
    shifts: list[Shift] = [
        ("gaussian_noise", tab_noise(spec, 0.3), tab_noise(spec, 0.8), ("audit:noise",)),
        ("feature_offset", tab_offset(spec, 0.5), tab_offset(spec, 1.5), ("far_offset",)),
        ("feature_scale", tab_scale(spec, 1.5), tab_scale(spec, 3.0), ("audit:scale",)),
        ("missing_values", tab_missing(spec, 0.2), tab_missing(spec, 0.5), ()),
    ]
    new: list[Shift] = [
        ("unit_change", tab_units(spec, 1, 10.0), tab_units(spec, 3, 1000.0), ("far_offset",)),
        ("saturation", tab_saturate(spec, 0.10), tab_saturate(spec, 0.25), ()),
        ("outlier_rows", tab_outliers(spec, 0.05), tab_outliers(spec, 0.20), ("far_offset",)),
    ]
    out = _assemble(shifts, new)
    for strength, share in (("mild", 0.5), ("strong", 0.2)):
        sub = Scenario(f"subpopulation_{strength}", "subpopulation", strength, select=upper_share(informative, share))
        out.insert(-1, sub)
    return out


def _assemble(shifts: list[Shift], new: list[Shift]) -> list[Scenario]:
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
    for name, mild, strong, kin in new:
        out.append(Scenario(f"{name}_mild", name, "mild", transform=mild, calibration_kin=kin))
        out.append(Scenario(f"{name}_strong", name, "strong", transform=strong, calibration_kin=kin))
    out.append(Scenario("mixture", "mixture", "mixed", transform=_mixture(parts), calibration_kin=all_kin))
    segs = (None, *(strong for _, _, strong, _ in new))
    out.append(Scenario("clean_or_shifted", "clean_or_shifted", "mixed", segments=segs))
    return out
