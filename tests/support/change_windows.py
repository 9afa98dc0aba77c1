"""A window's change sums from rows and their segments, as the served path adds them, and what the change test
reads of them: the one way the change tests build a window, so that each reads the same sums the agent does."""

from __future__ import annotations

import numpy as np

from agent.estimation.segments.change import ChangeReference, SegmentChange, WindowChange, segment_changes
from agent.estimation.segments.sketch import ChangeSketch
from agent.estimation.statistics.window import WindowStats


def change_window(sketch: ChangeSketch, seg: np.ndarray, x: np.ndarray, segments: int) -> WindowStats:
    """The window statistic of rows ``x`` in segments ``seg`` (one dimension of ``segments``): their counts and
    their change sums, with the sketch's pairs."""
    z = sketch.values(x)
    assert z is not None
    out = WindowStats(n=len(seg))
    out.seg_n = np.bincount(seg, minlength=segments).tolist()
    out.seg_fails = [0] * segments
    out.add_change_sums(seg[None, :], segments, z, sketch.cross(z))
    return out


def window_change(stats: WindowStats) -> WindowChange:
    """What the change test reads of a window statistic."""
    return WindowChange(
        stats.change_n, stats.change_sum, stats.change_sq, stats.seg_n, stats.seg_fails, stats.change_cross
    )


def changes_of(
    sketch: ChangeSketch, ref: ChangeReference, seg: np.ndarray, x: np.ndarray, segments: int
) -> list[SegmentChange]:
    """Every segment's change in a window of rows ``x`` in segments ``seg``, against ``ref``."""
    return segment_changes(sketch, window_change(change_window(sketch, seg, x, segments)), ref)
