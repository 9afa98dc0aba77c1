"""A bounded, uniform sample of recent live inputs for label-free audits (Algorithm R).

Vitter's Algorithm R ("Random sampling with a reservoir", ACM TOMS 11(1), 1985): the first ``k``
items fill the reservoir; item ``t`` (0-based, ``t >= k``) replaces a uniformly chosen slot with
probability ``k/(t+1)``. After any number of items every one of them is in the sample with the same
probability, and memory stays ``k`` inputs.

"Recent" is bounded by generations: the sample covers the inputs of the current generation; when
it is older than ``horizon_seconds`` a new generation starts, and the previous one is kept until the
new one holds ``min_samples`` inputs. :meth:`Reservoir.sample` returns the newest generation that is
large enough. Inputs of another shape than the first one (a reloaded model) start afresh.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Reservoir"]


@dataclass
class _Generation:
    started: float
    seen: int
    items: np.ndarray  # [k, *shape]

    @property
    def filled(self) -> int:
        return min(self.seen, len(self.items))


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
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.horizon_seconds = horizon_seconds
        self.min_samples = max(1, int(min_samples))
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._shape: tuple[int, ...] | None = None
        self._dtype: np.dtype | None = None
        self._current: _Generation | None = None
        self._previous: _Generation | None = None
        self._clock = clock

    # -- feeding ------------------------------------------------------------------------------
    def add(self, batch: np.ndarray) -> None:
        """Offer every row of ``batch`` (``[N, ...]``) to the sample."""
        x = np.asarray(batch)
        if x.ndim == 0 or len(x) == 0:
            return
        now = self._clock()
        with self._lock:
            shape, dtype = tuple(x.shape[1:]), x.dtype
            if shape != self._shape or dtype != self._dtype:
                self._shape, self._dtype = shape, dtype
                self._current, self._previous = None, None
            if self._current is None:
                self._current = self._new(now)
            elif self.horizon_seconds is not None and now - self._current.started >= self.horizon_seconds:
                if self._current.filled >= self.min_samples or self._previous is None:
                    self._previous = self._current
                self._current = self._new(now)
            self._offer(self._current, x)

    def _new(self, now: float) -> _Generation:
        assert self._shape is not None and self._dtype is not None
        return _Generation(now, 0, np.empty((self.capacity, *self._shape), dtype=self._dtype))

    def _offer(self, gen: _Generation, x: np.ndarray) -> None:
        k, n = self.capacity, len(x)
        t0 = gen.seen
        # Fill phase: items t < k go to slot t.
        fill = max(0, min(n, k - t0))
        if fill:
            gen.items[t0 : t0 + fill] = x[:fill]
        rest = n - fill
        if rest > 0:
            # Item t (t >= k) draws j uniform in [0, t]; it replaces slot j when j < k. Sequential
            # order matters only when two items pick the same slot: the later one wins, as in the loop.
            t = np.arange(t0 + fill, t0 + n, dtype=np.int64)
            j = (self._rng.random(rest) * (t + 1)).astype(np.int64)
            hit = np.flatnonzero(j < k)
            if len(hit):
                gen.items[j[hit]] = x[fill + hit]
        gen.seen = t0 + n

    # -- reading ------------------------------------------------------------------------------
    def sample(self) -> np.ndarray | None:
        """A copy of the newest generation with at least ``min_samples`` inputs (``None`` if none)."""
        with self._lock:
            for gen in (self._current, self._previous):
                if gen is not None and gen.filled >= self.min_samples:
                    return gen.items[: gen.filled].copy()
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
