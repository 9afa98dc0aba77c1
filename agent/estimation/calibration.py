"""What the estimators learn from the labeled calibration split (stored in the bundle, JSON-able).

:class:`EstimatorCalibration` holds the oracle's TPR/FPR and the confidence statistics of the
classic estimators; its optional :class:`ShiftCalibration` holds the ``shift_aware`` regressions
(fitted by :func:`agent.offline.calibration.estimators.shift_fitting.fit_shift_calibration`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from agent.estimation.estimators.correctness import CorrectnessModel, correctness_or_none, normalized_weights
from agent.estimation.estimators.evidence import HeadlineEvidence
from agent.estimation.estimators.shift_calibration import ShiftCalibration
from agent.estimation.estimators.trust import MIN_CALIBRATION_ERRORS, confidence_offsets
from agent.estimation.flag.model import FlagModel, flag_or_none
from agent.estimation.segments.segmentation import Segmentation, segmentation_or_none


@dataclass(frozen=True)
class EstimatorCalibration:
    """What the estimators learn from the labeled calibration split (stored in the bundle).

    ``conf_offsets``: per confidence bin, the split's accuracy minus its mean confidence (the
    ``cbpe`` estimator, :func:`~agent.estimation.estimators.trust.confidence_offsets`; empty in older bundles).
    ``headline``: why the bundle's headline estimator was chosen
    (:class:`~agent.estimation.estimators.evidence.HeadlineEvidence`; None in bundles fitted before the choice).
    ``correctness``: the calibrated per-prediction probability of being correct that active labeling
    draws by and ``with_labels`` corrects (:mod:`agent.estimation.estimators.correctness`; None in bundles fitted
    before it: the raw confidence stands in, :attr:`predictor` says which).
    ``flag``: the model of the flag "this number may be wrong" (:mod:`agent.estimation.flag.model`; None in
    bundles fitted before it: the trust distance alone says whether a window is calibrated).
    ``segments``: the segments fixed at fit and their reference (:mod:`agent.estimation.segments.segmentation`; None in
    bundles fitted before them: windows then report no segments).
    """

    tpr: float
    fpr: float
    n_wrong: int
    n_right: int
    accuracy: float
    avg_conf: float
    atc_threshold: float
    shift: ShiftCalibration | None = None
    conf_offsets: tuple[float, ...] = ()
    headline: HeadlineEvidence | None = None
    correctness: CorrectnessModel | None = None
    flag: FlagModel | None = None
    segments: Segmentation | None = None

    @property
    def n(self) -> int:
        return self.n_wrong + self.n_right

    @property
    def too_few_errors(self) -> bool:
        """The split holds too few wrong predictions to calibrate a correction on (the estimators then
        keep raw confidence near clean data, see :data:`~agent.estimation.estimators.trust.MIN_CALIBRATION_ERRORS`)."""
        return self.n_wrong < MIN_CALIBRATION_ERRORS

    @property
    def predictor(self) -> str:
        """Which per-prediction predictor :meth:`predicted_correct` uses: ``calibrated`` or ``confidence``."""
        return "confidence" if self.correctness is None else "calibrated"

    def predicted_correct(self, confidences: np.ndarray, verdicts: np.ndarray) -> np.ndarray:
        """Per prediction, the probability that it is correct: the calibrated model of the bundle, or
        the top-class probability for bundles without one. ``verdicts``: oracle codes (0 = pass)."""
        conf = np.asarray(confidences, dtype=np.float64).reshape(-1)
        if self.correctness is None:
            return conf
        return self.correctness.predict(conf, np.asarray(verdicts).reshape(-1) != 0)

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {k: getattr(self, k) for k in _BASE_FIELDS}
        if self.correctness is not None:
            d["correctness"] = self.correctness.to_dict()
        if self.conf_offsets:
            d["conf_offsets"] = list(self.conf_offsets)
        if self.shift is not None:
            d["shift"] = self.shift.to_dict()
        if self.headline is not None:
            d["headline"] = self.headline.to_dict()
        if self.flag is not None:
            d["flag"] = self.flag.to_dict()
        if self.segments is not None:
            d["segments"] = self.segments.to_dict()
        return d

    def with_shift(self, shift: ShiftCalibration | None) -> EstimatorCalibration:
        """A copy carrying ``shift`` (the ``shift_aware`` calibration)."""
        return replace(self, shift=shift)

    def with_headline(self, evidence: HeadlineEvidence | None) -> EstimatorCalibration:
        """A copy carrying the evidence behind the headline's choice."""
        return replace(self, headline=evidence)

    def with_flag(self, flag: FlagModel | None) -> EstimatorCalibration:
        """A copy carrying the flag's model."""
        return replace(self, flag=flag)

    @property
    def segment_strata(self) -> tuple[tuple[str, int, int], ...]:
        """Every segment dimension as ``(name, first segment number, end)`` (``with_labels``'s strata)."""
        return () if self.segments is None else tuple((d.name, a, b) for d, a, b in self.segments.spans())

    def with_segments(self, segments: Segmentation | None) -> EstimatorCalibration:
        """A copy carrying the segments fixed at fit."""
        return replace(self, segments=segments)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> EstimatorCalibration:
        return cls(
            tpr=float(d["tpr"]),  # type: ignore[arg-type]
            fpr=float(d["fpr"]),  # type: ignore[arg-type]
            n_wrong=int(d["n_wrong"]),  # type: ignore[call-overload]
            n_right=int(d["n_right"]),  # type: ignore[call-overload]
            accuracy=float(d["accuracy"]),  # type: ignore[arg-type]
            avg_conf=float(d["avg_conf"]),  # type: ignore[arg-type]
            atc_threshold=float(d["atc_threshold"]),  # type: ignore[arg-type]
            shift=_shift_or_none(d.get("shift")),
            conf_offsets=tuple(float(v) for v in d.get("conf_offsets") or ()),  # type: ignore[attr-defined]
            headline=_evidence_or_none(d.get("headline")),
            correctness=correctness_or_none(d.get("correctness")),
            flag=flag_or_none(d.get("flag")),
            segments=segmentation_or_none(d.get("segments")),
        )

    @classmethod
    def fit(
        cls, confidences: np.ndarray, correct: np.ndarray, failed: np.ndarray, weights: np.ndarray | None = None
    ) -> EstimatorCalibration:
        """Fit from the calibration split: top-class probabilities, correctness, oracle fail flags.
        ``weights``: each prediction's weight (the inverse of the probability it was drawn into a labeling
        sample with), so that labels of any design refit the traffic's rates, thresholds, offsets and
        correctness predictor without favouring what the design favoured (``n_wrong``/``n_right`` stay the
        counts of labels)."""
        conf = np.asarray(confidences, dtype=np.float64)
        ok = np.asarray(correct, dtype=bool)
        fail = np.asarray(failed, dtype=bool)
        if len(conf) == 0:
            raise ValueError("calibration split is empty")
        w = normalized_weights(weights, len(conf))
        wrong = ~ok
        n_wrong, n_right = int(wrong.sum()), int(ok.sum())
        w_wrong, w_right = float(w[wrong].sum()), float(w[ok].sum())
        tpr = float(w[fail & wrong].sum() / w_wrong) if n_wrong else 0.0
        fpr = float(w[fail & ok].sum() / w_right) if n_right else 0.0
        accuracy = float(np.average(ok, weights=w))
        return cls(
            tpr=tpr,
            fpr=fpr,
            n_wrong=n_wrong,
            n_right=n_right,
            accuracy=accuracy,
            avg_conf=float(np.average(conf, weights=w)),
            atc_threshold=atc_threshold(conf, accuracy, w),
            conf_offsets=confidence_offsets(conf, ok, w),
            correctness=CorrectnessModel.fit(conf, ok, fail, w) if len(fail) == len(conf) else None,
        )


def _shift_or_none(d: object) -> ShiftCalibration | None:
    """The ``shift_aware`` calibration, or None when absent or of an older format (old bundles)."""
    if not isinstance(d, Mapping) or not d:
        return None
    try:
        return ShiftCalibration.from_dict(d)
    except (KeyError, ValueError, TypeError):
        return None


def _evidence_or_none(d: object) -> HeadlineEvidence | None:
    """The headline's evidence, or None when absent (bundles fitted before the choice) or unreadable."""
    if not isinstance(d, Mapping) or not d:
        return None
    try:
        return HeadlineEvidence.from_dict(d)
    except (KeyError, ValueError, TypeError):
        return None


_BASE_FIELDS = ("tpr", "fpr", "n_wrong", "n_right", "accuracy", "avg_conf", "atc_threshold")


def atc_threshold(confidences: np.ndarray, accuracy: float, weights: np.ndarray | None = None) -> float:
    """Threshold ``t`` such that the share of ``confidences > t`` equals ``accuracy`` (Garg et al. 2022);
    with ``weights``, the weighted share."""
    if weights is not None and float(np.ptp(np.asarray(weights, dtype=np.float64))) > 0:
        order = np.argsort(np.asarray(confidences, dtype=np.float64), kind="stable")
        cs = np.asarray(confidences, dtype=np.float64)[order]
        ws = np.asarray(weights, dtype=np.float64)[order]
        cum = np.cumsum(ws)
        # the unweighted rule with each sample counted by its weight: k samples' worth at or below t
        k = int(np.searchsorted(cum - ws / 2.0, (1.0 - accuracy) * cum[-1], side="left"))
        if k <= 0:
            return float(np.nextafter(cs[0], -np.inf))
        return float(cs[min(k, len(cs)) - 1])
    c = np.sort(np.asarray(confidences, dtype=np.float64))
    n = len(c)
    k = int(round((1.0 - accuracy) * n))  # number of samples at or below t
    if k <= 0:
        return float(np.nextafter(c[0], -np.inf))
    if k >= n:
        return float(c[-1])
    return float(c[k - 1])
