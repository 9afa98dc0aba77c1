"""Operational-accuracy estimators computed from unlabeled predictions.

Every estimator works on a small set of sufficient statistics (:class:`WindowStats`) so that the
same code serves a batch (``icos-agent check``) and streaming windows (the sidecar), where stats of
arriving predictions are added and those of expiring ones subtracted.

Estimators:

``icos``
    1 − share of predictions the oracle fails (ICOS paper §5.3: the estimated accuracy is the share of
    ``pass`` verdicts). Wilson 95% interval on the pass share.
``icos_corrected``
    Rogan–Gladen correction of the fail share with the oracle's TPR and FPR measured on a calibration
    split held out of ADI training: with fail share ``r``, accuracy = (TPR − r) / (TPR − FPR), clipped
    to [0, 1]. 95% interval by the delta method with the binomial variances of ``r``, TPR and FPR.
``avg_conf``
    Mean top-class probability. Normal interval on the mean.
``atc``
    Average Thresholded Confidence (Garg et al., ICLR 2022): a threshold ``t`` on the top-class
    probability is chosen on the calibration split so that the share of samples above ``t`` equals
    the calibration accuracy; the estimate is the live share above ``t``. Wilson interval.
``doc``
    Difference of Confidences (Guillory et al., 2021): calibration accuracy shifted by the change of
    average confidence between calibration and live data. Interval of ``avg_conf`` shifted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

Z95 = 1.959963984540054

ESTIMATORS: tuple[str, ...] = ("icos", "icos_corrected", "avg_conf", "atc", "doc")


@dataclass(frozen=True)
class Estimate:
    """A point estimate of accuracy with its 95% interval and the number of samples behind it."""

    value: float
    lower: float
    upper: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return {"value": self.value, "lower": self.lower, "upper": self.upper, "n": self.n}


@dataclass(frozen=True)
class EstimatorCalibration:
    """What the estimators learn from the labeled calibration split (stored in the bundle)."""

    tpr: float
    fpr: float
    n_wrong: int
    n_right: int
    accuracy: float
    avg_conf: float
    atc_threshold: float

    @property
    def n(self) -> int:
        return self.n_wrong + self.n_right

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)

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
        )

    @classmethod
    def fit(cls, confidences: np.ndarray, correct: np.ndarray, failed: np.ndarray) -> EstimatorCalibration:
        """Fit from the calibration split: top-class probabilities, correctness, oracle fail flags."""
        conf = np.asarray(confidences, dtype=np.float64)
        ok = np.asarray(correct, dtype=bool)
        fail = np.asarray(failed, dtype=bool)
        if len(conf) == 0:
            raise ValueError("calibration split is empty")
        wrong = ~ok
        n_wrong, n_right = int(wrong.sum()), int(ok.sum())
        tpr = float((fail & wrong).sum() / n_wrong) if n_wrong else 0.0
        fpr = float((fail & ok).sum() / n_right) if n_right else 0.0
        return cls(
            tpr=tpr,
            fpr=fpr,
            n_wrong=n_wrong,
            n_right=n_right,
            accuracy=float(ok.mean()),
            avg_conf=float(conf.mean()),
            atc_threshold=atc_threshold(conf, float(ok.mean())),
        )


def atc_threshold(confidences: np.ndarray, accuracy: float) -> float:
    """Threshold ``t`` such that the share of ``confidences > t`` equals ``accuracy`` (Garg et al. 2022)."""
    c = np.sort(np.asarray(confidences, dtype=np.float64))
    n = len(c)
    k = int(round((1.0 - accuracy) * n))  # number of samples at or below t
    if k <= 0:
        return float(np.nextafter(c[0], -np.inf))
    if k >= n:
        return float(c[-1])
    return float(c[k - 1])


@dataclass
class WindowStats:
    """Additive sufficient statistics of a set of judged predictions."""

    n: int = 0
    fails: int = 0
    fails_by_family: dict[str, int] = field(default_factory=lambda: {"idi": 0, "tdi": 0, "adi": 0})
    conf_sum: float = 0.0
    conf_sq_sum: float = 0.0
    atc_above: int = 0

    @classmethod
    def from_batch(
        cls, verdicts: np.ndarray, confidences: np.ndarray, calibration: EstimatorCalibration
    ) -> WindowStats:
        """``verdicts`` are indices into ``invariants.oracle.VERDICTS`` (0 pass, 1 idi, 2 tdi, 3 adi)."""
        v = np.asarray(verdicts)
        c = np.asarray(confidences, dtype=np.float64)
        fam = np.bincount(v.astype(np.int64), minlength=4)
        return cls(
            n=int(len(v)),
            fails=int((v != 0).sum()),
            fails_by_family={"idi": int(fam[1]), "tdi": int(fam[2]), "adi": int(fam[3])},
            conf_sum=float(c.sum()),
            conf_sq_sum=float((c * c).sum()),
            atc_above=int((c > calibration.atc_threshold).sum()),
        )

    def __add__(self, other: WindowStats) -> WindowStats:
        return WindowStats(
            n=self.n + other.n,
            fails=self.fails + other.fails,
            fails_by_family={
                k: self.fails_by_family.get(k, 0) + other.fails_by_family.get(k, 0) for k in ("idi", "tdi", "adi")
            },
            conf_sum=self.conf_sum + other.conf_sum,
            conf_sq_sum=self.conf_sq_sum + other.conf_sq_sum,
            atc_above=self.atc_above + other.atc_above,
        )

    def __sub__(self, other: WindowStats) -> WindowStats:
        return WindowStats(
            n=self.n - other.n,
            fails=self.fails - other.fails,
            fails_by_family={
                k: self.fails_by_family.get(k, 0) - other.fails_by_family.get(k, 0) for k in ("idi", "tdi", "adi")
            },
            conf_sum=self.conf_sum - other.conf_sum,
            conf_sq_sum=self.conf_sq_sum - other.conf_sq_sum,
            atc_above=self.atc_above - other.atc_above,
        )

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> WindowStats:
        fam = d.get("fails_by_family") or {}
        return cls(
            n=int(d["n"]),  # type: ignore[call-overload]
            fails=int(d["fails"]),  # type: ignore[call-overload]
            fails_by_family={k: int(v) for k, v in dict(fam).items()},  # type: ignore[call-overload]
            conf_sum=float(d["conf_sum"]),  # type: ignore[arg-type]
            conf_sq_sum=float(d["conf_sq_sum"]),  # type: ignore[arg-type]
            atc_above=int(d["atc_above"]),  # type: ignore[call-overload]
        )


def _clip01(v: float) -> float:
    return float(min(1.0, max(0.0, v)))


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / denom
    return _clip01(centre - half), _clip01(centre + half)


def _mean_interval(stats: WindowStats) -> tuple[float, float, float]:
    n = stats.n
    mean = stats.conf_sum / n
    var = max(stats.conf_sq_sum / n - mean * mean, 0.0) * n / max(n - 1, 1)
    half = Z95 * math.sqrt(var / n)
    return mean, mean - half, mean + half


def rogan_gladen(fail_share: float, n: int, cal: EstimatorCalibration) -> Estimate:
    """Accuracy = (TPR − r) / (TPR − FPR) with a delta-method interval (clipped to [0, 1]).

    When TPR ≤ FPR the oracle carries no information and the interval is [0, 1].
    """
    denom = cal.tpr - cal.fpr
    if denom <= 1e-9 or n == 0:
        return Estimate(_clip01(1.0 - fail_share), 0.0, 1.0, n)
    acc = (cal.tpr - fail_share) / denom
    err = 1.0 - acc
    var_r = fail_share * (1 - fail_share) / n
    var_tpr = cal.tpr * (1 - cal.tpr) / cal.n_wrong if cal.n_wrong else 0.25
    var_fpr = cal.fpr * (1 - cal.fpr) / cal.n_right if cal.n_right else 0.25
    e = min(max(err, 0.0), 1.0)
    var = (var_r + e * e * var_tpr + (1 - e) ** 2 * var_fpr) / (denom * denom)
    half = Z95 * math.sqrt(var)
    return Estimate(_clip01(acc), _clip01(acc - half), _clip01(acc + half), n)


def estimate_all(stats: WindowStats, calibration: EstimatorCalibration) -> dict[str, Estimate]:
    """All estimators on one set of statistics. An empty window gives no estimates."""
    n = stats.n
    if n <= 0:
        return {}
    out: dict[str, Estimate] = {}
    passes = n - stats.fails
    lo, hi = wilson(passes, n)
    out["icos"] = Estimate(passes / n, lo, hi, n)
    out["icos_corrected"] = rogan_gladen(stats.fails / n, n, calibration)
    mean, mlo, mhi = _mean_interval(stats)
    out["avg_conf"] = Estimate(_clip01(mean), _clip01(mlo), _clip01(mhi), n)
    lo, hi = wilson(stats.atc_above, n)
    out["atc"] = Estimate(stats.atc_above / n, lo, hi, n)
    shift = calibration.accuracy - calibration.avg_conf
    out["doc"] = Estimate(_clip01(mean + shift), _clip01(mlo + shift), _clip01(mhi + shift), n)
    return out
