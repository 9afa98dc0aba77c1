"""Is a window's number right? The flag of :mod:`agent.estimation.flag.model` on one estimated window: what
every surface reports as ``flag`` (``raised``: this number may be wrong; ``reasons``: the evidence), and
the headline with its interval widened where the flag is raised.

Bundles fitted before the flag have no flag model: ``raised`` is then the trust distance alone (outside
the calibrated range, distance > 1), with the one reason ``outside_calibrated_range``, and the ``note``
says so; a bundle without a trust model either (a table fitted before the flag) has no ``flag``.

Until :data:`TRUST_REMOVED_IN`, every surface also carries the section under its former name ``trust``, whose
``calibrated`` is ``not raised`` (:meth:`Assessment.trust_dict`), and the headline its former ``calibrated``:
deprecated aliases, so that readers of the former names keep working for one release.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from agent.estimation.estimators.calibrated import EstimatesCalibration
from agent.estimation.estimators.registry import REGISTRY, WindowEstimates
from agent.estimation.estimators.trust import Trust
from agent.estimation.flag.class_mix import ClassReference, MixTest
from agent.estimation.flag.model import FEW_CALIBRATION_ERRORS, OUTSIDE_CALIBRATED_RANGE, FlagModel, WindowEvidence
from agent.estimation.intervals import Estimate, clip01


class FlagCalibration(EstimatesCalibration, Protocol):
    """What the flag reads of a calibration: the estimators' part, whether the split held too few errors, and
    the flag's own model (the bundle's aggregate meets it; the flag does not import the aggregate, which sits
    above every capability)."""

    @property
    def too_few_errors(self) -> bool: ...
    @property
    def flag(self) -> FlagModel | None: ...


#: Why a window of a bundle without a flag model is judged by its trust distance alone.
NO_FLAG_NOTE = (
    "the bundle was fitted before the flag: raised says only whether the window lies outside the range "
    "shift_aware was calibrated on (trust distance above 1); refit the bundle for the flag"
)
#: The release that drops the deprecated ``trust`` section and the headline's ``calibrated`` (read ``flag``).
TRUST_REMOVED_IN = "0.2.0"
#: What the deprecated ``trust`` section says of itself.
TRUST_DEPRECATED = (
    f"deprecated: read flag (flag.raised is the negation of trust.calibrated); trust is removed in {TRUST_REMOVED_IN}"
)


def spread_estimators() -> tuple[str, ...]:
    """The estimators whose spread with the headline is the ``disagreement`` evidence: those calibrated on
    the split that rest neither on the oracle, the model nor labels (the confidence estimators)."""
    return tuple(
        n for n, s in REGISTRY.items() if s.split_calibrated and not (s.needs_oracle or s.needs_model or s.needs_labels)
    )


@dataclass(frozen=True)
class Assessment:
    """The answer for one window: ``raised`` (this number may be wrong), the ``reasons`` (largest first),
    what decided (``basis``: ``flag`` or ``trust_distance`` for bundles without a flag model), the
    probability that the headline is off by more than ``tolerance``, the trust signal and the
    class-adjusted test it rests on, and the headline (its interval widened where the flag is raised;
    ``own``: its interval before)."""

    raised: bool
    reasons: tuple[str, ...]
    basis: str
    probability: float | None = None
    tolerance: float | None = None
    trust: Trust | None = None
    mix: MixTest | None = None
    headline: tuple[str, Estimate] | None = None
    own: Estimate | None = None

    @property
    def widened(self) -> bool:
        return self.own is not None

    def to_dict(self) -> dict[str, Any]:
        """The window's ``flag`` section."""
        out: dict[str, Any] = {"raised": self.raised, "reasons": list(self.reasons), "basis": self.basis}
        if self.probability is not None:
            out["probability"] = self.probability
            out["tolerance"] = self.tolerance
        if self.trust is not None:
            out.update(
                distance=self.trust.distance,
                drift=self.trust.drift,
                weight=self.trust.weight,
                in_calibrated_range=self.trust.calibrated,
            )
        if self.mix is not None:
            out["class_mix"] = self.mix.to_dict()
        if self.basis != "flag":
            out["note"] = NO_FLAG_NOTE
        return out

    def trust_dict(self) -> dict[str, Any]:
        """The deprecated ``trust`` section (until :data:`TRUST_REMOVED_IN`): the ``flag`` section under its
        former name, with ``calibrated`` (``not raised``) for ``raised``."""
        out = {"calibrated": not self.raised, **{k: v for k, v in self.to_dict().items() if k != "raised"}}
        out["deprecated"] = TRUST_DEPRECATED
        return out

    def headline_dict(self) -> dict[str, Any]:
        """What the flag adds to the window's headline: ``flag_raised`` (and its deprecated negation
        ``calibrated``) and, where raised, the sentence saying so and the interval before it was widened."""
        out: dict[str, Any] = {"flag_raised": self.raised, "calibrated": not self.raised}
        if self.own is not None:
            out["own_interval"] = {"lower": self.own.lower, "upper": self.own.upper}
        if self.raised:
            out["may_be_wrong"] = self.sentence()
        return out

    def sentence(self) -> str:
        """Why the headline may be wrong, in one sentence."""
        why = ", ".join(r.replace("_", " ") for r in self.reasons) or "outside the calibrated range"
        if self.tolerance is not None and self.probability is not None:
            head = f"may be off by more than {self.tolerance:.2f} (estimated probability {self.probability:.0%})"
        else:
            head = "may be off: the window lies outside the range its estimator was calibrated on"
        tail = "; its interval is widened to hold the truth" if self.widened else ""
        return f"{head}: {why}{tail}"


def window_evidence(
    window: WindowEstimates, headline: Estimate, calibration: EstimatesCalibration, reference: ClassReference
) -> WindowEvidence:
    """What the flag reads of an estimated window (:class:`~agent.estimation.flag.model.WindowEvidence`), with the
    class reference its class-adjusted test compares with."""
    values = [window.estimates[n].value for n in spread_estimators() if n in window.estimates] + [headline.value]
    return WindowEvidence(
        n=window.stats.n,
        headline=headline.value,
        distance=window.trust.distance if window.trust is not None else None,
        mix=reference.test(window.stats),
        disagreement=max(values) - min(values),
        drop=max(calibration.accuracy - headline.value, 0.0),
    )


def assess(
    window: WindowEstimates, headline: tuple[str, Estimate] | None, calibration: FlagCalibration
) -> Assessment | None:
    """The flag on an estimated window (None: an empty window, or a bundle with neither a flag model nor a
    trust model)."""
    few = (FEW_CALIBRATION_ERRORS,) if calibration.too_few_errors else ()
    flag = calibration.flag
    if flag is None or headline is None or window.stats.n <= 0:
        trust = window.trust
        if trust is None or headline is None:
            return None
        reasons = (() if trust.calibrated else (OUTSIDE_CALIBRATED_RANGE,)) + few
        return Assessment(not trust.calibrated, reasons, "trust_distance", trust=trust, headline=headline)
    name, est = headline
    evidence = window_evidence(window, est, calibration, flag.reference)
    decision = flag.decide(evidence)
    own = None
    if decision.raised:
        lower = clip01(min(est.lower, est.value - decision.below))
        upper = clip01(max(est.upper, est.value + decision.above))
        if (lower, upper) != (est.lower, est.upper):
            own = est
            est = replace(est, lower=lower, upper=upper)
    return Assessment(
        raised=decision.raised,
        reasons=decision.reasons + few,
        basis="flag",
        probability=decision.probability,
        tolerance=flag.tolerance,
        trust=window.trust,
        mix=evidence.mix,
        headline=(name, est),
        own=own,
    )
