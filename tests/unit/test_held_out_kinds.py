"""The kinds of shift held out of every ``shift_aware`` fit, which only the flag's fit sees: inverted images and
brightness far beyond the audit's, negated and far-moved table columns; none of them among the corruptions
``shift_aware`` learns from."""

from __future__ import annotations

import numpy as np

from agent.offline.calibration.corruptions import AUDIT_RANGES, iter_shifted_sets
from agent.offline.calibration.held_out_kinds import HELD_OUT_KINDS, held_out_corruptions, iter_held_out_sets


def _digits_like(n: int = 200, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.zeros((n, 1, 12, 12), np.float32)
    for i in range(n):  # a bright bar at a random place: strokes on a dark background
        r, c = rng.integers(2, 8, 2)
        x[i, 0, r : r + 4, c : c + 2] = 255.0
    return x


def test_inverted_images_are_negatives_in_the_pixel_range_a_share_s_of_them() -> None:
    x = _digits_like().astype(np.float64)
    kinds, clip = held_out_corruptions((1, 12, 12), x)
    assert set(kinds) == set(HELD_OUT_KINDS["image"]) and clip == (0.0, 255.0)
    rng = np.random.default_rng(0)
    whole = kinds["invert"](x, 1.0, rng)
    np.testing.assert_array_equal(whole, 255.0 - x)  # 1 − x scaled to the range
    half = kinds["invert"](x, 0.5, rng)
    inverted = np.all(half == 255.0 - x, axis=(1, 2, 3))
    assert np.all(inverted | np.all(half == x, axis=(1, 2, 3)))  # each image inverted whole, or left as it is
    assert 0.35 < inverted.mean() < 0.65


def test_far_brightness_moves_a_share_s_of_the_images_beyond_the_audits_brightness() -> None:
    x = _digits_like().astype(np.float64)
    kinds, _ = held_out_corruptions((1, 12, 12), x)
    audit_top = AUDIT_RANGES["brightness"][1]  # the audit's brightness at strength 1, as a share of the range
    for seed, share in enumerate([0.2, 0.5, 0.8, 1.0]):
        moved = kinds["far_brightness"](x, share, np.random.default_rng(seed))
        rows = np.any(moved != x, axis=(1, 2, 3))
        assert abs(rows.mean() - share) < 0.12 and (share < 1.0 or rows.all())  # each image with probability s
        offset = np.unique(np.round(moved[rows] - x[rows], 6))
        assert len(offset) == 1 and audit_top * 255.0 < abs(offset[0]) <= 255.0  # one move, beyond the audit's


def test_table_kinds_negate_columns_and_move_columns_by_several_standard_deviations() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(5.0, 2.0, (300, 9))
    kinds, clip = held_out_corruptions((9,), x)
    assert set(kinds) == set(HELD_OUT_KINDS["table"]) and clip is None
    neg = kinds["invert"](x, 0.5, np.random.default_rng(2))
    flipped = np.all(neg == -x, axis=0)
    assert flipped.sum() == 5 and np.all(flipped | np.all(neg == x, axis=0))  # ceil(0.5 · 9) columns negated
    far = kinds["far_offset"](x, 1.0, np.random.default_rng(3))
    shift = (far - x).mean(axis=0) / x.std(axis=0)
    moved = np.abs(shift) > 1e-9
    assert moved.sum() == 3 and np.all(np.abs(shift[moved]) >= 5.5)  # 6 standard deviations at strength 1


def test_held_out_copies_are_made_beside_and_apart_from_the_calibration_corruptions() -> None:
    x = _digits_like(60).astype(np.float32)
    copies = list(iter_held_out_sets(x, (1, 12, 12), train_x=x, per_kind=3, seed=0))
    assert sorted(s.name for s in copies) == sorted(HELD_OUT_KINDS["image"] * 3)
    for name in HELD_OUT_KINDS["image"]:  # one strength in each third of (0, 1]
        assert [
            int(s.strength * 3) for s in sorted((c for c in copies if c.name == name), key=lambda c: c.strength)
        ] == [0, 1, 2]
    assert all(c.x.min() >= 0.0 and c.x.max() <= 255.0 and c.x.dtype == np.float32 for c in copies)
    only = list(iter_held_out_sets(x, (1, 12, 12), train_x=x, per_kind=2, seed=0, exclude=("invert",)))
    assert {s.name for s in only} == {"far_brightness"} and len(only) == 2
    seen = {s.name for s in iter_shifted_sets(x, (1, 12, 12), train_x=x, n_sets=40, seed=0)}
    assert not seen & {k for kinds in HELD_OUT_KINDS.values() for k in kinds}  # shift_aware never learns them
