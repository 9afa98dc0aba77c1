"""The change sketch fixed at ``fit``: which linear reads of the feature view a window sums per segment, and the
reference sums of the labeled validation data (DESIGN, "Diagnosis and comparison"; docs/diagnosis.md, "What
changed"). :mod:`agent.estimation.segments.change` tests a window's sums against them.

At ``fit`` a few *change columns* are fixed (:class:`ChangeSketch`): the numeric columns of a table view (at most
:data:`MAX_COLUMNS`, the most informative of the predicted class first), or the leading principal components of a
wide view (images, text, embeddings), and for a table the *relation* of each numeric column the others explain
(their least-squares fit of it, at most :data:`MAX_RELATIONS`: a column shuffled or swapped inside a segment keeps
its distribution there and no longer follows the others). Each is a linear read of the feature view, standardized on
the training data and clipped to ``±``:data:`CLIP` (a column scaled by 100 upstream stays a bounded number), then
offset by :data:`CLIP` so that every sum is a non-negative counter: ``z = clip(x · W + b) + CLIP``, in ``[0,
2·CLIP]`` (the test, :mod:`agent.estimation.segments.change`, reads ``(z, z²)``, an invertible affine map of the
unshifted pair: the offset changes none of its figures). A window keeps, per segment and change column, the sums ``Σ
z`` and ``Σ z²`` (:attr:`~agent.estimation.statistics.window.WindowStats.change_sum`, ``change_sq``), per segment
the predictions read (``change_n``) and the products of the sketched pairs (``change_cross``:
:attr:`ChangeSketch.pairs`): sums that add across windows and replicas like every other statistic. The reference is
the same read of the labeled validation data, per segment, with its third and fourth moments and, per sketched pair,
how much more its correlation varies than a normal pair's (:func:`correlation_factors`).

A table's column that mostly holds one value (zero-inflated: a balance, a count of rare events) also has a *point*
column (:attr:`ChangeSketch.points`): ``1`` where the row holds that value, ``0`` elsewhere, whose sums are the rows
at it. Zeroing such a column moves its moments by a fraction of a deviation (the few other values it held were all
its spread), but its share at the value jumps; a proportion test reads it
(:meth:`agent.estimation.segments.change._Moments.points`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.estimation.statistics.segment_sums import per_segment

#: Most change columns a bundle sketches (of a table: its numeric columns; each may bring its relation to the
#: others besides, :data:`MAX_RELATIONS`).
MAX_COLUMNS = 16
#: Most *relation* columns a table's sketch adds: a numeric column less its least-squares fit on the other sketched
#: columns (``a ~ others``), for the columns the others predict well (a column shuffled or swapped inside a segment
#: keeps its own distribution there and breaks its relation to the others).
MAX_RELATIONS = 8
#: The first change columns whose correlations (every pair of them) are sketched as well.
PAIR_COLUMNS = 4
#: Most *point* columns a table's sketch adds (:attr:`ChangeSketch.points`).
MAX_POINTS = 8
#: The share of a column's training rows its most common value must hold, at least and at most, for a point column
#: to read it: a column mostly at one value, whose other values are still common enough to go missing.
POINT_SHARE = (0.5, 0.95)
#: Standardized values are clipped to ``±CLIP`` (bounded sums, whatever broke upstream).
CLIP = 6.0
#: Bytes of a float32 view's rows read in float64 at once: a float64 copy of a whole group of wide rows (images)
#: is a fresh mapping whose every page faults on the judge thread, several times the product's own cost; the
#: product stays in float64, so a row's change columns do not depend on its place in its batch.
CHUNK_BYTES = 64 << 10


@dataclass(frozen=True)
class ChangeSketch:
    """The change columns fixed at fit (see the module docstring): their names, the linear read ``W`` ``[D, C]``
    (``weights``, as rows of the view's ``width`` columns) and ``bias``; per segment of the segmentation, its
    validation rows ``ref_n`` and the sums of ``z``, ``z²``, ``z³``, ``z⁴`` (``ref_moments``, four vectors of
    ``S × C`` entries, segment-major)."""

    columns: tuple[str, ...]
    weights: tuple[tuple[float, ...], ...]
    bias: tuple[float, ...]
    ref_n: tuple[int, ...]
    ref_moments: tuple[tuple[float, ...], ...]
    #: per segment and sketched pair (:attr:`pairs`), the sum of ``zᵢ zⱼ``
    ref_cross: tuple[float, ...] = ()
    #: the relation columns (the last ``len(relations)`` columns): for each, the column it is the others' fit of
    #: (:data:`MAX_RELATIONS`; none in sketches fitted without them)
    relations: tuple[int, ...] = ()
    #: per segment and sketched pair, how many times the sampling variance of its correlation exceeds a bivariate
    #: normal's (:func:`correlation_factors`; empty in sketches fitted without them: 1)
    ref_pair_factor: tuple[float, ...] = ()
    #: the point columns (the last ``len(points)`` columns, after the relations; none in sketches fitted without
    #: them): for each, the view's column and the value (as float32) whose rows it counts; not linear reads, so
    #: ``weights`` and ``bias`` cover the columns before them
    points: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        c = len(self.columns)
        if not 0 < c <= MAX_COLUMNS + MAX_RELATIONS + MAX_POINTS:
            raise ValueError(f"{c} change columns (1 … {MAX_COLUMNS + MAX_RELATIONS + MAX_POINTS})")
        linear = c - len(self.points)
        if len(self.bias) != linear or any(len(w) != linear for w in self.weights) or not self.weights:
            raise ValueError("change columns: weights or bias of the wrong shape")
        if len(self.points) > MAX_POINTS or any(
            not 0 <= j < len(self.weights) or not np.isfinite(v) for j, v in self.points
        ):
            raise ValueError("change columns: points of the wrong shape")
        if len(self.ref_moments) != 4 or any(len(m) != len(self.ref_n) * c for m in self.ref_moments):
            raise ValueError("change columns: reference moments of the wrong shape")
        base = linear - len(self.relations)
        if len(self.relations) > MAX_RELATIONS or any(not 0 <= t < base for t in self.relations):
            raise ValueError("change columns: relations of the wrong shape")
        pairs = sketched_pairs(base, self.relations) if self.ref_cross else ()
        object.__setattr__(self, "_pairs", pairs)
        index = (np.asarray([i for i, _ in pairs], dtype=np.intp), np.asarray([j for _, j in pairs], dtype=np.intp))
        object.__setattr__(self, "_pair_index", index)
        if self.ref_cross and len(self.ref_cross) != len(self.ref_n) * len(self.pairs):
            raise ValueError("change columns: reference correlations of the wrong shape")
        if self.ref_pair_factor and (
            len(self.ref_pair_factor) != len(self.ref_cross)
            or not all(0 < f < float("inf") for f in self.ref_pair_factor)
        ):
            raise ValueError("change columns: correlation factors of the wrong shape, or not positive finite numbers")
        object.__setattr__(self, "_w", np.asarray(self.weights, dtype=np.float64))
        object.__setattr__(self, "_b", np.asarray(self.bias, dtype=np.float64))
        object.__setattr__(self, "_point_at", np.asarray([j for j, _ in self.points], dtype=np.intp))
        object.__setattr__(self, "_point_value", np.asarray([v for _, v in self.points], dtype=np.float32))
        object.__setattr__(self, "_point_bases", tuple(self._point_base(j, v) for j, v in self.points))

    @property
    def base(self) -> int:
        """The columns tested by their moments: the first ones, before the relations and the points."""
        return len(self.columns) - len(self.relations) - len(self.points)

    @property
    def first_point(self) -> int:
        """The first point column (:attr:`points`), after the relations."""
        return len(self.columns) - len(self.points)

    @property
    def point_bases(self) -> tuple[tuple[int, float], ...]:
        """Per point column, the change column that reads the same view column alone and the value ``z`` it reads
        at the point (``(-1, 0.0)`` where none does): the rows at the point all add that value to its sums, so the
        sums of its other rows are the column's less the point's count times it."""
        return self._point_bases  # type: ignore[attr-defined,no-any-return]

    def _point_base(self, at: int, value: float) -> tuple[int, float]:
        w: np.ndarray = self._w  # type: ignore[attr-defined]
        for c in range(self.base):
            if w[at, c] != 0.0 and np.count_nonzero(w[:, c]) == 1:
                z = float(np.float64(np.float32(value)) * w[at, c] + self.bias[c])
                return c, min(max(z, -CLIP), CLIP) + CLIP
        return -1, 0.0

    @property
    def width(self) -> int:
        """Columns of the view it reads."""
        return len(self.weights)

    @property
    def size(self) -> int:
        """Segments it has a reference for."""
        return len(self.ref_n)

    @property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        """The pairs of change columns whose correlation is sketched (none in sketches fitted without them): every
        pair of the first :data:`PAIR_COLUMNS`, then each column with the others' fit of it (its relation)."""
        return self._pairs  # type: ignore[attr-defined,no-any-return]

    def cross(self, z: np.ndarray) -> np.ndarray:
        """``zᵢ zⱼ`` of every row of the change columns ``z`` ``[N, C]`` for every sketched pair ``[N, P]``."""
        i, j = self._pair_index  # type: ignore[attr-defined]
        return z[:, i] * z[:, j]  # type: ignore[no-any-return]

    def pair_name(self, i: int, j: int) -> str:
        """A pair's name in a report: ``a ~ b``, or ``a ~ the others`` for a column and its relation."""
        relation = j >= self.base
        return f"{self.columns[i]} ~ {'the others' if relation else self.columns[j]}"

    def values(self, features: np.ndarray | None) -> np.ndarray | None:
        """Every prediction's change columns ``[N, C]`` (None when the view is missing or narrower than at fit)."""
        if features is None:
            return None
        f = np.asarray(features).reshape(len(features), -1)
        if f.shape[1] < self.width:
            return None
        x = f[:, : self.width]
        with np.errstate(over="ignore", invalid="ignore"):
            if x.dtype == np.float64:
                z = x @ self._w + self._b  # type: ignore[attr-defined]
            else:  # the served view (float32): in float64 a few rows at a time, no float64 copy of them all
                z = np.empty((len(x), len(self.bias)))
                step = max(1, CHUNK_BYTES // (8 * self.width))
                for a in range(0, len(x), step):
                    np.matmul(x[a : a + step].astype(np.float64), self._w, out=z[a : a + step])  # type: ignore[attr-defined]
                z += self._b  # type: ignore[attr-defined]
        if not np.isfinite(z).all():  # a missing or infinite input spoils only its own columns
            x = np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=1e30, neginf=-1e30)
            with np.errstate(over="ignore", invalid="ignore"):
                z = x @ self._w + self._b  # type: ignore[attr-defined]
            np.nan_to_num(z, copy=False, nan=0.0, posinf=CLIP, neginf=-CLIP)
        np.clip(z, -CLIP, CLIP, out=z)
        np.add(z, CLIP, out=z)  # in [0, 2·CLIP]: every sum a non-negative, growing counter
        if not self.points:
            return z
        columns: np.ndarray = self._point_at  # type: ignore[attr-defined]
        with np.errstate(over="ignore", invalid="ignore"):  # the view's own values: a missing one is at no value
            at = f[:, columns].astype(np.float32, copy=False) == self._point_value  # type: ignore[attr-defined]
        return np.concatenate([z, at.astype(np.float64)], axis=1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "columns": list(self.columns),
            "weights": [list(w) for w in self.weights],
            "bias": list(self.bias),
            "ref_n": list(self.ref_n),
            "ref_moments": [list(m) for m in self.ref_moments],
            "ref_cross": list(self.ref_cross),
            "relations": list(self.relations),
            "ref_pair_factor": list(self.ref_pair_factor),
            "points": [[j, v] for j, v in self.points],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChangeSketch:
        return cls(
            tuple(str(c) for c in d["columns"]),
            tuple(tuple(float(x) for x in w) for w in d["weights"]),
            tuple(float(x) for x in d["bias"]),
            tuple(int(v) for v in d["ref_n"]),
            tuple(tuple(float(x) for x in m) for m in d["ref_moments"]),
            tuple(float(x) for x in d.get("ref_cross", ())),
            tuple(int(t) for t in d.get("relations", ())),
            tuple(float(x) for x in d.get("ref_pair_factor", ())),
            tuple((int(j), float(v)) for j, v in d.get("points", ())),
        )

    def pair_factor(self, segment: int, pair: int) -> float:
        """:attr:`ref_pair_factor` of a segment's sketched pair (1 where the sketch has none)."""
        if not self.ref_pair_factor:
            return 1.0
        return self.ref_pair_factor[segment * len(self.pairs) + pair]


def column_pairs(columns: int) -> tuple[tuple[int, int], ...]:
    """Every pair ``(i, j)``, ``i < j``, of the first :data:`PAIR_COLUMNS` of ``columns`` change columns."""
    k = min(columns, PAIR_COLUMNS)
    return tuple((i, j) for i in range(k) for j in range(i + 1, k))


def sketched_pairs(base: int, relations: Sequence[int] = ()) -> tuple[tuple[int, int], ...]:
    """The pairs a sketch of ``base`` columns and ``relations`` (:attr:`ChangeSketch.relations`) reads: every pair
    of the first :data:`PAIR_COLUMNS`, then each related column with its relation (numbered from ``base``)."""
    return column_pairs(base) + tuple((t, base + k) for k, t in enumerate(relations))


def cross_products(z: np.ndarray, pairs: Sequence[tuple[int, int]] | None = None) -> np.ndarray:
    """``zᵢ zⱼ`` of every row for every pair of ``pairs`` (None: :func:`column_pairs`) ``[N, P]``."""
    pairs = column_pairs(z.shape[1]) if pairs is None else pairs
    if not pairs:
        return np.zeros((len(z), 0))
    i, j = (np.asarray(x) for x in zip(*pairs, strict=True))
    return z[:, i] * z[:, j]


def reference_moments(
    ids: np.ndarray, size: int, z: np.ndarray, pairs: Sequence[tuple[int, int]] | None = None
) -> tuple[list[int], list[list[float]], list[float]]:
    """Per segment, the rows, the sums of ``z … z⁴`` (four ``S × C`` vectors) and of the products of ``pairs``
    (None: :func:`column_pairs`) of rows with segment numbers ``ids`` ``[D, N]`` and change columns ``z`` ``[N, C]``."""
    counts = per_segment(ids, size, np.ones((len(z), 1)))
    moments = [per_segment(ids, size, z**power).tolist() for power in (1, 2, 3, 4)]
    return [int(round(v)) for v in counts], moments, per_segment(ids, size, cross_products(z, pairs)).tolist()


#: The range a correlation's variance factor is kept in (:func:`correlation_factors`).
FACTOR_RANGE = (0.25, 25.0)


def correlation_factors(z: np.ndarray, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
    """For rows ``z`` ``[N, C]``, how many times the large-sample variance of each pair's correlation exceeds a
    bivariate normal's ``(1 − ρ²)²/N``: ``n·Var(r) = ρ²/4 (μ₄₀ + μ₀₄ + 2μ₂₂) − ρ (μ₃₁ + μ₁₃) + μ₂₂`` in the
    standardized moments ``μₐᵦ = E[xᵃ yᵇ]`` (the delta method), over ``(1 − ρ²)²``, in :data:`FACTOR_RANGE` (1 for a
    pair with a constant column). Fisher's ``z`` of a correlation has variance ``1/(N − 3)`` only for normal columns;
    a skewed or heavy-tailed pair's correlation varies several times more, and a test that ignores it reads a clean
    window's correlation as broken."""
    out = np.ones(len(pairs))
    if len(z) < 4 or not pairs:
        return out
    i, j = (np.asarray(v) for v in zip(*pairs, strict=True))
    u = z - z.mean(axis=0)
    sd = u.std(axis=0)
    ok = (sd[i] > 1e-9) & (sd[j] > 1e-9)
    x = u[:, i] / np.where(sd[i] > 1e-9, sd[i], 1.0)
    y = u[:, j] / np.where(sd[j] > 1e-9, sd[j], 1.0)
    rho = np.clip((x * y).mean(axis=0), -0.999, 0.999)
    x2, y2 = x * x, y * y
    m40, m04, m22 = (x2 * x2).mean(axis=0), (y2 * y2).mean(axis=0), (x2 * y2).mean(axis=0)
    m31, m13 = (x2 * x * y).mean(axis=0), (x * y2 * y).mean(axis=0)
    n_var = rho * rho / 4.0 * (m40 + m04 + 2.0 * m22) - rho * (m31 + m13) + m22
    factor = np.clip(n_var / (1.0 - rho * rho) ** 2, *FACTOR_RANGE)
    return np.where(ok, factor, out)
