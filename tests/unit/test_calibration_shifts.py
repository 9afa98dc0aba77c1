"""The calibration families of ``shift_aware``: the generic corruptions and the metamorphic audit's
transformations at strengths spread over (0, 1] per transformation."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from agent.offline.calibration.corruptions import (
    AUDIT_RANGES,
    AUDIT_TABLE_RANGES,
    ShiftedSet,
    image_corruptions,
    iter_shifted_sets,
)
from agent.perturb.transforms import TRANSFORMS


def shifted_sets(*args: Any, **kwargs: Any) -> list[ShiftedSet]:
    """Every corrupted copy at once (small inputs here)."""
    return list(iter_shifted_sets(*args, **kwargs))


def _digits_like(n: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.zeros((n, 1, 12, 12), np.float32)
    for i in range(n):  # a bright bar at a random place: strokes on a dark background
        r, c = rng.integers(2, 8, 2)
        x[i, 0, r : r + 4, c : c + 2] = 16.0
    return x


def test_image_sets_cover_both_families_with_strengths_spread_per_transformation() -> None:
    x = _digits_like()
    sets = shifted_sets(x, (1, 12, 12), train_x=x, seed=3)
    names = Counter(s.name for s in sets)
    generic = set(image_corruptions(16.0))
    audit = {f"audit:{n}" for n in AUDIT_RANGES}
    assert set(names) == generic | audit and audit <= {f"audit:{n}" for n in TRANSFORMS}
    assert len(sets) == 8 * len(names) and set(names.values()) == {8}
    for name in names:  # one strength in each eighth of (0, 1]
        s = sorted(v.strength for v in sets if v.name == name)
        assert [int(v * 8) for v in s] == list(range(8))
    for v in sets:
        assert v.x.shape == x.shape and v.x.dtype == np.float32
        assert v.x.min() >= 0.0 and v.x.max() <= 16.0  # clipped to the training range


def test_audit_strength_grows_the_change() -> None:
    x = _digits_like()
    sets = shifted_sets(x, (1, 12, 12), train_x=x, seed=1, families=("audit",))
    assert {s.name for s in sets} == {f"audit:{n}" for n in AUDIT_RANGES}
    for name in ("audit:blur", "audit:gaussian_noise", "audit:rotation"):
        by_strength = sorted((s.strength, float(np.abs(s.x - x).mean())) for s in sets if s.name == name)
        weak, strong = by_strength[0][1], by_strength[-1][1]
        assert strong > 2 * weak, name


def test_families_and_exclusions() -> None:
    x = _digits_like()
    sets = shifted_sets(x, (1, 12, 12), train_x=x, families=("generic",), exclude=("fog", "edges"), n_sets=45)
    assert len(sets) == 45 and not {s.name for s in sets} & {"fog", "edges"}
    assert all(not s.name.startswith("audit:") for s in sets)
    with pytest.raises(ValueError, match="unknown calibration families"):
        shifted_sets(x, (1, 12, 12), train_x=x, families=("weather",))
    with pytest.raises(ValueError, match="no calibration transformation left"):
        shifted_sets(x, (1, 12, 12), train_x=x, families=("audit",), exclude=[f"audit:{n}" for n in AUDIT_RANGES])


def test_tables_get_the_audit_scaling_and_noise() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(5.0, 2.0, (200, 6)).astype(np.float32)
    sets = shifted_sets(x, (6,), train_x=x, families=("audit",), n_sets=16)
    assert {s.name for s in sets} == {f"audit:{n}" for n in AUDIT_TABLE_RANGES}
    noise = sorted((s.strength, float(np.std(s.x - x))) for s in sets if s.name == "audit:noise")
    # Gaussian noise of up to 1.5 training stds (2.0 here) at strength 1
    assert noise[-1][1] == pytest.approx(noise[-1][0] * 1.5 * x.std(axis=0).mean(), rel=0.15)
    assert noise[0][1] < noise[-1][1]


def test_smooth_fields_of_large_images_are_drawn_coarse_and_stay_smooth() -> None:
    """Elastic and fog draw their random field on a 64-cell grid for large images (a tenth of a
    millisecond instead of tens), keeping its range and smoothness; small images keep the exact field."""
    from scipy import ndimage

    from agent.offline.calibration.corruptions import _smooth_field

    rng = np.random.default_rng(0)
    small = _smooth_field(np.random.default_rng(1), -1.0, 1.0, 28, 28, 0.12)
    exact = ndimage.gaussian_filter(np.random.default_rng(1).uniform(-1.0, 1.0, (28, 28)), 0.12 * 28)
    np.testing.assert_array_equal(small, exact)
    large = _smooth_field(rng, -1.0, 1.0, 224, 224, 0.12)
    assert large.shape == (224, 224)
    assert -1.0 <= large.min() and large.max() <= 1.0 and large.std() > 0
    step = np.abs(np.diff(large, axis=1)).max() / (large.max() - large.min())
    assert step < 0.05  # no jump between neighbouring pixels: smooth at the scale of 0.12 × width
