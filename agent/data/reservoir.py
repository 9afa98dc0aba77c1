"""A bounded, uniform sample of recent live inputs for label-free audits (Algorithm R).

Vitter's Algorithm R ("Random sampling with a reservoir", ACM TOMS 11(1), 1985): the first ``k``
items fill the reservoir; item ``t`` (0-based, ``t >= k``) replaces a uniformly chosen slot with
probability ``k/(t+1)``. After any number of items every one of them is in the sample with the same
probability, and memory stays ``k`` inputs.

"Recent" is bounded by generations: the sample covers the inputs of the current generation; when
it is older than ``horizon_seconds`` a new generation starts, and the previous one is kept until the
new one holds ``min_samples`` inputs. :meth:`Reservoir.sample` returns the newest generation that is
large enough. Inputs of another shape than the first one (a reloaded model) start afresh.

A model of named inputs has its inputs (a mapping of name → array, as :class:`agent.model.inputs.Inputs`)
kept whole, sample by sample: inputs
of a fixed shape in one array each (text as an object array of strings), inputs of a dynamic length
(token ids and their mask) row by row, padded with zeros to the longest row when sampled. Their size is
then the client's to choose, so a sample whose text and dynamic rows together exceed
``max_sample_bytes`` is not offered (and counted in :attr:`Reservoir.too_large`): the reservoir holds
at most ``capacity × max_sample_bytes`` of them.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["DEFAULT_MAX_SAMPLE_BYTES", "Reservoir"]

#: Bytes of text and dynamic-length rows of one sample beyond which it is not kept (``audits.reservoir``'s).
DEFAULT_MAX_SAMPLE_BYTES = 64 * 1024
#: The name a bare array is kept under.
_BARE = ""


@dataclass
class _Generation:
    started: float
    seen: int
    #: per input: ``[k, *shape]``, or ``[k]`` of row arrays for an input of a dynamic length
    items: dict[str, np.ndarray]
    capacity: int

    @property
    def filled(self) -> int:
        return min(self.seen, self.capacity)


#: One input's place in the layout: name, dtype, per-sample shape (``None``: dynamic, rows kept apart).
_Slot = tuple[str, np.dtype, "tuple[int, ...] | None"]


class Reservoir:
    """Thread-safe Algorithm R sample of at most ``capacity`` inputs; ``add`` is cheap per batch."""

    def __init__(
        self,
        capacity: int,
        *,
        horizon_seconds: float | None = 3600.0,
        min_samples: int = 1,
        seed: int | None = None,
        clock: Callable[[], float] = time.time,
        max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.horizon_seconds = horizon_seconds
        self.min_samples = max(1, int(min_samples))
        self.max_sample_bytes = int(max_sample_bytes)
        #: Samples not offered because their text and dynamic rows exceed ``max_sample_bytes``.
        self.too_large = 0
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._layout: tuple[_Slot, ...] | None = None
        self._bare = True
        self._current: _Generation | None = None
        self._previous: _Generation | None = None
        self._clock = clock

    # -- feeding ------------------------------------------------------------------------------
    def add(self, batch: np.ndarray | Mapping[str, np.ndarray], dynamic: Collection[str] = ()) -> None:
        """Offer every sample of ``batch`` to the reservoir: an array ``[N, ...]``, or a model's inputs by
        name, ``[N, ...]`` each (``dynamic``: those of a dynamic length, kept row by row)."""
        bare = not isinstance(batch, Mapping)
        arrays = {_BARE: np.asarray(batch)} if not isinstance(batch, Mapping) else dict(batch.items())
        if any(a.ndim == 0 for a in arrays.values()):
            return
        n = len(next(iter(arrays.values()))) if arrays else 0
        if n == 0:
            return
        layout = tuple((k, a.dtype, None if k in dynamic else tuple(a.shape[1:])) for k, a in arrays.items())
        keep = self._small_enough(arrays, layout, n)
        dropped = 0
        if keep is not None:
            arrays = {k: a[keep] for k, a in arrays.items()}
            dropped, n = n - len(keep), len(keep)
        self._add_parts(layout, bare, [(arrays, n)], dropped)

    def add_many(self, batches: Sequence[Mapping[str, np.ndarray]], dynamic: Collection[str] = ()) -> None:
        """:meth:`add` of every batch of named inputs in turn (the same samples kept, for the same random
        draws), under one lock and with one draw when they share a layout of fixed sizes."""
        parts: list[tuple[dict[str, np.ndarray], int]] = []
        layout: tuple[_Slot, ...] | None = None
        for batch in batches:
            arrays = dict(batch.items())
            if not arrays or any(a.ndim == 0 for a in arrays.values()):
                continue
            mine = tuple((k, a.dtype, None if k in dynamic else tuple(a.shape[1:])) for k, a in arrays.items())
            if layout is None:
                layout = mine
                variable = any(shape is None or dtype.kind == "O" for _, dtype, shape in mine)
            else:
                variable = mine != layout  # the first layout, checked above, holds fixed sizes
            if variable:
                for b in batches:  # sizes that vary per sample, or batches of another layout: one by one
                    self.add(b, dynamic)
                return
            n = len(next(iter(arrays.values())))
            if n:
                parts.append((arrays, n))
        if layout is not None and parts:
            self._add_parts(layout, False, parts, 0)

    def _add_parts(
        self, layout: tuple[_Slot, ...], bare: bool, parts: list[tuple[dict[str, np.ndarray], int]], dropped: int
    ) -> None:
        """Offer the rows of ``parts`` (arrays of ``layout``, with their row counts), one part after the other."""
        now = self._clock()
        with self._lock:
            self.too_large += dropped
            if not any(n for _, n in parts):
                return
            if layout != self._layout or bare != self._bare:
                self._layout, self._bare = layout, bare
                self._current, self._previous = None, None
            if self._current is None:
                self._current = self._new(now)
            elif self.horizon_seconds is not None and now - self._current.started >= self.horizon_seconds:
                if self._current.filled >= self.min_samples or self._previous is None:
                    self._previous = self._current
                self._current = self._new(now)
            self._offer(self._current, parts)

    def _small_enough(self, arrays: dict[str, np.ndarray], layout: tuple[_Slot, ...], n: int) -> np.ndarray | None:
        """The rows within ``max_sample_bytes`` (``None``: all of them, or nothing of a variable size)."""
        sizes = np.zeros(n, dtype=np.int64)
        variable = False
        for name, dtype, shape in layout:
            a = arrays[name]
            if dtype.kind == "O":
                variable = True
                flat = a.reshape(n, -1)
                sizes += np.fromiter(
                    (sum(len(v) if isinstance(v, str | bytes) else 0 for v in row) for row in flat),
                    dtype=np.int64,
                    count=n,
                )
            elif shape is None:
                variable = True
                sizes += a[0].nbytes
        if not variable or int(sizes.max()) <= self.max_sample_bytes:
            return None
        return np.flatnonzero(sizes <= self.max_sample_bytes)

    def _new(self, now: float) -> _Generation:
        assert self._layout is not None
        k = self.capacity
        items = {
            name: np.empty(k, dtype=object) if shape is None else np.empty((k, *shape), dtype=dtype)
            for name, dtype, shape in self._layout
        }
        return _Generation(now, 0, items, k)

    def _offer(self, gen: _Generation, parts: list[tuple[dict[str, np.ndarray], int]]) -> None:
        """Algorithm R over the rows of ``parts``, one after the other, in one draw."""
        k = self.capacity
        t0 = gen.seen
        n = sum(size for _, size in parts)
        # Fill phase: items t < k go to slot t.
        fill = max(0, min(n, k - t0))
        slots, rows = np.arange(t0, t0 + fill), np.arange(fill)
        rest = n - fill
        if rest > 0:
            # Item t (t >= k) draws j uniform in [0, t]; it replaces slot j when j < k. Sequential
            # order matters only when two items pick the same slot: the later one wins, as in the loop.
            t = np.arange(t0 + fill, t0 + n, dtype=np.int64)
            j = (self._rng.random(rest) * (t + 1)).astype(np.int64)
            hit = np.flatnonzero(j < k)
            slots, rows = np.concatenate([slots, j[hit]]), np.concatenate([rows, fill + hit])
        if len(parts) == 1:
            if len(rows):
                self._put(gen, slots, rows, parts[0][0])
        else:  # rows ascend: each part's are one slice, put in the parts' order (a later part wins a slot)
            starts = [0, *itertools.accumulate(size for _, size in parts)]
            bounds = np.searchsorted(rows, starts).tolist()  # one search for every part's slice
            for i, (arrays, _) in enumerate(parts):
                a, b = bounds[i], bounds[i + 1]
                if b > a:
                    self._put(gen, slots[a:b], rows[a:b] - starts[i], arrays)
        gen.seen = t0 + n

    def _put(self, gen: _Generation, slots: np.ndarray, rows: np.ndarray, arrays: dict[str, np.ndarray]) -> None:
        assert self._layout is not None
        for name, _, shape in self._layout:
            items, src = gen.items[name], arrays[name]
            if shape is None:  # rows of a dynamic length, each kept as it came (padding included)
                for slot, row in zip(slots.tolist(), rows.tolist(), strict=True):
                    items[slot] = np.array(src[row], copy=True)
            else:
                items[slots] = src[rows]

    # -- reading ------------------------------------------------------------------------------
    def sample(self) -> np.ndarray | dict[str, np.ndarray] | None:
        """A copy of the newest generation with at least ``min_samples`` inputs (``None`` if none): an
        array when arrays were added, else the inputs by name (rows of a dynamic length padded with zeros)."""
        with self._lock:
            for gen in (self._current, self._previous):
                if gen is not None and gen.filled >= self.min_samples:
                    assert self._layout is not None
                    out = {
                        name: _read(gen.items[name], gen.filled, dtype, shape) for name, dtype, shape in self._layout
                    }
                    return out[_BARE] if self._bare else out
            return None

    def __len__(self) -> int:
        with self._lock:
            return 0 if self._current is None else self._current.filled

    @property
    def seen(self) -> int:
        """Inputs offered to the current generation."""
        with self._lock:
            return 0 if self._current is None else self._current.seen

    def reset(self) -> None:
        with self._lock:
            self._current, self._previous = None, None


def _read(items: np.ndarray, filled: int, dtype: np.dtype, shape: tuple[int, ...] | None) -> np.ndarray:
    """The first ``filled`` samples of one input: a copy, or rows of a dynamic length padded with zeros."""
    if shape is not None:
        return items[:filled].copy()
    rows = list(items[:filled])
    width = tuple(max(r.shape[d] for r in rows) for d in range(rows[0].ndim))
    out = np.zeros((filled, *width), dtype=dtype)
    for i, r in enumerate(rows):
        out[i][tuple(slice(0, d) for d in r.shape)] = r
    return out
