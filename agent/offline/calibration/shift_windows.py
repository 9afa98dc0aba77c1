"""Windows of held-out labeled rows under simulated shifts: the evidence the headline is chosen on.

A label-free estimator is right or wrong depending on the drift, and which drifts a deployment will
see is unknown at ``fit``. What the reference data *can* show is how each estimator behaves when the
mix of its rows changes. Every window here is a weighted resample (with replacement) of held-out rows,
so its true accuracy is known; the weights simulate the shifts a table or a model's inputs can show
without new inputs (importance weighting, as in covariate-shift adaptation: Shimodaira 2000; Sugiyama
et al., "Covariate Shift Adaptation by Importance Weighted Cross Validation", JMLR 2007, §2):

``clean``
    uniform: the reference as it is (sampling noise only);
``label``
    the class prior moved toward a random one (label shift: rows reweighted by ``π_new(y) / π(y)``);
``feature``
    exponential tilting along one coordinate of the rows' features, ``w ∝ exp(β·z_j)``: covariate
    shift toward one end of a feature;
``direction``
    the same along a random direction of the standardised features (several features at once);
``subpopulation``
    a share of the window drawn only from the rows beyond a quantile of one coordinate, the rest
    uniform (a segment of the population growing, as a marketing campaign or a new channel would);
``confidence``
    tilting along the model's top-class probability (traffic getting easier or harder for the model);
``mixture``
    a covariate tilt and a class-prior change together;
``corruption``
    model bundles only: rows of the corrupted copies of the held-out rows (the corruptions
    ``shift_aware`` is calibrated with, at the same strengths, on other rows), one copy or a mixture.

Kinds take turns, so every kind holds the same number of windows. Strengths are drawn from fixed,
generic ranges (in standard deviations of a coordinate, or shares of the window), never from any
benchmark's scenario.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.estimation.statistics.reference import leading_components

#: Every kind of simulated window, in the order they take turns (``corruption`` only with corrupted sets).
KINDS: tuple[str, ...] = (
    "clean",
    "label",
    "feature",
    "direction",
    "subpopulation",
    "confidence",
    "mixture",
    "corruption",
)
#: Range of the tilt ``β`` (per standard deviation of the coordinate tilted along).
TILT = (0.25, 1.5)
#: Features above which the tilts follow principal components instead of single columns.
MAX_COLUMNS = 16
#: Principal components tilted along when the features are wider than :data:`MAX_COLUMNS`.
COMPONENTS = 8


@dataclass(frozen=True)
class Window:
    """One simulated window: its kind and its rows, as ``(set, row indices)`` parts (set 0: the clean
    rows; set ``k > 0``: the ``k``-th corrupted copy of the same rows)."""

    kind: str
    parts: tuple[tuple[int, np.ndarray], ...]

    @property
    def size(self) -> int:
        return int(sum(len(i) for _, i in self.parts))


def tilt_coordinates(features: np.ndarray | None) -> np.ndarray:
    """Standardised coordinates of the rows to tilt along ``[N, k]``: the feature columns themselves
    when there are at most :data:`MAX_COLUMNS` (a table's columns mean something to its users), else
    the rows' :data:`COMPONENTS` leading principal components (a pixel or an embedding unit does not).
    Constant columns are dropped; no features gives ``[N, 0]``."""
    if features is None:
        return np.zeros((0, 0))
    f = np.asarray(features, dtype=np.float64).reshape(len(features), -1)
    f = np.where(np.isfinite(f), f, 0.0)
    std = f.std(axis=0)
    keep = std > 1e-12
    z = (f[:, keep] - f[:, keep].mean(axis=0)) / std[keep]
    if z.shape[1] <= MAX_COLUMNS:
        return z
    pcs = z @ leading_components(z, COMPONENTS).T
    return pcs / np.maximum(pcs.std(axis=0), 1e-12)


def _standardised(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return (v - v.mean()) / max(float(v.std()), 1e-12)


class WindowPlanner:
    """Draws the simulated windows of one set of held-out rows (see the module docstring).

    ``coords``: the rows' tilt coordinates (:func:`tilt_coordinates`); ``confidences``: their top-class
    probabilities; ``classes``: their true classes; ``n_shifted``: how many corrupted copies of the
    rows exist (0: no ``corruption`` windows)."""

    def __init__(self, coords: np.ndarray, confidences: np.ndarray, classes: np.ndarray, n_shifted: int = 0) -> None:
        self.y = np.asarray(classes, dtype=np.int64).reshape(-1)
        n = len(self.y)
        self.coords = np.asarray(coords, dtype=np.float64).reshape(n, -1) if coords.size else np.zeros((n, 0))
        self.zconf = _standardised(confidences) if n else np.zeros(0)
        self.n_shifted = n_shifted
        k = int(self.y.max()) + 1 if n else 1
        self.prior = np.bincount(self.y, minlength=k) / max(n, 1)
        self.kinds = tuple(
            kind
            for kind in KINDS
            if not (kind in ("feature", "direction", "subpopulation") and self.coords.shape[1] == 0)
            and not (kind == "corruption" and n_shifted == 0)
            and not (kind in ("label", "mixture") and np.count_nonzero(self.prior) < 2)
        )

    def plan(self, rows: np.ndarray, n_windows: int, size: int, rng: np.random.Generator) -> list[Window]:
        """``n_windows`` windows of ``size`` rows drawn from ``rows`` (indices into the held-out rows),
        the kinds taking turns."""
        rows = np.asarray(rows, dtype=np.int64)
        return [self.window(self.kinds[i % len(self.kinds)], rows, size, rng) for i in range(n_windows)]

    def window(self, kind: str, rows: np.ndarray, size: int, rng: np.random.Generator) -> Window:
        """One window of ``kind`` of ``size`` rows drawn from ``rows``."""
        if kind == "corruption":
            return self._corrupted(rows, size, rng)
        if kind == "subpopulation":
            return Window(kind, ((0, self._subpopulation(rows, size, rng)),))
        logw = np.zeros(len(rows))
        if kind in ("label", "mixture"):
            logw += self._label_log_weights(rows, rng)
        if kind in ("feature", "mixture"):
            logw += self._tilt(self.coords[rows, rng.integers(self.coords.shape[1])], rng) if self.coords.size else 0.0
        if kind == "direction":
            u = rng.normal(size=self.coords.shape[1])
            logw += self._tilt(_standardised(self.coords[rows] @ (u / np.linalg.norm(u))), rng)
        if kind == "confidence":
            logw += self._tilt(self.zconf[rows], rng)
        return Window(kind, ((0, _draw(rows, logw, size, rng)),))

    @staticmethod
    def _tilt(z: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Log-weights of an exponential tilt along ``z``, of random direction and strength."""
        return float(rng.choice([-1.0, 1.0]) * rng.uniform(*TILT)) * z

    def _label_log_weights(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``log π_new(y) − log π(y)`` with ``π_new`` a random mixture of the prior and a Dirichlet(1) draw."""
        k = len(self.prior)
        lam = float(rng.uniform(0.3, 1.0))
        new = (1.0 - lam) * self.prior + lam * rng.dirichlet(np.ones(k))
        ratio = np.divide(new, self.prior, out=np.zeros(k), where=self.prior > 0)
        return np.log(np.maximum(ratio[self.y[rows]], 1e-12))

    def _subpopulation(self, rows: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
        """A random share of the window from the rows beyond a random quantile of one coordinate."""
        z = self.coords[rows, rng.integers(self.coords.shape[1])]
        q = float(rng.uniform(0.5, 0.9))
        inside = rows[z >= np.quantile(z, q)] if rng.uniform() < 0.5 else rows[z <= np.quantile(z, 1.0 - q)]
        m = int(rng.binomial(size, float(rng.uniform(0.3, 1.0))))
        return np.concatenate([rng.choice(inside if len(inside) else rows, m), rng.choice(rows, size - m)])

    def _corrupted(self, rows: np.ndarray, size: int, rng: np.random.Generator) -> Window:
        """Rows of one corrupted copy, or of 2–3 copies (sometimes with clean rows) in random shares."""
        if rng.uniform() < 0.5:
            sets = [int(rng.integers(1, self.n_shifted + 1))]
        else:
            k = min(self.n_shifted, int(rng.integers(2, 4)))
            sets = [int(v) for v in rng.choice(np.arange(1, self.n_shifted + 1), k, replace=False)]
            if rng.uniform() < 0.3:
                sets.append(0)
        counts = rng.multinomial(size, rng.dirichlet(np.ones(len(sets))))
        return Window(
            "corruption", tuple((s, rng.choice(rows, int(c))) for s, c in zip(sets, counts, strict=True) if c)
        )


def _draw(rows: np.ndarray, logw: np.ndarray | float, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` rows drawn with replacement with probabilities ``∝ exp(logw)``."""
    lw = np.broadcast_to(np.asarray(logw, dtype=np.float64), rows.shape)
    p = np.exp(lw - lw.max())
    return rows[rng.choice(len(rows), size, p=p / p.sum())]
