"""The flag "this number may be wrong": whether a window's headline is off by more than :data:`TOLERANCE`,
predicted from label-free evidence, and how far its interval must widen to stay honest where it may be.

**Evidence** (:class:`WindowEvidence`, every entry from the window's additive statistics and its
estimates; :data:`FEATURES` turns it into the model's inputs, each naming the reason it gives):

``log_distance`` → ``outside_calibrated_range``
    the log of the trust distance (:mod:`agent.estimation.estimators.trust`: how far the window lies from the
    windows ``shift_aware`` was calibrated on); only for bundles fitted with the model;
``log_shift`` → ``confidence_shifted`` / ``oracle_verdicts_shifted`` / ``inputs_unlike_reference``
    ``log(1 + effect)`` of the class-adjusted test (:mod:`agent.estimation.flag.class_mix`): how far the
    window moved beyond what its own mix of predicted classes explains, named by the group of
    quantities that moved most;
``disagreement`` → ``estimators_disagree``
    the spread (largest minus smallest) of the headline and the confidence estimators calibrated on
    the split;
``drop`` → ``estimated_drop_large``
    how far the headline lies below the calibration split's accuracy (0 above it);
``small_window`` → ``small_window``
    ``1/√n``;
``inputs_beyond_confidence`` → ``inputs_unlike_reference``
    how far the inputs moved beyond what the model's confidence did (:func:`inputs_beyond_confidence`): the
    estimates read a drop mostly from the confidence, so inputs unlike the reference on which the model stays
    confident are where it can be confidently wrong and the headline cannot see the drop.

**Model** (:class:`FlagModel`, fitted at ``fit`` by :mod:`agent.offline.calibration.flag.fitting` on
windows of corruption kinds the estimators were fitted without): a logistic regression on the
standardised evidence with every coefficient at least 0 (more evidence never lowers the risk, and
every term that raises the flag names a reason), whose score is calibrated to the probability that
the headline is off by more than :data:`TOLERANCE` by a step function (isotonic regression). The
flag is raised where the score reaches :attr:`FlagModel.threshold` — the highest score at which the
fit's windows left down hold at most :data:`RISK` of such misses —, the window shows evidence of a
covariate shift (the class-adjusted ``z`` above :attr:`FlagModel.z_gate`, the 99% quantile of the
fit's clean windows, or a trust distance above 1) and it is not a change of class mix alone (those
keep the flag down and read ``class_mix_changed``: confidence-based estimates hold under label shift).
A change of class mix explains a window only where the class-adjusted residual stays within noise (``z`` at
most the larger of the gate and :data:`~agent.estimation.flag.class_mix.MIX_Z`): a class mix that moved while the
inputs moved beyond what that mix explains is a covariate shift that moved the predictions (a fifth of the
digits inverted moves both), and the score decides. Models fitted without ``inputs_beyond_confidence`` had no
evidence of that in the score and raise the flag there whatever the score (:func:`mix_unexplained`,
:func:`raises_on_unexplained_mix`).

Where it is raised, the headline's interval widens to ``[h − below, h + above]`` (never narrower than its
own), ``below``/``above`` the 95% quantiles of how far the fit's flagged windows' truth lay below and
above their headline, per band of predicted probability (:data:`P_EDGES`).

A new kind of evidence (for example, once windows keep per-segment sums, the largest share of the
estimated drop one segment carries) is one field of :class:`WindowEvidence` and one entry of
:data:`FEATURES`; a bundle's model names the features it was fitted with, so older bundles keep theirs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.estimation.flag.class_mix import MIX_Z, ClassReference, MixTest

#: The headline is wrong beyond this absolute error (accuracy points).
TOLERANCE = 0.05
#: The share of misses the flag may leave among the fit's windows it keeps down.
RISK = 0.05
#: Bands of the predicted probability of a miss the widened interval is measured in.
P_EDGES: tuple[float, ...] = (0.2, 0.5)
#: A feature names a reason of a raised flag when its term (coefficient × standardised value) exceeds this.
REASON_TERM = 0.5

#: The reason a change of class mix alone gives (the flag stays down).
CLASS_MIX_CHANGED = "class_mix_changed"
#: The reason a calibration split of too few wrong predictions gives (its intervals are floored by it).
FEW_CALIBRATION_ERRORS = "few_calibration_errors"
#: The reason of a window outside the calibrated range (also old bundles' only reason).
OUTSIDE_CALIBRATED_RANGE = "outside_calibrated_range"


@dataclass(frozen=True)
class WindowEvidence:
    """What the flag reads of one window: its size, its headline, the trust distance (None without
    ``shift_aware``'s trust model), the class-adjusted test (None without a class reference), the spread
    of the estimators and how far the headline lies below the calibration accuracy."""

    n: int
    headline: float
    distance: float | None
    mix: MixTest | None
    disagreement: float
    drop: float


#: The groups of the class-adjusted test :func:`inputs_beyond_confidence` compares, and its feature's name.
INPUTS_GROUP, CONFIDENCE_GROUP = "inputs_unlike_reference", "confidence_shifted"
INPUTS_BEYOND_CONFIDENCE = "inputs_beyond_confidence"


def inputs_beyond_confidence(mix: MixTest | None) -> float | None:
    """``log(1 + z_inputs) − log(1 + z_confidence)``, at least 0: how far the inputs moved (PCA error, TDI
    coverage and agreement) beyond the model's confidence. Each group's class-adjusted ``z`` is in units of its
    own sampling noise, so a clean window gives about 0 and a clear shift about the log of the ratio of the two
    moves whatever the window's size. A shift the confidence follows (rotated or noisy images the model grows
    unsure of) gives about 0; a share of the digits inverted, on which the model stays confident, gives the
    most. None where the window holds no per-sample inputs (no inputs group)."""
    groups = mix.groups if mix is not None else {}
    if INPUTS_GROUP not in groups or CONFIDENCE_GROUP not in groups:
        return None
    return max(math.log1p(groups[INPUTS_GROUP]) - math.log1p(groups[CONFIDENCE_GROUP]), 0.0)


@dataclass(frozen=True)
class Feature:
    """One input of the flag: its value on a window's evidence (None: the window cannot tell, the term is
    then 0) and the reason it names (None: named by the class-adjusted test's largest group)."""

    value: Callable[[WindowEvidence], float | None]
    reason: str | None


#: The flag's inputs by name, in order (the one place a kind of evidence is added).
FEATURES: dict[str, Feature] = {
    "log_distance": Feature(
        lambda e: None if e.distance is None else math.log(max(e.distance, 1e-3)), OUTSIDE_CALIBRATED_RANGE
    ),
    "log_shift": Feature(lambda e: None if e.mix is None else math.log1p(e.mix.effect), None),
    "disagreement": Feature(lambda e: e.disagreement, "estimators_disagree"),
    "drop": Feature(lambda e: e.drop, "estimated_drop_large"),
    "small_window": Feature(lambda e: 1.0 / math.sqrt(max(e.n, 1)), "small_window"),
    INPUTS_BEYOND_CONFIDENCE: Feature(lambda e: inputs_beyond_confidence(e.mix), INPUTS_GROUP),
}
#: The features of a bundle fitted with the model, and of one without ``shift_aware`` (no trust distance).
MODEL_FEATURES: tuple[str, ...] = tuple(FEATURES)
TABLE_FEATURES: tuple[str, ...] = tuple(f for f in FEATURES if f != "log_distance")
#: Every reason ``trust.reasons`` may hold (a bounded set: the metrics' ``reason`` label).
REASONS: tuple[str, ...] = (
    OUTSIDE_CALIBRATED_RANGE,
    "confidence_shifted",
    "oracle_verdicts_shifted",
    "inputs_unlike_reference",
    "estimators_disagree",
    "estimated_drop_large",
    "small_window",
    CLASS_MIX_CHANGED,
    FEW_CALIBRATION_ERRORS,
)


def feature_row(evidence: WindowEvidence, names: Sequence[str]) -> list[float | None]:
    """The values of ``names`` on one window's evidence."""
    return [FEATURES[n].value(evidence) for n in names]


def mix_unexplained(mix: MixTest | None, z_gate: float) -> bool:
    """The class mix moved beyond noise and the class-adjusted residual did too (``z`` above ``z_gate`` and
    above :data:`~agent.estimation.flag.class_mix.MIX_Z`): what the mix does not explain moved as well, so the
    change of mix is no reason to keep the flag down."""
    return mix is not None and mix.changed and mix.z > max(z_gate, MIX_Z)


def raises_on_unexplained_mix(features: Sequence[str]) -> bool:
    """Whether a model of ``features`` raises the flag on :func:`mix_unexplained` whatever its score: only one
    fitted without ``inputs_beyond_confidence``, whose score had no evidence of a model staying confident on
    moved inputs (the fifth of the digits inverted). With that evidence in the score, the rule would only
    overrule the model where it gives a miss a low probability; and its ``z`` grows with ``√n``, so on a large
    window any slight covariate shift that moves the class mix would trip it."""
    return INPUTS_BEYOND_CONFIDENCE not in features


@dataclass(frozen=True)
class Decision:
    """The flag on one window: ``raised``; the probability that the headline is off by more than the
    tolerance; the reasons (largest term first); the half-widths the interval widens to (0 when down)."""

    raised: bool
    probability: float
    reasons: tuple[str, ...]
    below: float = 0.0
    above: float = 0.0


@dataclass(frozen=True)
class FlagModel:
    """The fitted flag (see the module docstring; JSON through :meth:`to_dict`)."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    #: the score from which the flag is raised (inf: never)
    threshold: float
    #: no flag without evidence of a covariate shift: the class-adjusted z above this, or a trust distance above 1
    z_gate: float
    #: the isotonic calibration of the score: ``levels[i]`` for scores in ``[steps[i − 1], steps[i])``
    steps: tuple[float, ...]
    levels: tuple[float, ...]
    #: per band of :data:`P_EDGES`: 95% quantiles of the truth below and above the headline where raised
    below: tuple[float, ...]
    above: tuple[float, ...]
    reference: ClassReference
    tolerance: float = TOLERANCE
    risk: float = RISK
    #: the fit's windows the model was fitted on, and the headline estimator whose error it predicts
    windows: int = 0
    headline: str = ""

    def score(self, row: Sequence[float | None]) -> float:
        """The logistic regression's linear predictor (a missing value counts as the fit's mean)."""
        return self.intercept + sum(c * self._z(i, v) for i, (c, v) in enumerate(zip(self.coef, row, strict=True)))

    def _z(self, i: int, v: float | None) -> float:
        return 0.0 if v is None or not math.isfinite(v) else (v - self.mean[i]) / self.scale[i]

    def probability(self, score: float) -> float:
        """P(|headline − truth| > tolerance) at ``score``: the isotonic step it falls in."""
        return float(self.levels[int(np.searchsorted(np.asarray(self.steps), score, side="right"))])

    def decide(self, evidence: WindowEvidence) -> Decision:
        """The flag on one window (see the module docstring)."""
        row = feature_row(evidence, self.features)
        s = self.score(row)
        p = self.probability(s)
        mix = evidence.mix
        shifted = (mix is not None and mix.z > self.z_gate) or (evidence.distance or 0.0) > 1.0
        mix_only = mix is not None and mix.mix_only
        by_mix = raises_on_unexplained_mix(self.features) and mix_unexplained(mix, self.z_gate)
        raised = (s >= self.threshold or by_mix) and shifted and not mix_only
        reasons: list[str] = []
        if raised:
            terms = [(c * self._z(i, v), self.features[i]) for i, (c, v) in enumerate(zip(self.coef, row, strict=True))]
            terms.sort(key=lambda t: -t[0])
            named = [name for t, name in terms if t > REASON_TERM] or [name for t, name in terms[:1] if t > 0]
            reasons = [self._reason(name, mix) for name in named]
            if not reasons:  # raised by the intercept alone: name the shift that opened the gate
                outside = (evidence.distance or 0.0) > 1.0
                reasons = [OUTSIDE_CALIBRATED_RANGE if outside else self._reason("log_shift", mix)]
        if mix is not None and mix.changed and not raised:
            reasons.append(CLASS_MIX_CHANGED)
        band = int(np.searchsorted(np.asarray(P_EDGES), p, side="right"))
        below, above = (self.below[band], self.above[band]) if raised else (0.0, 0.0)
        return Decision(raised, p, tuple(dict.fromkeys(reasons)), below, above)

    @staticmethod
    def _reason(feature: str, mix: MixTest | None) -> str:
        reason = FEATURES[feature].reason
        return reason if reason is not None else (mix.largest_group if mix is not None else "inputs_unlike_reference")

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "mean": list(self.mean),
            "scale": list(self.scale),
            "coef": list(self.coef),
            "intercept": self.intercept,
            # JSON has no infinity: never raised is null, always raised the lowest float
            "threshold": self.threshold if math.isfinite(self.threshold) else (None if self.threshold > 0 else -1e308),
            "z_gate": self.z_gate,
            "steps": list(self.steps),
            "levels": list(self.levels),
            "p_edges": list(P_EDGES),
            "below": list(self.below),
            "above": list(self.above),
            "tolerance": self.tolerance,
            "risk": self.risk,
            "windows": self.windows,
            "headline": self.headline,
            "reference": self.reference.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FlagModel:
        features = tuple(str(f) for f in d["features"])
        unknown = [f for f in features if f not in FEATURES]
        if unknown:
            raise ValueError(f"flag model reads unknown features {unknown} (a newer bundle?)")
        floats = lambda key: tuple(float(v) for v in d[key])  # noqa: E731
        out = cls(
            features=features,
            mean=floats("mean"),
            scale=floats("scale"),
            coef=floats("coef"),
            intercept=float(d["intercept"]),
            threshold=math.inf if d.get("threshold") is None else float(d["threshold"]),
            z_gate=float(d["z_gate"]),
            steps=floats("steps"),
            levels=floats("levels"),
            below=floats("below"),
            above=floats("above"),
            reference=ClassReference.from_dict(d["reference"]),
            tolerance=float(d.get("tolerance", TOLERANCE)),
            risk=float(d.get("risk", RISK)),
            windows=int(d.get("windows", 0)),
            headline=str(d.get("headline", "")),
        )
        k = len(features)
        if not (len(out.mean) == len(out.scale) == len(out.coef) == k) or len(out.levels) != len(out.steps) + 1:
            raise ValueError("flag model: inconsistent sizes")
        if len(out.below) != len(P_EDGES) + 1 or len(out.above) != len(P_EDGES) + 1:
            raise ValueError("flag model: the widened interval needs one entry per probability band")
        return out


def flag_or_none(d: object) -> FlagModel | None:
    """The flag model of a bundle, or None when absent (bundles fitted before it) or unreadable."""
    if not isinstance(d, Mapping) or not d:
        return None
    try:
        return FlagModel.from_dict(d)
    except (KeyError, ValueError, TypeError):
        return None
