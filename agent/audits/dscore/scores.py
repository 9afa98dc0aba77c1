"""D-Score's scores (paper §IV): feature distribution f̃ (eq. 1), attention distribution ã (eq. 2),
v_fitness (eq. 3), v_robust (eq. 4), the bound g(n) (eq. 5), D-Score (eq. 6) and the augmentation
probability p and padded size d (eq. 7), from the accuracies of the variants and translations."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from agent.audits.report import AuditError

#: A 1-D sequence of numbers: a list, tuple or numpy array.
Floats = Sequence[float] | np.ndarray


def _grid_n(count: int, what: str) -> int:
    n = math.isqrt(count)
    if n < 1 or n * n != count:
        raise AuditError(f"{what} must hold n² values for an n×n grid, got {count}")
    return n


def feature_distribution(base_accuracy: float, variant_accuracies: Floats) -> tuple[np.ndarray, bool]:
    """Eq. 1: ``f̃_i = max(f_b − f_i, 0) / Σ_j max(f_b − f_j, 0)``.

    Returns the distribution and whether it was degenerate: when no variant is worse than the
    base model the denominator is 0 and eq. 1 is undefined; we then return the uniform
    distribution ``1/n²`` (no region carries more of the features than another) and ``True``.
    """
    f = np.asarray(variant_accuracies, dtype=np.float64)
    drops = np.maximum(float(base_accuracy) - f, 0.0)
    total = float(drops.sum())
    if total <= 0.0:
        return np.full(len(f), 1.0 / len(f)), True
    return drops / total, False


def attention_distribution(translated_accuracies: Floats) -> tuple[np.ndarray, bool]:
    """Eq. 2: ``ã_i = a_i / Σ_j a_j``; uniform (and ``True``) when every ``a_i`` is 0."""
    a = np.asarray(translated_accuracies, dtype=np.float64)
    total = float(a.sum())
    if total <= 0.0:
        return np.full(len(a), 1.0 / len(a)), True
    return a / total, False


def g_bound(n: int, n_classes: int) -> float:
    """Eq. 5: ``g(n) = 2·sqrt(n² − 1)/n³ + (1/n)·(c − 1)/c``, the upper bound of v_robust."""
    if n < 1 or n_classes < 2:
        raise AuditError(f"g(n) needs n >= 1 and at least 2 classes (n={n}, c={n_classes})")
    return 2.0 * math.sqrt(n * n - 1) / n**3 + (1.0 / n) * (n_classes - 1) / n_classes


@dataclass(frozen=True)
class DScoreResult:
    """All quantities of §IV for one model and data set (accuracies as fractions in [0, 1]).

    ``robustness_terms`` are the three square-root terms of eq. 4, each already divided by n².
    ``feature_uniform_fallback`` / ``attention_uniform_fallback`` flag the degenerate cases of
    eqs. 1-2 (see :func:`feature_distribution`). ``augmentation_probability`` is eq. 7's p, clipped
    to [0, 1] (the paper's bound assumes every accuracy is at least 1/c; ``p_unclipped`` keeps the
    raw ratio). ``padded_size_factor`` is ``d / d̂ = 1 + p``.
    """

    n: int
    n_classes: int
    base_accuracy: float
    variant_accuracies: tuple[float, ...] | None
    translated_accuracies: tuple[float, ...]
    feature_distribution: tuple[float, ...]
    attention_distribution: tuple[float, ...]
    fitness: float
    robustness: float
    robustness_terms: tuple[float, float, float]
    g: float
    dscore: float
    augmentation_probability: float
    p_unclipped: float
    padded_size_factor: float
    feature_uniform_fallback: bool
    attention_uniform_fallback: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score_from_distributions(
    base_accuracy: float,
    feature_dist: Floats,
    translated_accuracies: Floats,
    n_classes: int,
    *,
    variant_accuracies: Floats | None = None,
    feature_uniform_fallback: bool = False,
) -> DScoreResult:
    """Eqs. 2-7 from an already normalised feature distribution f̃ (as Table VI reports it).

    ``f_i`` in eqs. 3-4 is the normalised f̃_i: with it, Table VI's rows (a_i, f̃_i, accuracy)
    give the table's v_robust, v_fitness and D-Score.

    * eq. 3: ``v_fitness = â − (1/n²)·sqrt(Σ (f̃_i − ã_i)²)``
    * eq. 4: ``v_robust = (1/n²)·(sqrt(Σ (f̃_i − 1/n²)²) + sqrt(Σ (ã_i − 1/n²)²) + sqrt(Σ (a_i − â)²))``
    * eq. 6: ``D-Score = v_fitness − v_robust``; eq. 7: ``p = v_robust / g(n)``, ``d = (1 + p)·d̂``.
    """
    f = np.asarray(feature_dist, dtype=np.float64)
    a = np.asarray(translated_accuracies, dtype=np.float64)
    if f.shape != a.shape or f.ndim != 1:
        raise AuditError(f"feature distribution ({f.shape}) and translated accuracies ({a.shape}) differ in size")
    n = _grid_n(len(f), "the feature distribution")
    n2 = n * n
    a_hat = float(base_accuracy)
    a_tilde, att_fallback = attention_distribution(a)
    fitness = a_hat - math.sqrt(float(np.sum((f - a_tilde) ** 2))) / n2
    t1 = math.sqrt(float(np.sum((f - 1.0 / n2) ** 2))) / n2
    t2 = math.sqrt(float(np.sum((a_tilde - 1.0 / n2) ** 2))) / n2
    t3 = math.sqrt(float(np.sum((a - a_hat) ** 2))) / n2
    robust = t1 + t2 + t3
    g = g_bound(n, n_classes)
    p_raw = robust / g
    p = min(max(p_raw, 0.0), 1.0)
    return DScoreResult(
        n=n,
        n_classes=int(n_classes),
        base_accuracy=a_hat,
        variant_accuracies=tuple(float(v) for v in variant_accuracies) if variant_accuracies is not None else None,
        translated_accuracies=tuple(float(v) for v in a),
        feature_distribution=tuple(float(v) for v in f),
        attention_distribution=tuple(float(v) for v in a_tilde),
        fitness=fitness,
        robustness=robust,
        robustness_terms=(t1, t2, t3),
        g=g,
        dscore=fitness - robust,
        augmentation_probability=p,
        p_unclipped=p_raw,
        padded_size_factor=1.0 + p,
        feature_uniform_fallback=feature_uniform_fallback,
        attention_uniform_fallback=att_fallback,
    )


def score(
    base_accuracy: float,
    variant_accuracies: Floats,
    translated_accuracies: Floats,
    n_classes: int,
) -> DScoreResult:
    """Eqs. 1-7 from raw accuracies: ``f_b`` (= â), the ``n²`` variant accuracies ``f_i`` and the
    ``n²`` translated-set accuracies ``a_i`` (all fractions in [0, 1])."""
    if len(variant_accuracies) != len(translated_accuracies):
        raise AuditError(
            f"{len(variant_accuracies)} variant accuracies but {len(translated_accuracies)} translated accuracies"
        )
    f_tilde, fallback = feature_distribution(base_accuracy, variant_accuracies)
    return score_from_distributions(
        base_accuracy,
        f_tilde,
        translated_accuracies,
        n_classes,
        variant_accuracies=variant_accuracies,
        feature_uniform_fallback=fallback,
    )
