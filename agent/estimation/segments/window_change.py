"""A window's per-segment sums as the change test reads them (:mod:`agent.estimation.segments.change`), with what
the bundle's segmentation holds of every segment at fit: its validation rows, its own confidence and novel inputs,
the oracle's failures on its calibration split, and whether its dimension is cut by the model's own output."""

from __future__ import annotations

from agent.estimation.segments.change import ChangeReference, SegmentChange, WindowChange, pulled, segment_changes
from agent.estimation.segments.kinds.registry import KINDS
from agent.estimation.segments.segmentation import Segmentation
from agent.estimation.statistics.items import CHANGE_STATS
from agent.estimation.statistics.window import WindowStats


def window_changes(stats: WindowStats, seg: Segmentation, fpr: float) -> list[SegmentChange]:
    """Every segment's change in the window (:func:`~agent.estimation.segments.change.segment_changes`)."""
    ref = seg.reference
    cal_n = [w + r for w, r in zip(ref.cal_wrong, ref.cal_right, strict=True)]
    cal_fails = [w + r for w, r in zip(ref.cal_fail_wrong, ref.cal_fail_right, strict=True)]
    total = sum(cal_n)
    rate = sum(cal_fails) / total if total else fpr
    spans = [(a, b) for _, a, b in seg.spans()]
    window = WindowChange(
        stats.change_n,
        stats.change_sum,
        stats.change_sq,
        stats.seg_n,
        stats.seg_fails,
        stats.change_cross,
        stats.seg_conf,
        stats.seg_conf_sq,
        stats.seg_novel if len(stats.seg_novel) == seg.size else (),
    )
    conf, conf_n, conf_var = [], [], []
    if ref.conf_sq:  # bundles fitted before the reference kept its squares do not test the confidence
        _, a, b = seg.spans()[0]  # every dimension holds each validation row once
        rows = max(sum(ref.n[a:b]), 1)
        whole_mean = sum(ref.conf[a:b]) / rows
        whole_var = max(sum(ref.conf_sq[a:b]) / rows - whole_mean * whole_mean, 0.0)
        for s in range(seg.size):
            n = max(ref.n[s], 1)
            mean = ref.conf[s] / n
            conf.append(mean)
            conf_n.append(float(n))
            conf_var.append(pulled(max(ref.conf_sq[s] / n - mean * mean, 0.0), whole_var, n))
    novel, novel_n = [], []
    if any(ref.novel):  # a bundle without a shift_aware reference counts no novel input
        for s in range(seg.size):
            novel.append(ref.novel[s] / max(ref.n[s], 1))
            novel_n.append(float(max(ref.n[s], 1)))
    by_output = [KINDS[d.kind].by_output for d, a, b in seg.spans() for _ in range(a, b)]
    reference = ChangeReference(ref.n, spans, cal_n, cal_fails, rate, conf, conf_n, conf_var, novel, novel_n, by_output)
    return segment_changes(seg.change, window, reference)


def padded_change(stats: WindowStats, seg: Segmentation) -> WindowStats:
    """``stats`` with the change sums as long as the sketch's (an export holds only the segments with
    predictions), or empty when they do not fit it (sums of another sketch)."""
    c, p = seg.change_sizes
    wanted = (seg.size, seg.size * c, seg.size * c, seg.size * p)
    lengths = (len(stats.change_n), len(stats.change_sum), len(stats.change_sq), len(stats.change_cross))
    if lengths == wanted or not any(lengths):
        return stats
    out = stats.copy()
    if not c or any(have > want for have, want in zip(lengths, wanted, strict=True)):
        out.change_n, out.change_sum, out.change_sq, out.change_cross = [], [], [], []
        return out
    out.change_n.extend([0] * (seg.size - lengths[0]))
    for name, want in zip(CHANGE_STATS, wanted[1:], strict=True):
        values = getattr(out, name)
        values.extend([0.0] * (want - len(values)))
    return out
