"""A window's statistics as flat ``(name, number)`` items: the ``stat`` label of ``icos_window_stat_total``,
from which the fleet evaluator rebuilds the statistics of all replicas (:func:`stats_from_items`)."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping

from agent.estimation.statistics.window import _FAMILY_KIND, _FIELDS, _VECTOR_ZERO, WindowStats
from invariants.oracle import FAMILIES

#: (field, "vector" | "family" | "scalar") of every exported field, in declaration order (:func:`stat_items`).
_PLAN: tuple[tuple[str, str], ...] = tuple(
    (f.name, "vector" if str(f.type) in _VECTOR_ZERO else "family" if str(f.type) == _FAMILY_KIND else "scalar")
    for f in _FIELDS
    if not f.metadata.get("agent_only")
)
_FAMILY_NAMES: dict[str, tuple[tuple[str, str], ...]] = {
    name: tuple((fam, f"{name}:{fam}") for fam in FAMILIES) for name, kind in _PLAN if kind == "family"
}


#: CBPE's per-class sums (filled only up to the class cap).
CBPE_STATS: tuple[str, ...] = ("cbpe_predicted", "cbpe_true_positive", "cbpe_support")
#: Vector statistics that grow with the number of classes (left out of a flat export above a cap).
CLASS_STATS: tuple[str, ...] = ("class_counts", "class_conf", *CBPE_STATS)
#: Per-segment sums (:meth:`WindowStats.add_segment_sums`; as long as the bundle's segmentation).
SEGMENT_STATS: tuple[str, ...] = ("seg_n", "seg_conf", "seg_conf_sq", "seg_fails", "seg_novel", "change_n")
#: Per segment and change column sums (segment-major, ``S × C``; :meth:`WindowStats.add_change_sums`).
CHANGE_STATS: tuple[str, ...] = ("change_sum", "change_sq", "change_cross")
#: Vector statistics of the per-sample inputs (``leaves`` grows with the TDI tree unless binned).
INPUT_STATS: tuple[str, ...] = ("pca_bins", "leaves", "class_counts", "class_conf")


def stat_items(
    stats: WindowStats, *, classes: bool = True, inputs: bool = True, sparse_segments: bool = False
) -> Iterator[tuple[str, float]]:
    """Every additive number of ``stats`` under a flat name: a count or sum by its field name, entry
    ``i`` of a vector as ``name:i``, a family count as ``name:family`` (zeros included, so that a
    vector's length survives the export). ``classes=False`` leaves out :data:`CLASS_STATS` (and
    reports ``n_cls`` as 0, so that a reader falls back to the model without class features);
    ``inputs=False`` leaves out the vectors of the per-sample inputs (:data:`INPUT_STATS`) and reports
    ``n_ext`` and ``n_cls`` as 0 (a reader then uses the reduced model): for bundles fitted before the
    leaves were binned, whose leaf counts would be one series per leaf. Agent-only statistics (the
    labeled sample's ``lab_*`` sums, which come from the shared store) are never exported.
    ``sparse_segments``: the per-segment sums (:data:`SEGMENT_STATS`) only of the segments with a prediction
    (a judged batch touches a few of them: its counters add nothing to the others, whose series then start
    at the first batch with a prediction in them).

    These names are the ``stat`` label of ``icos_window_stat_total``, from which the fleet evaluator
    rebuilds the statistic of all replicas (:func:`stats_from_items`)."""
    touched = [i for i, n in enumerate(stats.seg_n) if n] if sparse_segments else None
    for name, kind in _PLAN:
        value = getattr(stats, name)
        if kind == "vector":
            if touched is not None and name in SEGMENT_STATS:
                names = _vector_names(name, len(value))
                yield from ((names[i], value[i]) for i in touched if i < len(value))
            elif touched is not None and name in CHANGE_STATS:
                names = _vector_names(name, len(value))
                c = len(value) // max(len(stats.change_n), 1)
                yield from ((names[j], value[j]) for i in touched for j in range(i * c, (i + 1) * c))
            elif (classes or name not in CLASS_STATS) and (inputs or name not in INPUT_STATS):
                yield from zip(_vector_names(name, len(value)), value, strict=True)
        elif kind == "family":
            for fam, key in _FAMILY_NAMES[name]:
                yield key, value.get(fam, 0)
        elif (name == "n_cls" and not (classes and inputs)) or (name == "n_ext" and not inputs):
            yield name, 0
        else:
            yield name, value


@functools.lru_cache(maxsize=64)
def _vector_names(name: str, size: int) -> tuple[str, ...]:
    """``name:0`` … ``name:<size − 1>`` (built once per length: :func:`stat_items` is on the judging path)."""
    return tuple(f"{name}:{i}" for i in range(size))


def stats_from_items(items: Mapping[str, float]) -> WindowStats:
    """The inverse of :func:`stat_items` (unknown names are ignored; counts are rounded to integers,
    since a sum of counter differences is exact only up to float rounding)."""
    out = WindowStats()
    by_name = {f.name: f for f in _FIELDS}
    for key, raw in items.items():
        name, _, index = key.partition(":")
        f = by_name.get(name)
        if f is None:
            continue
        kind = str(f.type)
        if kind in _VECTOR_ZERO:
            if not index.isdigit():
                continue
            i = int(index)
            vec = getattr(out, name)
            vec.extend([_VECTOR_ZERO[kind]] * (i + 1 - len(vec)))
            vec[i] = round(raw) if kind == "list[int]" else float(raw)
        elif kind == _FAMILY_KIND:
            if index in FAMILIES:
                getattr(out, name)[index] = round(raw)
        elif not index:
            setattr(out, name, round(raw) if kind == "int" else float(raw))
    return out
