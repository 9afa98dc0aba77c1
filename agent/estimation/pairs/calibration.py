"""What a challenger's bundle knows about its pair with a champion: the disagreement model, the window
correction and the model-error term of the paired difference (:mod:`agent.estimation.pairs.paired`).

Two versions of a model, a champion A and a challenger B, predict the same inputs. On a disagreement (their
predicted classes differ) at most one of them is right; the *disagreement model* gives each disagreement
``q_A = P(A right | x, disagree)`` and ``q_B`` (``q_A + q_B ≤ 1``): a three-outcome multinomial logistic
regression ("neither right" the reference outcome) on :func:`pair_features` — each model's top-class
probability and how far each concedes the other's answer. Its ten coefficients, the four of the *window
correction* (a linear map of ``[1, ḡ, p, ḡp]`` to a window's mean ``d`` over its disagreements: what the
per-row model cannot see, e.g. an advantage that shrinks as both models fail more) and the model-error term
per disagreement-rate bin are fitted at the challenger's ``fit`` (:mod:`agent.offline.calibration.pairs.fitting`) and
stored in its bundle; nothing here runs a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Probabilities are clipped to [EPS, 1 − EPS] before their logit.
EPS = 1e-6
#: Edges of the disagreement-rate bins of the model-error term (a window's share of disagreements).
P_EDGES: tuple[float, ...] = (0.05, 0.15, 0.3)
#: Width of :func:`pair_features` (the constant and four logits).
N_FEATURES = 5


def _logit(p: np.ndarray) -> np.ndarray:
    c = np.clip(np.asarray(p, dtype=np.float64), EPS, 1.0 - EPS)
    return np.asarray(np.log(c / (1.0 - c)))


def _rows_of(probabilities: np.ndarray) -> np.ndarray:
    """Probabilities as ``[N, K]`` (a binary model's single column as ``[N, 1]``)."""
    p = np.asarray(probabilities, dtype=np.float64)
    return p if p.ndim == 2 else p.reshape(len(p), -1)


def predicted_of(probabilities: np.ndarray, predicted: np.ndarray | None) -> np.ndarray:
    """The predicted classes given (a binary model's decision threshold may differ from the most probable
    class), else the most probable ones."""
    if predicted is not None:
        return np.asarray(predicted, dtype=np.int64).reshape(-1)
    return np.asarray(_rows_of(probabilities).argmax(1), dtype=np.int64)


def pair_features(
    prob_a: np.ndarray, prob_b: np.ndarray, label_a: np.ndarray | None = None, label_b: np.ndarray | None = None
) -> np.ndarray:
    """Per prediction ``[1, logit c_A, logit c_B, logit x_A, logit x_B] / 10`` (the constant unscaled):
    ``c`` each model's probability of its predicted class (``label_a``, ``label_b``; the most probable when
    not given), ``x_A`` the champion's probability of the challenger's class and ``x_B`` the challenger's of
    the champion's (how far each model concedes the other's answer)."""
    pa, pb = _rows_of(prob_a), _rows_of(prob_b)
    la, lb = predicted_of(pa, label_a), predicted_of(pb, label_b)
    rows = np.arange(len(pa))
    cols = [pa[rows, la], pb[rows, lb], pa[rows, lb], pb[rows, la]]
    return np.column_stack([np.ones(len(pa)), *(_logit(c) / 10.0 for c in cols)])


def window_design(g_bar: np.ndarray | float, p: np.ndarray | float) -> np.ndarray:
    """``[1, ḡ, p, ḡ·p]`` per window: the window correction's inputs (the mean ``g = q_B − q_A`` over the
    window's disagreements, and their share of its predictions)."""
    g = np.atleast_1d(np.asarray(g_bar, dtype=np.float64))
    q = np.atleast_1d(np.asarray(p, dtype=np.float64))
    return np.column_stack([np.ones_like(g), g, q, g * q])


def _floats(raw: object, size: int, what: str) -> tuple[float, ...]:
    values = tuple(float(v) for v in raw) if isinstance(raw, (list, tuple)) else ()
    if len(values) != size or not all(np.isfinite(values)):
        raise ValueError(f"pair calibration: {what} must be {size} finite numbers")
    return values


@dataclass(frozen=True)
class DisagreementModel:
    """``P(A right)``, ``P(B right)`` on a disagreement: a multinomial logistic regression on
    :func:`pair_features`, "neither right" the reference outcome (2 × 5 coefficients)."""

    coef_a: tuple[float, ...]
    coef_b: tuple[float, ...]

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(q_A, q_B)`` of each row of ``features``."""
        za = features @ np.asarray(self.coef_a)
        zb = features @ np.asarray(self.coef_b)
        top = np.maximum(np.maximum(za, zb), 0.0)
        ea, eb, e0 = np.exp(za - top), np.exp(zb - top), np.exp(-top)
        total = ea + eb + e0
        return ea / total, eb / total

    def to_dict(self) -> dict[str, list[float]]:
        return {"coef_a": list(self.coef_a), "coef_b": list(self.coef_b)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DisagreementModel:
        return cls(_floats(d.get("coef_a"), N_FEATURES, "coef_a"), _floats(d.get("coef_b"), N_FEATURES, "coef_b"))


@dataclass(frozen=True)
class Disagreements:
    """The disagreements of a batch of paired predictions: their rows and each one's ``q_A``, ``q_B``."""

    rows: np.ndarray
    qa: np.ndarray
    qb: np.ndarray

    @property
    def g(self) -> np.ndarray:
        """``q_B − q_A``: the expected ``d = 1{B right} − 1{A right}`` of each disagreement."""
        return np.asarray(self.qb - self.qa)


@dataclass(frozen=True)
class PairCalibration:
    """What the challenger's bundle stores for the pair: the champion it was fitted against
    (``champion_sha256``; None: a champion known by a table's probability columns), the disagreement model,
    the window correction (:func:`window_design` coefficients), the model-error term per disagreement by
    bin of the disagreement rate (:data:`P_EDGES`) at the quantile ``level``, and what it was learnt from
    (``corrupted_sets``: 0 when no corrupted copy could be made, e.g. from a table: then the error term
    covers the clean split's windows only)."""

    model: DisagreementModel
    error: tuple[float, ...]
    window: tuple[float, ...] = (0.0, 1.0, 0.0, 0.0)
    champion_sha256: str | None = None
    level: float = 0.99
    corrupted_sets: int = 0
    #: validation rows the pair was calibrated on, and the share of them the two models disagree on
    rows: int = 0
    disagreement_rate: float = 0.0

    def corrected(self, g_bar: float, p: float) -> float:
        """The window's mean ``d`` over its disagreements, from their mean ``g`` and rate ``p``."""
        return float(np.clip(window_design(g_bar, p) @ np.asarray(self.window), -1.0, 1.0)[0])

    def model_error(self, p_dis: float) -> float:
        """The model-error term per disagreement of a window whose disagreement rate is ``p_dis``."""
        return float(self.error[int(np.searchsorted(np.asarray(P_EDGES), p_dis, side="right"))])

    def disagreements(
        self,
        prob_a: np.ndarray,
        prob_b: np.ndarray,
        label_a: np.ndarray | None = None,
        label_b: np.ndarray | None = None,
    ) -> Disagreements:
        """Where the champion's (``prob_a``, predicted ``label_a``) and the challenger's (``prob_b``,
        ``label_b``) predicted classes differ, with each disagreement's ``q_A`` and ``q_B`` (the predicted
        classes are the most probable ones when not given)."""
        pa, pb = _rows_of(prob_a), _rows_of(prob_b)
        la, lb = predicted_of(pa, label_a), predicted_of(pb, label_b)
        rows = np.flatnonzero(la != lb)
        if not len(rows):
            empty = np.zeros(0)
            return Disagreements(rows, empty, empty)
        qa, qb = self.model.predict(pair_features(pa[rows], pb[rows], la[rows], lb[rows]))
        return Disagreements(rows, qa, qb)

    def to_dict(self) -> dict[str, Any]:
        return {
            "champion_sha256": self.champion_sha256,
            "model": self.model.to_dict(),
            "window": list(self.window),
            "error": list(self.error),
            "p_edges": list(P_EDGES),
            "level": self.level,
            "corrupted_sets": self.corrupted_sets,
            "rows": self.rows,
            "disagreement_rate": self.disagreement_rate,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PairCalibration:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` naming what does not parse."""
        if list(d.get("p_edges") or []) != list(P_EDGES):
            raise ValueError(f"pair calibration: its disagreement-rate bins are not {list(P_EDGES)}: refit it")
        sha = d.get("champion_sha256")
        if sha is not None and not isinstance(sha, str):
            raise ValueError("pair calibration: champion_sha256 must be a digest or null")
        model = d.get("model")
        if not isinstance(model, Mapping):
            raise ValueError("pair calibration: no disagreement model")
        return cls(
            DisagreementModel.from_dict(model),
            _floats(d.get("error"), len(P_EDGES) + 1, "error"),
            _floats(d.get("window"), 4, "window"),
            sha,
            float(d.get("level", 0.99)),
            int(d.get("corrupted_sets", 0)),
            int(d.get("rows", 0)),
            float(d.get("disagreement_rate", 0.0)),
        )


def pair_of_bundle(pair: Mapping[str, Any] | None, champion_sha256: str | None) -> PairCalibration:
    """The comparison a challenger's bundle holds (its manifest's ``pair``), checked against the champion (its
    model's digest, when both know one); raises ``ValueError`` saying what is wrong and how to fit one."""
    if pair is None:
        raise ValueError(
            "it holds no comparison with a champion: refit it with `icos-agent fit ... --champion CHAMPION.onnx` "
            "(or --champion-proba-columns for a table)"
        )
    try:
        out = PairCalibration.from_dict(pair)
    except TypeError as exc:
        raise ValueError(f"pair calibration: {exc}") from None
    if out.champion_sha256 and champion_sha256 and out.champion_sha256 != champion_sha256:
        raise ValueError(
            f"it was fitted against champion {out.champion_sha256[:12]}, not this champion ({champion_sha256[:12]}): "
            "refit it with `icos-agent fit ... --champion` on this one"
        )
    return out
