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
``shift_aware`` (the recommended, headline estimator)
    A blend of two per-sample calibrations, weighted by how shifted the live window looks:

    * *in-distribution part*: the accuracy of each top-class-probability bin on the clean
      calibration split (a reliability-diagram calibration of the confidence);
    * *shift part*: the accuracy of each (oracle verdict × confidence bin) cell on the calibration
      split *plus* corrupted copies of it (a generic family of corruptions, see
      :mod:`agent.calibration_shifts`): how often the model is right when it passes / fails the
      oracle with that confidence once the data has drifted;
    * *weight*: the total-variation distance between the live and the calibration histograms of
      confidence bins, minus the distance expected from sampling alone, mapped linearly between two
      thresholds fitted on the corrupted copies (0 → in-distribution part, 1 → shift part).

    The 95% interval adds to the sampling variance the variance of the calibrated cell accuracies and,
    in proportion to the weight, the root-mean-square error of the shift part in leave-one-corruption-
    out validation — it widens when shift is detected. Everything comes from additive counts per cell
    (:attr:`WindowStats.cells`), so it works on streaming windows. Without a shift calibration in the
    bundle (old bundles) the estimator is absent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

import numpy as np

Z95 = 1.959963984540054

ESTIMATORS: tuple[str, ...] = ("icos", "icos_corrected", "avg_conf", "atc", "doc", "shift_aware")
#: The recommended estimator (shown first in reports and dashboards).
RECOMMENDED_ESTIMATOR = "shift_aware"

#: Inner edges of the top-class-probability bins used by ``shift_aware`` (6 bins).
CONF_EDGES: tuple[float, ...] = (0.6, 0.8, 0.9, 0.97, 0.995)
N_CONF_BINS = len(CONF_EDGES) + 1
#: Verdict groups (indices of ``invariants.oracle.VERDICTS``: pass, fail:idi, fail:tdi, fail:adi).
N_VERDICTS = 4
N_CELLS = N_VERDICTS * N_CONF_BINS


def conf_bins(confidences: np.ndarray) -> np.ndarray:
    """Bin index (0..5) of each top-class probability (bins split at :data:`CONF_EDGES`)."""
    return np.searchsorted(np.asarray(CONF_EDGES), np.asarray(confidences, dtype=np.float64), side="right")


def cell_index(verdicts: np.ndarray, confidences: np.ndarray) -> np.ndarray:
    """Cell of each sample: ``verdict * N_CONF_BINS + confidence bin``."""
    v = np.clip(np.asarray(verdicts, dtype=np.int64), 0, N_VERDICTS - 1)
    return v * N_CONF_BINS + conf_bins(confidences)


def cell_counts(verdicts: np.ndarray, confidences: np.ndarray) -> list[int]:
    """Number of samples per cell (length :data:`N_CELLS`)."""
    idx = cell_index(verdicts, confidences)
    return [int(c) for c in np.bincount(idx, minlength=N_CELLS)[:N_CELLS]]


@dataclass(frozen=True)
class ShiftCalibration:
    """What ``shift_aware`` learns at fit time (JSON-able through :meth:`to_dict`).

    ``p_id``/``n_id``: accuracy and count per confidence bin on the clean calibration split;
    ``p_shift``/``n_shift``: accuracy (smoothed towards the pooled accuracy) and count per cell on
    the calibration split plus its corrupted copies; ``clean_hist``: share of each confidence bin on
    the clean split (``n_clean`` samples); ``d0``/``d1``: shift-distance thresholds of the weight;
    ``rmse_shift``: leave-one-corruption-out RMS error of the shift part; ``families``: corruptions used.
    """

    p_id: tuple[float, ...]
    n_id: tuple[int, ...]
    p_shift: tuple[float, ...]
    n_shift: tuple[int, ...]
    clean_hist: tuple[float, ...]
    n_clean: int
    d0: float
    d1: float
    rmse_shift: float
    families: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> ShiftCalibration:
        def floats(key: str) -> tuple[float, ...]:
            return tuple(float(v) for v in d[key])  # type: ignore[attr-defined]

        def ints(key: str) -> tuple[int, ...]:
            return tuple(int(v) for v in d[key])  # type: ignore[attr-defined]

        out = cls(
            p_id=floats("p_id"),
            n_id=ints("n_id"),
            p_shift=floats("p_shift"),
            n_shift=ints("n_shift"),
            clean_hist=floats("clean_hist"),
            n_clean=int(d["n_clean"]),  # type: ignore[call-overload]
            d0=float(d["d0"]),  # type: ignore[arg-type]
            d1=float(d["d1"]),  # type: ignore[arg-type]
            rmse_shift=float(d["rmse_shift"]),  # type: ignore[arg-type]
            families=tuple(str(v) for v in d.get("families", ())),  # type: ignore[attr-defined]
        )
        if len(out.p_id) != N_CONF_BINS or len(out.p_shift) != N_CELLS or len(out.clean_hist) != N_CONF_BINS:
            raise ValueError("shift calibration has the wrong number of bins")
        return out


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
    shift: ShiftCalibration | None = None

    @property
    def n(self) -> int:
        return self.n_wrong + self.n_right

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {k: getattr(self, k) for k in _BASE_FIELDS}
        if self.shift is not None:
            d["shift"] = self.shift.to_dict()
        return d

    def with_shift(self, shift: ShiftCalibration | None) -> EstimatorCalibration:
        """A copy carrying ``shift`` (the ``shift_aware`` calibration)."""
        return replace(self, shift=shift)

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
            shift=ShiftCalibration.from_dict(d["shift"]) if d.get("shift") else None,  # type: ignore[arg-type]
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


_BASE_FIELDS = ("tpr", "fpr", "n_wrong", "n_right", "accuracy", "avg_conf", "atc_threshold")


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
    #: samples per (verdict × confidence bin) cell, see :func:`cell_index` (``shift_aware``)
    cells: list[int] = field(default_factory=lambda: [0] * N_CELLS)

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
            cells=cell_counts(v, c),
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
            cells=[a + b for a, b in zip(self.cells, other.cells, strict=True)],
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
            cells=[a - b for a, b in zip(self.cells, other.cells, strict=True)],
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
            cells=[int(v) for v in d.get("cells") or [0] * N_CELLS],  # type: ignore[attr-defined]
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
    if calibration.shift is not None and sum(stats.cells) == n:
        out["shift_aware"] = shift_aware(stats.cells, calibration.shift).estimate
    return out


# -- shift_aware -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShiftAwareParts:
    """The pieces of a ``shift_aware`` estimate (for reports and the benchmark)."""

    estimate: Estimate
    in_distribution: float
    shifted: float
    distance: float
    weight: float


def shift_distance(conf_hist_counts: np.ndarray, cal: ShiftCalibration) -> float:
    """Total-variation distance between the live and calibration confidence-bin histograms, minus the
    distance expected from sampling alone (two independent samples of sizes n and ``n_clean``)."""
    counts = np.asarray(conf_hist_counts, dtype=np.float64)
    n = counts.sum()
    if n <= 0:
        return 0.0
    live = counts / n
    ref = np.asarray(cal.clean_hist, dtype=np.float64)
    tv = 0.5 * float(np.abs(live - ref).sum())
    pooled = (live * n + ref * cal.n_clean) / (n + cal.n_clean)
    sd = np.sqrt(pooled * (1 - pooled) * (1.0 / n + 1.0 / max(cal.n_clean, 1)))
    expected = 0.5 * math.sqrt(2.0 / math.pi) * float(sd.sum())
    return max(tv - expected, 0.0)


def shift_weight(distance: float, cal: ShiftCalibration) -> float:
    """0 below ``d0``, 1 above ``d1``, linear in between."""
    if cal.d1 <= cal.d0:
        return 1.0 if distance > cal.d0 else 0.0
    return float(min(1.0, max(0.0, (distance - cal.d0) / (cal.d1 - cal.d0))))


def shift_aware(cells: list[int] | np.ndarray, cal: ShiftCalibration) -> ShiftAwareParts:
    """The ``shift_aware`` estimate from per-cell counts (see the module docstring)."""
    c = np.asarray(cells, dtype=np.float64).reshape(N_VERDICTS, N_CONF_BINS)
    n = float(c.sum())
    if n <= 0:
        return ShiftAwareParts(Estimate(0.0, 0.0, 1.0, 0), 0.0, 0.0, 0.0, 0.0)
    by_bin = c.sum(axis=0)
    p_id, n_id = np.asarray(cal.p_id), np.asarray(cal.n_id, dtype=np.float64)
    p_sh, n_sh = np.asarray(cal.p_shift).reshape(c.shape), np.asarray(cal.n_shift, dtype=np.float64).reshape(c.shape)
    e_id = float((by_bin * p_id).sum() / n)
    e_sh = float((c * p_sh).sum() / n)
    dist = shift_distance(by_bin, cal)
    w = shift_weight(dist, cal)
    value = (1 - w) * e_id + w * e_sh
    # sampling: the window's true accuracy is a sum of Bernoulli(p) draws
    var_samp = ((1 - w) * float((by_bin * p_id * (1 - p_id)).sum()) + w * float((c * p_sh * (1 - p_sh)).sum())) / n**2
    # calibration: each cell's accuracy is itself estimated
    var_cal_id = float(((by_bin / n) ** 2 * p_id * (1 - p_id) / np.maximum(n_id, 1.0)).sum())
    var_cal_sh = float(((c / n) ** 2 * p_sh * (1 - p_sh) / np.maximum(n_sh, 1.0)).sum())
    var = var_samp + (1 - w) ** 2 * var_cal_id + w**2 * var_cal_sh + (w * cal.rmse_shift) ** 2
    half = Z95 * math.sqrt(max(var, 0.0))
    est = Estimate(_clip01(value), _clip01(value - half), _clip01(value + half), int(n))
    return ShiftAwareParts(est, e_id, e_sh, dist, w)


def _rates(cells: np.ndarray, correct: np.ndarray, size: int, prior: float) -> tuple[np.ndarray, np.ndarray]:
    n = np.bincount(cells, minlength=size)[:size].astype(np.float64)
    k = np.bincount(cells, weights=correct.astype(np.float64), minlength=size)[:size]
    base = float(correct.mean()) if correct.size else 0.5
    return (k + prior * base) / (n + prior), n


@dataclass(frozen=True)
class JudgedSet:
    """One labeled calibration set: oracle verdicts, top-class probabilities, correctness."""

    name: str
    verdicts: np.ndarray
    confidences: np.ndarray
    correct: np.ndarray


def fit_shift_calibration(
    clean: JudgedSet, shifted: list[JudgedSet], *, prior: float = 2.0, clean_weight: int = 4
) -> ShiftCalibration:
    """Fit ``shift_aware`` from the clean calibration split and its corrupted copies.

    * ``p_id``: accuracy per confidence bin on ``clean`` (smoothed with ``prior`` pseudo-samples
      at the clean accuracy);
    * ``p_shift``: accuracy per cell on ``clean`` (counted ``clean_weight`` times, so the cells of
      in-distribution data are not drowned) plus every shifted set;
    * ``d0``/``d1``: grid search minimising the mean absolute error of the blend over the clean set
      and the shifted sets, where every shifted set is estimated with ``p_shift`` refitted without its
      own corruption family (leave-one-family-out), so the thresholds are not fitted on in-sample cells;
    * ``rmse_shift``: the leave-one-family-out RMS error of the shift part over the shifted sets.
    """
    cb = conf_bins(clean.confidences)
    p_id, n_id = _rates(cb, clean.correct, N_CONF_BINS, prior)
    clean_hist = np.bincount(cb, minlength=N_CONF_BINS)[:N_CONF_BINS] / max(len(cb), 1)

    def pooled(sets: list[JudgedSet]) -> tuple[np.ndarray, np.ndarray]:
        cells = [cell_index(clean.verdicts, clean.confidences)] * clean_weight
        ok = [np.asarray(clean.correct, bool)] * clean_weight
        for s in sets:
            cells.append(cell_index(s.verdicts, s.confidences))
            ok.append(np.asarray(s.correct, bool))
        return _rates(np.concatenate(cells), np.concatenate(ok), N_CELLS, prior)

    p_shift, n_shift = pooled(shifted)
    families = sorted({s.name for s in shifted})
    base = ShiftCalibration(
        p_id=tuple(float(v) for v in p_id),
        n_id=tuple(int(v) for v in n_id),
        p_shift=tuple(float(v) for v in p_shift),
        n_shift=tuple(int(v) for v in n_shift),
        clean_hist=tuple(float(v) for v in clean_hist),
        n_clean=int(len(cb)),
        d0=0.0,
        d1=0.0,
        rmse_shift=0.0,
        families=tuple(families),
    )
    if not shifted:
        return replace(base, d0=1.0, d1=1.0)
    # per set: in-distribution part, leave-one-family-out shift part, distance, truth
    rows: list[tuple[float, float, float, float]] = []
    for fam in families:
        p_out, _ = pooled([s for s in shifted if s.name != fam])
        for s in (s for s in shifted if s.name == fam):
            cells = np.asarray(cell_counts(s.verdicts, s.confidences), dtype=np.float64)
            n = cells.sum()
            by_bin = cells.reshape(N_VERDICTS, N_CONF_BINS).sum(axis=0)
            rows.append(
                (
                    float((by_bin * p_id).sum() / n),
                    float((cells * p_out).sum() / n),
                    shift_distance(by_bin, base),
                    float(np.mean(s.correct)),
                )
            )
    arr = np.asarray(rows)
    rmse = float(np.sqrt(np.mean((arr[:, 1] - arr[:, 3]) ** 2)))
    # the clean split itself: distance 0, estimate p_id (in-sample), truth its accuracy
    clean_row = np.array(
        [
            [
                float((np.bincount(cb, minlength=N_CONF_BINS) * p_id).sum() / len(cb)),
                float(p_shift[cell_index(clean.verdicts, clean.confidences)].mean()),
                0.0,
                float(np.mean(clean.correct)),
            ]
        ]
    )
    table = np.vstack([arr] + [clean_row] * max(1, len(rows) // 4))
    grid = np.unique(np.concatenate([[0.0], np.quantile(arr[:, 2], np.linspace(0, 1, 21))]))
    best = (math.inf, 0.0, 0.0)
    for i, d0 in enumerate(grid):
        for d1 in grid[i:]:
            w = np.clip((table[:, 2] - d0) / (d1 - d0), 0, 1) if d1 > d0 else (table[:, 2] > d0).astype(float)
            err = float(np.mean(np.abs((1 - w) * table[:, 0] + w * table[:, 1] - table[:, 3])))
            if err < best[0] - 1e-12:
                best = (err, float(d0), float(d1))
    return replace(base, d0=best[1], d1=best[2], rmse_shift=rmse)
