"""Kinds of shift held out of every ``shift_aware`` fit, whose corrupted copies only the flag "this number may
be wrong" is fitted on (:func:`agent.offline.calibration.flag.fitting.model_flag`).

``shift_aware`` learns from the corruptions of :mod:`agent.offline.calibration.corruptions`, and the flag from
the refits that left a group of them out; but every such refit still saw the other groups, all of which keep
the inputs in their range and their sign. Inputs inverted (negatives of images, negated table columns) or moved
far beyond any calibration corruption (brightness beyond the audit's, columns shifted by several standard
deviations) are what a live shift can do that no refit saw: on MNIST with a fifth of the digits inverted the
headline erred by 0.15 while the flag, fitted only on the seen kinds, stayed down. Copies of these kinds are
made beside the calibration corruptions, judged the same way, and kept out of ``shift_aware``'s fits and the
headline's choice (:attr:`~agent.offline.calibration.sets.CalibrationSets.held_out`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence

import numpy as np

from agent.offline.calibration.corruptions import (
    Corruption,
    ShiftedSet,
    corrupt_copy,
    integer_range,
    is_image_input,
    schedule,
)
from invariants.fit_params import CalibrationPlan


def _invert(x: np.ndarray, s: float, rng: np.random.Generator, lo: float, top: float) -> np.ndarray:
    """Negatives: each image inverted in its pixel range (``lo + top − x``: ``1 − x`` scaled to the range) with
    probability ``s``, so that copies hold every share of inverted images."""
    rows = rng.uniform(size=len(x)) < s
    out = x.copy()
    out[rows] = lo + top - x[rows]
    return out


def _far_brightness(x: np.ndarray, s: float, rng: np.random.Generator, lo: float, top: float) -> np.ndarray:
    """Each image brightened or darkened by 0.7 to 1 of the pixel range with probability ``s``, as
    :func:`_invert` inverts: beyond the audit family's brightness (at most 0.6 of it), so the move is farther
    than any the estimate was fitted on, on every share of the images (a source gone wrong, not only all of
    the traffic at once, where any evidence tells it)."""
    rows = rng.uniform(size=len(x)) < s
    out = x.copy()
    out[rows] = x[rows] + float(rng.choice([-1.0, 1.0])) * float(rng.uniform(0.7, 1.0)) * (top - lo)
    return out


def _tab_invert(x: np.ndarray, s: float, rng: np.random.Generator, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """The negative of a share ``s`` of the numeric columns (at least one): a sign flipped upstream."""
    d = x.shape[1]
    cols = rng.choice(d, max(1, int(np.ceil(s * d))), replace=False)
    out = x.copy()
    out[:, cols] = -x[:, cols]
    return out


def _tab_far_offset(x: np.ndarray, s: float, rng: np.random.Generator, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """A few numeric columns (a share ``s / 3`` of them, at least one) moved by 3 to 6 of their standard
    deviations, up or down: a covariate move far beyond the audit family's noise and scaling."""
    d = x.shape[1]
    cols = rng.choice(d, max(1, int(round(s * d / 3))), replace=False)
    out = x.copy()
    out[:, cols] += rng.choice([-1.0, 1.0], len(cols)) * (3.0 + 3.0 * s) * std[cols]
    return out


#: Kinds of shift held out of every ``shift_aware`` fit (the shipped one and the refits behind its interval)
#: and of the headline's choice: copies of them are made for the flag's fit alone
#: (:func:`agent.offline.calibration.flag.fitting.model_flag`), so that the flag learns to raise where the
#: inputs moved in a way the estimate never saw. Images: inversions and brightness far beyond the audit's;
#: tables: negated columns and columns moved by several standard deviations.
HELD_OUT_KINDS: dict[str, tuple[str, ...]] = {"image": ("invert", "far_brightness"), "table": ("invert", "far_offset")}


def held_out_corruptions(
    input_shape: Sequence[int], train_x: np.ndarray
) -> tuple[dict[str, Corruption], tuple[float, float] | None]:
    """The :data:`HELD_OUT_KINDS` of a model of one numeric tensor by name, and the pixel range to clip images
    to (None for tables), from the prepared training inputs ``train_x`` as :func:`calibration_family`."""
    tr = np.asarray(train_x, dtype=np.float32)
    if is_image_input(input_shape):
        top, lo = float(max(tr.max(), 1e-6)), float(min(tr.min(), 0.0))
        return {
            "invert": lambda x, s, r: _invert(x, s, r, lo, top),
            "far_brightness": lambda x, s, r: _far_brightness(x, s, r, lo, top),
        }, (lo, top)
    flat = tr.reshape(len(tr), -1)
    mean, std = flat.mean(axis=0), flat.std(axis=0) + 1e-12
    fns = {"invert": _tab_invert, "far_offset": _tab_far_offset}

    def bind(fn: Callable[..., np.ndarray]) -> Corruption:
        return lambda x, s, r: fn(x, s, r, mean, std)

    return {name: bind(fn) for name, fn in fns.items()}, None


def iter_held_out_sets(
    x: np.ndarray,
    input_shape: Sequence[int],
    *,
    train_x: np.ndarray,
    per_kind: int = CalibrationPlan().flag_held_out_sets,
    seed: int = 0,
    exclude: Collection[str] = (),
) -> Iterator[ShiftedSet]:
    """``per_kind`` corrupted copies of ``x`` of each :data:`HELD_OUT_KINDS` kind (minus ``exclude``), at the
    strengths of :func:`schedule`; made one at a time as :func:`iter_shifted_sets` makes its copies."""
    rng = np.random.default_rng([seed, 41])
    xs = np.asarray(x, dtype=np.float32)
    family, clip = held_out_corruptions(input_shape, train_x)
    names = sorted(set(family) - set(exclude))
    if not names or per_kind <= 0:
        return
    kept = integer_range(x, train_x) if clip is None else None
    for name, s in schedule(names, per_kind * len(names), rng):
        out = corrupt_copy(family[name], xs, s, rng, input_shape, clip)
        yield ShiftedSet(name, s, out if kept is None else kept(out))
