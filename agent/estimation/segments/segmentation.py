"""Segments: fixed cuts of a window's predictions, defined at ``fit``, computed per batch without a second
model pass.

A :class:`Dimension` puts every prediction in exactly one of its segments, from what judging already has per
prediction (the feature view row, the predicted class, the TDI leaf), as its kind reads it: one module per kind
under :mod:`agent.estimation.segments.kinds` (``predicted``, ``column``, ``rule``, ``region``), listed in
:data:`~agent.estimation.segments.kinds.registry.KINDS`.

:class:`Segmentation` holds every dimension, at most ``max_segments`` segments in all, numbered across the
dimensions and fixed at ``fit`` (so that every window, replica and Prometheus series means the same segment
by the same number), and what the labeled validation data showed per segment (:class:`SegmentReference`).
:meth:`Segmentation.ids` gives a batch's segment ids ``[D, N]`` with a few numpy operations per dimension;
:meth:`agent.estimation.statistics.window.WindowStats.add_segment_sums` adds them up with ``np.bincount``.

JSON-able (``to_dict``/``from_dict``, format :data:`SEGMENTS_FORMAT`), stored in the bundle beside the
estimators' calibration; bundles fitted before segments (or of another format) have none.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from agent.estimation.segments.kinds.base import Tables
from agent.estimation.segments.kinds.registry import KINDS
from agent.estimation.segments.sketch import ChangeSketch
from exporters.label_values import MAX_LABEL as MAX_LABEL
from exporters.label_values import bounded_label

#: Format tag of the bundle entry; an entry of another format is ignored (no segments).
SEGMENTS_FORMAT = "segments_v1"
#: Longest segment or dimension name (``fit`` cuts names made of data, a category or a class name, to it).
MAX_NAME = 240


@dataclass(frozen=True)
class Dimension:
    """One way of cutting the predictions: ``kind`` names its kind (:data:`~.kinds.registry.KINDS`), which
    reads a prediction as ``source`` says (one of the kind's sources) with the tables ``columns``, ``lookup``,
    ``edges``, ``weights`` and ``bias``; ``segments`` are the readable names of its segments, in their order."""

    kind: str
    name: str
    source: str
    segments: tuple[str, ...]
    columns: tuple[int, ...] = ()
    lookup: tuple[int, ...] = ()
    edges: tuple[float, ...] = ()
    weights: tuple[tuple[float, ...], ...] = ()
    bias: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        kind = KINDS.get(self.kind)
        if kind is None:
            raise ValueError(f"unknown segment kind {self.kind!r}")
        if self.source not in kind.sources:
            raise ValueError(f"unknown source {self.source!r} of a {self.kind} segment dimension")
        if not self.segments:
            raise ValueError(f"segment dimension {self.name!r} has no segments")
        k = len(self.segments)
        if any(not 0 <= v < k for v in self.lookup):
            raise ValueError(f"segment dimension {self.name!r}: a lookup entry outside its {k} segments")
        if any(len(w) != k for w in self.weights):
            raise ValueError(f"segment dimension {self.name!r}: weights of the wrong shape")
        kind.check(self.name, self._tables)

    @functools.cached_property
    def _tables(self) -> Tables:
        k = len(self.segments)
        return Tables(
            self.source,
            k,
            np.asarray([*self.lookup, k - 1], dtype=np.int64),  # anything beyond the table: the last segment
            np.asarray(self.edges, dtype=np.float64),
            np.asarray(self.columns, dtype=np.int64),
            np.asarray(self.weights, dtype=np.float32).reshape(-1, k),
            np.asarray(self.bias, dtype=np.float32),
        )

    @property
    def width(self) -> int:
        """Columns of the view it reads (0: it reads no view column)."""
        return KINDS[self.kind].width(self._tables)

    def local_ids(
        self, features: np.ndarray | None, predicted: np.ndarray | None, rules: np.ndarray | None
    ) -> np.ndarray | None:
        """The segment (``0 … len(segments) − 1``) of every prediction, or None when what it reads is missing
        (no TDI leaves, or a view narrower than it was fitted on)."""
        return KINDS[self.kind].local_ids(self._tables, features, predicted, rules)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": self.kind,
            "name": self.name,
            "source": self.source,
            "segments": list(self.segments),
        }
        for key in ("columns", "lookup", "edges", "bias"):
            if getattr(self, key):
                d[key] = list(getattr(self, key))
        if self.weights:
            d["weights"] = [list(w) for w in self.weights]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Dimension:
        return cls(
            kind=str(d["kind"]),
            name=str(d["name"]),
            source=str(d["source"]),
            segments=tuple(str(s) for s in d["segments"]),
            columns=tuple(int(v) for v in d.get("columns", ())),
            lookup=tuple(int(v) for v in d.get("lookup", ())),
            edges=tuple(float(v) for v in d.get("edges", ())),
            weights=tuple(tuple(float(x) for x in w) for w in d.get("weights", ())),
            bias=tuple(float(v) for v in d.get("bias", ())),
        )


#: The per-segment counts of :class:`SegmentReference`, in their JSON order.
_REFERENCE_FIELDS = (
    "n",
    "correct",
    "conf",
    "cal_wrong",
    "cal_right",
    "cal_fail_wrong",
    "cal_fail_right",
    "novel",
)


@dataclass(frozen=True)
class SegmentReference:
    """What the labeled validation data showed per segment (one entry per segment of the
    :class:`Segmentation`): its predictions ``n``, the right ones ``correct`` and their confidence sum
    ``conf`` (the whole validation set: the model's accuracy there does not depend on the oracle); on the
    calibration split (held out of ADI training), its wrong and right predictions and how many of each the
    oracle failed (``cal_*``, the segment's own TPR/FPR); and its novel inputs on the validation set
    (:func:`~agent.estimation.statistics.window.novel_inputs`; zero without a ``shift_aware`` reference); the sum
    of squared confidences ``conf_sq`` (the spread the change test reads the confidence against; empty in bundles
    fitted before it)."""

    n: tuple[int, ...]
    correct: tuple[int, ...]
    conf: tuple[float, ...]
    cal_wrong: tuple[int, ...]
    cal_right: tuple[int, ...]
    cal_fail_wrong: tuple[int, ...]
    cal_fail_right: tuple[int, ...]
    novel: tuple[int, ...]
    conf_sq: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        sizes = {len(getattr(self, f)) for f in _REFERENCE_FIELDS}
        if len(sizes) != 1 or (self.conf_sq and len(self.conf_sq) != len(self.n)):
            raise ValueError("segment reference vectors of different lengths")

    def __len__(self) -> int:
        return len(self.n)

    def to_dict(self) -> dict[str, list[float]]:
        out = {f: list(getattr(self, f)) for f in _REFERENCE_FIELDS}
        if self.conf_sq:
            out["conf_sq"] = list(self.conf_sq)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SegmentReference:
        def ints(key: str) -> tuple[int, ...]:
            return tuple(int(v) for v in d[key])

        def floats(key: str) -> tuple[float, ...]:
            return tuple(float(v) for v in d[key])

        return cls(
            ints("n"),
            ints("correct"),
            floats("conf"),
            ints("cal_wrong"),
            ints("cal_right"),
            ints("cal_fail_wrong"),
            ints("cal_fail_right"),
            ints("novel"),
            floats("conf_sq") if "conf_sq" in d else (),
        )


@dataclass(frozen=True)
class DimensionPrior:
    """What a dimension's segments look like together on the validation data: the whole set's accuracy, mean
    confidence and share of novel inputs, and how many pseudo-predictions of it a segment's own figures are
    pulled toward (``strength``, ``novel_strength``: the sampling variance over the variance between the
    dimension's segments, by the method of moments; few when the segments differ much, many when they
    differ no more than noise)."""

    accuracy: float
    conf: float
    strength: float
    novel: float
    novel_strength: float


#: Bounds of a prior's strength in pseudo-predictions.
MIN_STRENGTH, MAX_STRENGTH = 2.0, 10_000.0


def _strength(sampling: float, counts: np.ndarray, means: np.ndarray) -> float:
    """``sampling / τ²``, τ² the variance between segments beyond sampling noise (method of moments)."""
    n = counts.sum()
    used = counts > 0
    k = int(used.sum())
    if n <= 0 or k < 2 or sampling <= 0:
        return MAX_STRENGTH
    grand = float((counts * means).sum() / n)
    spread = float((counts[used] * (means[used] - grand) ** 2).sum())
    effective = n - float((counts[used] ** 2).sum()) / n
    between = (spread - (k - 1) * sampling) / effective if effective > 0 else 0.0
    return float(np.clip(sampling / between, MIN_STRENGTH, MAX_STRENGTH)) if between > 0 else MAX_STRENGTH


def _prior(ref: SegmentReference, a: int, b: int) -> DimensionPrior:
    n = np.asarray(ref.n[a:b], dtype=np.float64)
    total = max(float(n.sum()), 1.0)
    safe = np.maximum(n, 1.0)
    accuracy = sum(ref.correct[a:b]) / total
    novel = sum(ref.novel[a:b]) / total
    return DimensionPrior(
        accuracy=accuracy,
        conf=sum(ref.conf[a:b]) / total,
        strength=_strength(accuracy * (1 - accuracy), n, np.asarray(ref.correct[a:b]) / safe),
        novel=novel,
        novel_strength=_strength(novel * (1 - novel), n, np.asarray(ref.novel[a:b]) / safe),
    )


@dataclass(frozen=True)
class Segmentation:
    """Every segment dimension of a bundle and the reference of every segment (see the module docstring).
    Segment ``i`` of dimension ``d`` has the global number ``offsets[d] + i``."""

    dimensions: tuple[Dimension, ...]
    reference: SegmentReference
    #: the change columns and their per-segment reference (:mod:`agent.estimation.segments.sketch`; None in
    #: bundles fitted before them, or without a view to read)
    change: ChangeSketch | None = None
    offsets: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        offsets, total = [], 0
        for dim in self.dimensions:
            offsets.append(total)
            total += len(dim.segments)
        object.__setattr__(self, "offsets", tuple(offsets))
        if len(self.reference) != total:
            raise ValueError(f"{len(self.reference)} segment references for {total} segments")
        if self.change is not None and self.change.size != total:
            raise ValueError(f"change references for {self.change.size} of {total} segments")

    @property
    def size(self) -> int:
        """Segments in all (the length of a window's segment vectors)."""
        return len(self.reference)

    @functools.cached_property
    def priors(self) -> tuple[DimensionPrior, ...]:
        """Every dimension's :class:`DimensionPrior` (computed once)."""
        return tuple(_prior(self.reference, a, b) for _, a, b in self.spans())

    def pulled_confidence(self, index: int) -> tuple[float, float]:
        """Segment ``index``'s mean confidence on the validation data, pulled toward its dimension's by the
        dimension's prior, and the rows behind it (the prior's pseudo-rows included): what its estimators read
        as its reference confidence (the change test reads the segment's own)."""
        prior = self.priors[self.dimension_of(index)]
        rows = self.reference.n[index] + prior.strength
        return (self.reference.conf[index] + prior.strength * prior.conf) / rows, rows

    def pulled_novelty(self, index: int) -> tuple[float, float]:
        """Segment ``index``'s share of novel inputs on the validation data, pulled toward its dimension's by
        the dimension's novelty prior, and the rows behind it (the prior's pseudo-rows included): what the
        reconciliation reads as its reference share (the change test reads the segment's own)."""
        prior = self.priors[self.dimension_of(index)]
        rows = self.reference.n[index] + prior.novel_strength
        return (self.reference.novel[index] + prior.novel_strength * prior.novel) / rows, rows

    def dimension_of(self, index: int) -> int:
        """The dimension segment ``index`` belongs to."""
        return int(np.searchsorted(np.asarray(self.offsets), index, side="right")) - 1

    def spans(self) -> list[tuple[Dimension, int, int]]:
        """Every dimension with its segments' global numbers ``start … end − 1``."""
        ends = [*self.offsets[1:], self.size]
        return [(d, a, b) for d, a, b in zip(self.dimensions, self.offsets, ends, strict=True)]

    def names(self) -> list[str]:
        """Every segment's readable name, by global number."""
        return [s for d in self.dimensions for s in d.segments]

    def labels(self) -> list[str]:
        """Every segment's label (its name cut to :data:`MAX_LABEL` characters): the ``segment`` label of the
        Prometheus series, one fixed value per segment."""
        return [label_of(name) for name in self.names()]

    def ids(
        self, features: np.ndarray | None, predicted: np.ndarray | None, rules: np.ndarray | None, n: int
    ) -> np.ndarray:
        """The global segment number of each of ``n`` predictions in every dimension, int64 ``[D, n]``; a
        dimension that cannot read its input gives :attr:`size` (counted nowhere)."""
        return dimension_ids(self.dimensions, features, predicted, rules, n)

    def change_values(self, features: np.ndarray | None) -> np.ndarray | None:
        """Every prediction's change columns ``[N, C]`` (:meth:`ChangeSketch.values`; None without a sketch)."""
        return None if self.change is None else self.change.values(features)

    @property
    def change_sizes(self) -> tuple[int, int]:
        """The change columns and the sketched pairs of them (``(0, 0)`` without a sketch): the lengths of a
        window's per-segment change sums."""
        return (0, 0) if self.change is None else (len(self.change.columns), len(self.change.pairs))

    def change_cross(self, z: np.ndarray) -> np.ndarray:
        """The products of the sketched pairs of change columns ``[N, P]`` (none in sketches without pairs)."""
        if self.change is None or not self.change.pairs:
            return np.zeros((len(z), 0))
        return self.change.cross(z)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": SEGMENTS_FORMAT,
            "dimensions": [d.to_dict() for d in self.dimensions],
            "reference": self.reference.to_dict(),
        }
        if self.change is not None:
            out["change"] = self.change.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Segmentation:
        if d.get("kind") != SEGMENTS_FORMAT:
            raise ValueError(f"segments of another format ({d.get('kind')!r})")
        change = ChangeSketch.from_dict(d["change"]) if d.get("change") else None
        return cls(
            tuple(Dimension.from_dict(x) for x in d["dimensions"]), SegmentReference.from_dict(d["reference"]), change
        )

    def with_change(self, change: ChangeSketch | None) -> Segmentation:
        """A copy with the change columns fixed at fit."""
        return Segmentation(self.dimensions, self.reference, change)


def dimension_ids(
    dimensions: Sequence[Dimension],
    features: np.ndarray | None,
    predicted: np.ndarray | None,
    rules: np.ndarray | None,
    n: int,
) -> np.ndarray:
    """:meth:`Segmentation.ids` of ``dimensions`` numbered one after the other (the segments in all: counted
    nowhere)."""
    size = sum(len(d.segments) for d in dimensions)
    out = np.empty((len(dimensions), n), dtype=np.int64)
    offset = 0
    for d, dim in enumerate(dimensions):
        local = dim.local_ids(features, predicted, rules)
        if local is None or len(local) != n:
            out[d] = size
        else:
            np.add(local, offset, out=out[d])
        offset += len(dim.segments)
    return out


def label_of(name: str) -> str:
    """A segment's name as its ``segment`` label (:func:`exporters.label_values.bounded_label`: one line, at most
    :data:`MAX_LABEL` characters, names that differ only past the cut keep distinct labels)."""
    return bounded_label(name)


def _cut(name: str, limit: int = MAX_NAME) -> str:
    flat = " ".join(name.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def bounded_dimensions(dimensions: Sequence[Dimension]) -> tuple[Dimension, ...]:
    """``dimensions`` with names fit to be shown anywhere: each segment and dimension name on one line and at
    most :data:`MAX_NAME` characters, and every segment name distinct across the dimensions (a repeated one,
    e.g. two long categories cut to the same prefix, gets `` #<its number>``). ``fit`` applies it: names are
    made of data (category values, class names) that nothing else bounds."""
    seen: set[str] = set()
    out = []
    for dim in dimensions:
        names = []
        for name in dim.segments:
            cut = _cut(name)
            if cut in seen:
                tag = f" #{len(seen)}"
                cut = _cut(name, MAX_NAME - len(tag)) + tag
            seen.add(cut)
            names.append(cut)
        out.append(replace(dim, name=_cut(dim.name), segments=tuple(names)))
    return tuple(out)


def segmentation_or_none(d: object) -> Segmentation | None:
    """A bundle's segments, or None when absent (bundles fitted before them) or unreadable."""
    if not isinstance(d, Mapping) or not d:
        return None
    try:
        return Segmentation.from_dict(d)
    except (KeyError, ValueError, TypeError):
        return None


def segment_ids(
    segmentation: Segmentation | None,
    features: np.ndarray | None,
    predicted: np.ndarray | None,
    rules: np.ndarray | None,
    n: int,
) -> np.ndarray | None:
    """:meth:`Segmentation.ids` of a batch, or None without segments."""
    return None if segmentation is None else segmentation.ids(features, predicted, rules, n)


def reference_of(
    ids: np.ndarray,
    size: int,
    correct: np.ndarray,
    confidences: np.ndarray,
    *,
    calibration_rows: np.ndarray,
    failed: np.ndarray,
    novel: np.ndarray | None,
) -> SegmentReference:
    """The :class:`SegmentReference` of labeled validation predictions with segment ids ``ids`` ``[D, N]``,
    correctness and confidences; ``calibration_rows`` (indices into them) are the calibration split, whose
    oracle verdicts ``failed`` (one per calibration row) give the per-segment TPR/FPR; ``novel`` (one per
    prediction) whether its input is novel."""
    d = ids.shape[0]
    flat = ids.ravel()

    def sums(weights: np.ndarray | None, rows: np.ndarray | None = None) -> np.ndarray:
        f = flat if rows is None else ids[:, rows].ravel()
        w = None if weights is None else np.tile(np.asarray(weights, dtype=np.float64), d)
        return np.bincount(f, weights=w, minlength=size + 1)[:size]

    ok = np.asarray(correct, dtype=bool)
    cal = np.asarray(calibration_rows, dtype=np.int64)
    fail = np.asarray(failed, dtype=bool)
    wrong_cal = ~ok[cal]
    nov = np.zeros(len(ok), dtype=bool) if novel is None else np.asarray(novel, dtype=bool)

    def ints(a: np.ndarray) -> tuple[int, ...]:
        return tuple(int(round(v)) for v in a)

    def floats(a: np.ndarray) -> tuple[float, ...]:
        return tuple(float(v) for v in a)

    return SegmentReference(
        n=ints(sums(None)),
        correct=ints(sums(ok)),
        conf=floats(sums(confidences)),
        cal_wrong=ints(sums(wrong_cal, cal)),
        cal_right=ints(sums(~wrong_cal, cal)),
        cal_fail_wrong=ints(sums(fail & wrong_cal, cal)),
        cal_fail_right=ints(sums(fail & ~wrong_cal, cal)),
        novel=ints(sums(nov)),
        conf_sq=floats(sums(np.asarray(confidences, dtype=np.float64) ** 2)),
    )


def truth_counts(ids: np.ndarray, size: int, correct: np.ndarray) -> tuple[list[int], list[int]]:
    """Per segment, the labeled predictions and the right ones among them, from their segment numbers
    ``ids`` ``[D, N]`` and whether each was right (what ``segment_table`` reads as ``truth``)."""
    d = ids.shape[0]
    flat = ids.ravel()
    ok = np.tile(np.asarray(correct, dtype=np.float64).reshape(-1), d)
    n = np.bincount(flat, minlength=size + 1)[:size]
    right = np.bincount(flat, weights=ok, minlength=size + 1)[:size]
    return [int(v) for v in n], [int(round(v)) for v in right]
