"""The difference in accuracy of two model versions on the same inputs, from additive per-window sums.

A champion A and a challenger B predict the same ``N`` inputs. Where they agree both are right or both
wrong, so the difference of their accuracies comes from the ``D`` disagreements alone:

    Δ = acc(B) − acc(A) = (1/N) Σ_D d_i,   d_i = 1{B right} − 1{A right} ∈ {−1, 0, +1}.

**Label-free** (:func:`label_free`). The pair's disagreement model
(:class:`~agent.estimation.pairs.calibration.PairCalibration`) gives every disagreement ``q_A``, ``q_B`` and
``g = q_B − q_A``; with ``p = n_D / N`` and ``ḡ = Σ_D g / n_D``,

    ĝ = c₀ + c₁ ḡ + c₂ p + c₃ ḡ p   (the window correction),   Δ̂ = p · ĝ,
    interval  p · (ĝ ± sqrt(e(p)² + z² Σ_D [q_A + q_B − g²] / n_D²))  ∩  p · [−1, 1],

``Σ_D [q_A + q_B − g²]`` the variance of ``Σ_D d`` under the model (sampling) and ``e(p)`` the model-error
term, learnt at fit on windows of corruptions the model was not fitted on, at the 99% quantile: the 95%
interval is conservative where the model errs most. ``p · [−1, 1]`` (every disagreement won by A, or every
one by B) always holds. No disagreement: Δ = 0 exactly.

**With labels** (:func:`with_labels`). Agreements need no label (``d = 0``), so labels go to disagreements:
each drawn with a known probability ``π_i``; as the active form of :mod:`agent.estimation.estimators.active` with ``g``
the predictor,

    Δ̂ = (1/N) [Σ_D (a + b g_i) + Σ_labeled (d_i − a − b g_i) / π_i],
    variance (1/N²) [Σ_labeled (1 − π_i)/π_i² (d_i − a − b g_i)² + z²/2 · v̄ · ((1 − ḡ_w)² + (−1 − ḡ_w)²)],

``(a, b)`` the weighted least squares of ``d`` on ``g`` (``b`` clipped to [0, 1]), the last term ``z²/2``
pseudo-labels of each sign as ``active.py`` guards small samples: design-unbiased for the window's Δ
whatever the shift; ``π = 1`` for every disagreement gives Δ exactly. Clipped to ``p · [−1, 1]``.

Every quantity is a function of :class:`PairSums`, which add across windows and replicas (the label-free
part is exported per replica for the fleet evaluator; the labeled part is the agent's).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from agent.estimation.estimators.prediction_powered import WITH_LABELS
from agent.estimation.intervals import Z95
from agent.estimation.pairs.calibration import Disagreements, PairCalibration

#: The label-free paired difference (the label-assisted one, labels drawn on the disagreements, is named
#: :data:`~agent.estimation.estimators.prediction_powered.WITH_LABELS` as every label-assisted estimate is).
LABEL_FREE = "label_free"
#: The fields a replica exports (``icos_challenger_stat_total{stat}``); the labeled ones are the agent's.
EXPORTED = ("n", "n_dis", "qa_sum", "qb_sum", "g_sq_sum")
#: The exported fields that are counts (the others are sums of probabilities).
COUNTS = ("n", "n_dis")


@dataclass
class PairSums:
    """Additive statistics of a window of paired predictions (``+`` adds windows and replicas).

    ``n`` paired predictions, ``n_dis`` disagreements and over them Σq_A, Σq_B, Σg²; over the labeled
    disagreements (``π`` the probability each was drawn with, ``w = 1/π``, ``v = (1 − π)/π²``, ``d`` its
    outcome): their count and Σw, Σwd, Σwg, Σv, Σvg, Σvd, Σvd², Σvdg, Σvg² (``d² ≠ d`` here)."""

    n: int = 0
    n_dis: int = 0
    qa_sum: float = 0.0
    qb_sum: float = 0.0
    g_sq_sum: float = 0.0
    lab_m: int = 0
    lab_w: float = 0.0
    lab_wd: float = 0.0
    lab_wg: float = 0.0
    lab_v: float = 0.0
    lab_vg: float = 0.0
    lab_vd: float = 0.0
    lab_vdd: float = 0.0
    lab_vdg: float = 0.0
    lab_vgg: float = 0.0

    def __add__(self, other: PairSums) -> PairSums:
        return PairSums(*(getattr(self, f) + getattr(other, f) for f in _NAMES))

    def add_in_place(self, other: PairSums) -> None:
        for f in _NAMES:
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def copy(self) -> PairSums:
        return PairSums(*(getattr(self, f) for f in _NAMES))

    @property
    def agreement(self) -> float:
        return 1.0 - self.n_dis / self.n if self.n > 0 else 1.0

    @classmethod
    def of_disagreements(cls, n: int, dis: Disagreements) -> PairSums:
        """The label-free sums of ``n`` paired predictions with these disagreements."""
        g = dis.g
        return cls(int(n), len(dis.rows), float(dis.qa.sum()), float(dis.qb.sum()), float((g * g).sum()))

    @classmethod
    def of_window(
        cls,
        prob_a: np.ndarray,
        prob_b: np.ndarray,
        calibration: PairCalibration,
        label_a: np.ndarray | None = None,
        label_b: np.ndarray | None = None,
    ) -> PairSums:
        """The label-free sums of a window of paired probability vectors ``[N, K]`` (and predicted classes,
        the most probable ones when not given)."""
        return cls.of_disagreements(len(prob_a), calibration.disagreements(prob_a, prob_b, label_a, label_b))

    @classmethod
    def of_labeled(cls, g: np.ndarray, d: np.ndarray, pi: np.ndarray) -> PairSums:
        """The labeled sums of disagreements drawn with probabilities ``pi`` (in (0, 1]), their ``g`` and
        outcome ``d`` (everything else empty)."""
        g, d, pi = (np.asarray(a, dtype=np.float64).reshape(-1) for a in (g, d, pi))
        if not (len(g) == len(d) == len(pi)):
            raise ValueError(f"{len(g)} g values, {len(d)} outcomes and {len(pi)} draw probabilities")
        if len(pi) and not bool(((pi > 0) & (pi <= 1)).all()):
            raise ValueError("draw probabilities must lie in (0, 1]")
        w = 1.0 / pi
        v = (1.0 - pi) * w * w
        return cls(
            lab_m=len(d),
            lab_w=float(w.sum()),
            lab_wd=float((w * d).sum()),
            lab_wg=float((w * g).sum()),
            lab_v=float(v.sum()),
            lab_vg=float((v * g).sum()),
            lab_vd=float((v * d).sum()),
            lab_vdd=float((v * d * d).sum()),
            lab_vdg=float((v * d * g).sum()),
            lab_vgg=float((v * g * g).sum()),
        )

    def label_free_part(self) -> PairSums:
        """These sums without the labeled ones (what a replica exports)."""
        return PairSums(self.n, self.n_dis, self.qa_sum, self.qb_sum, self.g_sq_sum)

    def items(self) -> Iterator[tuple[str, float]]:
        """The exported sums by name (the ``stat`` label of ``icos_challenger_stat_total``)."""
        for f in EXPORTED:
            yield f, getattr(self, f)

    @classmethod
    def from_items(cls, items: Mapping[str, float]) -> PairSums:
        """The inverse of :meth:`items` (counts rounded: a sum of counter differences is exact only up to
        float rounding; unknown names are ignored)."""
        n, n_dis, qa, qb, g_sq = (items.get(f, 0.0) for f in EXPORTED)
        return cls(round(n), round(n_dis), float(qa), float(qb), float(g_sq))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PairSums:
        values: dict[str, Any] = {f.name: (int if f.type == "int" else float)(d.get(f.name, 0)) for f in _FIELDS}
        return cls(**values)


_FIELDS = fields(PairSums)
_NAMES = tuple(f.name for f in _FIELDS)


@dataclass(frozen=True)
class Difference:
    """Δ = acc(challenger) − acc(champion) with its 95% interval, the paired predictions behind it and the
    labeled disagreements (0: label-free)."""

    value: float
    lower: float
    upper: float
    n: int
    n_labels: int = 0

    def to_dict(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {"value": self.value, "lower": self.lower, "upper": self.upper, "n": self.n}
        if self.n_labels:
            out["n_labels"] = self.n_labels
        return out

    @property
    def decided(self) -> int:
        """+1: the challenger is better with 95% confidence (the interval above 0), −1: worse, 0: undecided."""
        return 1 if self.lower > 0 else -1 if self.upper < 0 else 0


def label_free(s: PairSums, calibration: PairCalibration, z: float = Z95) -> Difference | None:
    """The label-free paired difference (module docstring); None without paired predictions."""
    if s.n <= 0:
        return None
    if s.n_dis <= 0:
        return Difference(0.0, 0.0, 0.0, s.n)
    p = s.n_dis / s.n
    g_bar = calibration.corrected((s.qb_sum - s.qa_sum) / s.n_dis, p)
    var_mean = max(s.qa_sum + s.qb_sum - s.g_sq_sum, 0.0) / s.n_dis**2
    half = math.hypot(calibration.model_error(p), z * math.sqrt(var_mean))
    lo, hi = max(g_bar - half, -1.0), min(g_bar + half, 1.0)
    return Difference(p * g_bar, p * lo, p * hi, s.n)


def _tuned(s: PairSums) -> tuple[float, float]:
    """``(a, b)`` minimising ``Σ v (d − a − b g)²`` (``b`` clipped to [0, 1]); ``(0, 1)`` when the sample
    cannot determine them."""
    if s.lab_m < 3 or s.lab_v <= 1e-12:
        return 0.0, 1.0
    g_bar = s.lab_vg / s.lab_v
    sxx = s.lab_vgg - s.lab_v * g_bar * g_bar
    sxy = s.lab_vdg - g_bar * s.lab_vd
    b = min(max(sxy / sxx, 0.0), 1.0) if sxx > 1e-12 * max(s.lab_v, 1.0) else 0.0
    return (s.lab_vd - b * s.lab_vg) / s.lab_v, b


def with_labels(s: PairSums, z: float = Z95) -> Difference | None:
    """The label-assisted paired difference (module docstring); None without labeled disagreements."""
    if s.n <= 0 or s.lab_m <= 0:
        return None
    a, b = _tuned(s)
    total = a * s.n_dis + b * (s.qb_sum - s.qa_sum) + s.lab_wd - a * s.lab_w - b * s.lab_wg
    # Σ v (d − a − b g)²
    ss = s.lab_vdd - 2 * a * s.lab_vd - 2 * b * s.lab_vdg + a * a * s.lab_v + 2 * a * b * s.lab_vg + b * b * s.lab_vgg
    centre = a + b * (s.lab_wg / s.lab_w if s.lab_w > 0 else 0.0)
    pseudo = z * z / 2.0 * (s.lab_v / s.lab_m) * ((1.0 - centre) ** 2 + (-1.0 - centre) ** 2)
    half = z * math.sqrt(max(ss, 0.0) + pseudo) / s.n
    bound = s.n_dis / s.n
    value = min(max(total / s.n, -bound), bound)
    return Difference(value, max(total / s.n - half, -bound), min(total / s.n + half, bound), s.n, s.lab_m)


def differences(s: PairSums, calibration: PairCalibration) -> dict[str, Difference]:
    """Every paired difference a window has: the label-free one, and the label-assisted one when the window
    holds labeled disagreements."""
    out: dict[str, Difference] = {}
    for name, e in ((LABEL_FREE, label_free(s, calibration)), (WITH_LABELS, with_labels(s))):
        if e is not None:
            out[name] = e
    return out


def best_of(found: Mapping[str, Difference]) -> tuple[str, Difference] | None:
    """The difference a window reports first: the label-assisted one when the window has it (it is
    design-unbiased whatever the shift), else the label-free one."""
    for name in (WITH_LABELS, LABEL_FREE):
        if name in found:
            return name, found[name]
    return None
