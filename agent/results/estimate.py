"""One estimate as every document reads it: an estimator's figures rounded for a person (or every digit for
a program), marked ``unreliable`` with the reason when it says too little to be read as a number
(:mod:`agent.estimation.estimators.reliability`), and a headline with what the flag says of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.reliability import unreliable
from agent.estimation.flag.assessment import Assessment
from agent.estimation.intervals import Estimate
from exporters.prometheus import EstimatePoint

#: Decimals of an estimate in the documents served over HTTP (a person reads them; the metrics and
#: ``check --json`` keep every digit).
DECIMALS = 6


def rounded(v: Any, decimals: int | None) -> Any:
    """``v`` rounded to ``decimals`` if it is a float (None: every digit)."""
    return round(v, decimals) if decimals is not None and isinstance(v, float) else v


def estimate_json(
    name: str, e: Estimate, calibration: EstimatorCalibration, *, decimals: int | None = DECIMALS
) -> dict[str, Any]:
    """Estimator ``name``'s estimate ``e``: its fields rounded to ``decimals`` (None: every digit), marked
    ``unreliable`` (with the reason) when it says too little to be read as a number."""
    d: dict[str, Any] = {k: rounded(v, decimals) for k, v in e.to_dict().items()}
    why = unreliable(name, e, calibration)
    if why is not None:
        d["unreliable"] = why
    return d


def estimates_json(
    estimates: Mapping[str, Estimate], calibration: EstimatorCalibration, *, decimals: int | None = DECIMALS
) -> dict[str, dict[str, Any]]:
    """Every estimator's estimate (:func:`estimate_json`), in the registry's order."""
    return {k: estimate_json(k, e, calibration, decimals=decimals) for k, e in estimates.items()}


def headline_json(headline: tuple[str, Estimate], assessment: Assessment | None = None) -> dict[str, Any]:
    """A window's headline: the estimator that gave it and its estimate (every digit, as the
    ``*_headline_accuracy_ratio`` metrics export it; its interval widened where the flag is raised), and
    what the flag says of it (:meth:`~agent.estimation.flag.assessment.Assessment.headline_dict`)."""
    return {"estimator": headline[0], **headline[1].to_dict(), **(assessment.headline_dict() if assessment else {})}


def estimate_point(estimator: str, window: str, e: Estimate) -> EstimatePoint:
    """Estimator ``estimator``'s estimate of window ``window`` as the metrics export it."""
    return EstimatePoint(estimator, window, e.value, e.lower, e.upper, e.n)


class Interval(Protocol):
    """A figure with its 95% interval: an estimate, or a difference of two."""

    @property
    def value(self) -> float: ...
    @property
    def lower(self) -> float: ...
    @property
    def upper(self) -> float: ...


def estimate_row(prefix: str, e: Interval | None) -> dict[str, float | None]:
    """An estimate's columns of a flat row: ``<prefix>_value``, ``<prefix>_lower``, ``<prefix>_upper``
    (None where there is no estimate)."""
    return {
        f"{prefix}_value": None if e is None else e.value,
        f"{prefix}_lower": None if e is None else e.lower,
        f"{prefix}_upper": None if e is None else e.upper,
    }
