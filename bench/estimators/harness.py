"""Run the estimator benchmark: fit once per model, judge shifted pools once, sample operational sets.

For every model the oracle (TDI tree, ADI forest) is fitted once exactly as ``icos-agent fit`` does
(:func:`invariants.fitting.fit_oracle` with the agent's defaults); IDI variants reuse the same TDI/ADI
and only add the IDI rules. The estimator calibration (including ``shift_aware``'s corrupted copies
of the calibration split) is computed by the same agent functions as ``fit``.

For every scenario the test split is transformed into a *pool* (``copies`` seeded copies), predicted
and judged once; each repetition then draws ``size`` samples from the pool with replacement (with
Dirichlet class weights for label shift) and computes every estimator from the additive window
statistics, against the true accuracy of the drawn set (ICOS paper §5.3, eq. 3).

``shift_aware`` is calibrated on corruptions that include the metamorphic audit's transformations,
some of the same kind as scenarios of the suite. So every scenario is also estimated by a
``shift_aware`` calibrated *without* its kin (:data:`HELD_OUT`): the error to expect from a drift
of a kind the calibration has not seen.

Every ``shift_aware`` calibration of the label-free variant (shipped and without each kin) carries the flag
"this number may be wrong", fitted as ``fit`` fits it (:func:`agent.offline.calibration.flag.fitting.model_flag`
on the refits behind its interval); the records of ``shift_aware`` and of :data:`HELD_OUT` keep whether it was
raised (``flag_raised``) on each window.

``shift_aware``'s calibration is a random draw (corruption strengths, windows, trees; all from
``calibration_sets``' seed). Every scenario is also estimated with the calibrations of
:attr:`Config.calibration_seeds` (records named by :func:`seeded_name`), so the report shows how far
the shipped figures depend on that draw.

Live windows hold as many predictions as the traffic brings. Every scenario is also estimated by
``shift_aware`` on windows of :attr:`Config.window_sizes` predictions (records named by
:func:`sized_name`, each against the true accuracy of its own draw), so the report shows how the
error and the interval change with the window's size.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.registry import (
    RECOMMENDED_ESTIMATOR,
    WindowEstimates,
    estimate_all,
    estimate_window,
    headline_of,
)
from agent.estimation.flag.assessment import Assessment, assess
from agent.estimation.statistics.window import WindowStats
from agent.model.classifier import Prediction
from agent.offline.calibration.flag.fitting import model_flag
from agent.offline.calibration.sets import CalibrationSets, calibration_sets
from agent.offline.calibration.shift_windows import tilt_coordinates
from bench.estimators.scenarios import (
    ImageSpec,
    Scenario,
    TabularSpec,
    image_scenarios,
    resample_images,
    tabular_scenarios,
)
from bench.estimators.subjects import Subject, form_metadata, idi_yaml
from invariants.fit_params import FitParams
from invariants.fitting import FittedOracle, fit_oracle
from invariants.idi import IdiRuleSet
from invariants.oracle import Oracle
from invariants.tdi import TrainingInvariants


@dataclass(frozen=True)
class Config:
    reps: int = 30
    size: int = 1000
    pool_min: int = 3000
    #: Seeds the draws of the benchmark and, as ``icos-agent fit --seed``, the fit.
    seed: int = 0
    #: The fit's other parameters (``icos-agent fit``'s defaults unless quick mode lowers them).
    fit: FitParams = FitParams()
    #: Also estimate every scenario with ``shift_aware`` calibrated without the scenario's kin
    #: (:attr:`Scenario.calibration_kin`), recorded as :data:`HELD_OUT` (label-free only).
    held_out: bool = True
    #: Further seeds of ``shift_aware``'s calibration (label-free only); each is recorded under
    #: :func:`seeded_name` so the report can show the spread over calibration draws.
    calibration_seeds: tuple[int, ...] = (1, 2, 3, 4)
    #: Further window sizes (predictions per window) to estimate every scenario with ``shift_aware``
    #: at (label-free only); each is recorded under :func:`sized_name`.
    window_sizes: tuple[int, ...] = (100, 300, 3000)


#: Pseudo-estimator of the records of ``shift_aware`` calibrated without the scenario's kind of shift.
HELD_OUT = "shift_aware_held_out"
#: Prefix of the pseudo-estimators of ``shift_aware`` calibrated with another seed.
SEEDED_PREFIX = "shift_aware_seed"


def _number_after(prefix: str, estimator: str) -> int | None:
    rest = estimator.removeprefix(prefix)
    return int(rest) if rest != estimator and rest.isdigit() else None


def seeded_name(seed: int) -> str:
    """Estimator name of the records of ``shift_aware`` calibrated with ``seed``."""
    return f"{SEEDED_PREFIX}{seed}"


def seed_of(estimator: str) -> int | None:
    """The calibration seed of a :func:`seeded_name` (None for any other estimator)."""
    return _number_after(SEEDED_PREFIX, estimator)


#: Prefix of the pseudo-estimators of ``shift_aware`` on windows of another size.
SIZED_PREFIX = "shift_aware_n"


def sized_name(size: int) -> str:
    """Estimator name of the records of ``shift_aware`` on windows of ``size`` predictions."""
    return f"{SIZED_PREFIX}{size}"


def size_of(estimator: str) -> int | None:
    """The window size of a :func:`sized_name` (None for any other estimator)."""
    return _number_after(SIZED_PREFIX, estimator)


@dataclass(frozen=True)
class Record:
    model: str
    idi: str
    scenario: str
    rep: int
    estimator: str
    value: float
    lower: float
    upper: float
    truth: float
    #: the window's trust distance and whether the flag "this number may be wrong" is raised
    #: (``flag.raised``; ``shift_aware`` and its held-out pseudo-estimator only; NaN / None elsewhere)
    trust: float = float("nan")
    flag_raised: bool | None = None

    @property
    def error(self) -> float:
        return abs(self.value - self.truth)

    @property
    def covered(self) -> bool:
        return self.lower - 1e-12 <= self.truth <= self.upper + 1e-12


@dataclass
class _Variant:
    name: str
    oracle: Oracle
    calibration: EstimatorCalibration
    idi_partitions: dict[str, list[int]] | None


@dataclass(frozen=True)
class _Pool:
    """A scenario's pool as predicted: what a window's statistics are computed from."""

    confidences: np.ndarray
    probabilities: np.ndarray
    labels: np.ndarray
    features: np.ndarray
    rules: np.ndarray

    def window(self, verdicts: np.ndarray, cal: EstimatorCalibration, idx: np.ndarray) -> WindowStats:
        """The statistics of the window ``idx`` of the pool, judged with ``verdicts``."""
        return WindowStats.from_batch(
            verdicts[idx],
            self.confidences[idx],
            cal,
            probabilities=self.probabilities[idx],
            labels=self.labels[idx],
            features=self.features[idx],
            tdi_rules=self.rules[idx],
        )


def _tr(window: WindowEstimates, calibration: EstimatorCalibration) -> tuple[float, bool | None]:
    """The trust distance of a window and whether the flag is raised on ``shift_aware`` as its headline."""
    a: Assessment | None = assess(window, headline_of(window.estimates, RECOMMENDED_ESTIMATOR), calibration)
    distance = window.trust.distance if window.trust is not None else float("nan")
    return distance, None if a is None else a.raised


def flagged_calibration(
    sets: CalibrationSets, classic: EstimatorCalibration, features: np.ndarray, n_classes: int, seed: int
) -> EstimatorCalibration:
    """``classic`` with ``shift_aware`` fitted on ``sets`` and the flag fitted as ``fit`` fits it."""
    shift = sets.fit_with_refits(seed)
    flag = model_flag(sets, shift, classic, RECOMMENDED_ESTIMATOR, tilt_coordinates(features), n_classes, seed=seed)
    return classic.with_shift(shift.calibration).with_flag(flag)


def stable_seed(*parts: object) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode())


def draw_window(
    rng: np.random.Generator, sc: Scenario, size: int, n_seg: int, class_index: list[np.ndarray]
) -> np.ndarray:
    """Indices of one operational set of ``size`` from the pool (with replacement; under label shift
    with a class prior drawn from ``Dirichlet(sc.prior_alpha)``). A pool of :attr:`Scenario.segments`
    (each ``n_seg`` samples) gives every set from one segment picked at random."""
    if sc.segments:
        start = int(rng.integers(0, len(sc.segments))) * n_seg
        return start + rng.integers(0, n_seg, size)
    if sc.prior_alpha is None:
        return rng.integers(0, n_seg, size)
    prior = rng.dirichlet(np.full(len(class_index), sc.prior_alpha))
    per_class = rng.multinomial(size, prior)
    return np.concatenate([rng.choice(class_index[k], c, replace=True) for k, c in enumerate(per_class) if c > 0])


def _other_images(subject: Subject) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
    """The natural shift of an image subject: the other shipped digit data set (MNIST-5k for 8×8
    digits, scikit-learn digits for 28×28 MNIST), resampled to the subject's size and pixel scale."""

    def load() -> tuple[np.ndarray, np.ndarray]:
        from agent.data.datasets import digits_splits, mnist_splits

        size = int(subject.test_x.shape[-1])
        other = (mnist_splits() if size <= 8 else digits_splits()).test
        assert other.y is not None
        x = np.asarray(other.x, dtype=np.float32).reshape(len(other.x), 1, *other.x.shape[-2:])
        return resample_images(x, size, subject.max_value), np.asarray(other.y, dtype=np.int64)

    return load


def _most_informative(x: np.ndarray, y: np.ndarray) -> int:
    """The feature whose class means differ most relative to its spread (ANOVA F, up to a constant)."""
    flat = x.reshape(len(x), -1).astype(np.float64)
    means = np.array([flat[y == k].mean(axis=0) for k in np.unique(y)])
    return int(np.argmax(means.var(axis=0) / (flat.var(axis=0) + 1e-12)))


def scenarios_for(subject: Subject) -> list[Scenario]:
    if subject.kind == "image":
        return image_scenarios(ImageSpec(subject.max_value), _other_images(subject))
    flat = subject.train_x.reshape(len(subject.train_x), -1)
    spec = TabularSpec(flat.mean(axis=0), flat.std(axis=0) + 1e-12)
    return tabular_scenarios(spec, _most_informative(subject.train_x, subject.train_y))


def scenario_pool(
    subject: Subject, sc: Scenario, cfg: Config, test_x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int, list[np.ndarray]]:
    """A scenario's pool from the subject's (prepared) test split ``test_x``: its inputs and true
    classes, the length of one segment and the pool indices of every class (for :func:`draw_window`)."""
    m = subject.model
    rng = np.random.default_rng(stable_seed(cfg.seed, subject.name, sc.name, "pool"))
    base_x, base_y = test_x, subject.test_y
    if sc.pool is not None:
        other_x, base_y = sc.pool()
        base_x = m.prepare_array(other_x)
    if sc.select is not None:
        keep = sc.select(subject.test_x)
        base_x, base_y = base_x[keep], base_y[keep]
    copies = max(1, -(-cfg.pool_min // len(base_x)))
    transforms = sc.segments or (sc.transform,)
    parts_x = [base_x if t is None else t(base_x, rng) for t in transforms for _ in range(copies)]
    pool_y = np.tile(base_y, copies * len(transforms))
    class_index = [np.flatnonzero(pool_y == k) for k in range(m.n_classes)]
    pool_x = np.ascontiguousarray(np.concatenate(parts_x).astype(test_x.dtype))
    return pool_x, pool_y, copies * len(base_x), class_index


@dataclass(frozen=True)
class SubjectFit:
    """A subject's oracle fitted as ``icos-agent fit`` fits it (TDI on train, ADI on part of val), the
    prepared splits and the held-out calibration split with its predictions."""

    train_x: np.ndarray
    val_x: np.ndarray
    val_pred: Prediction
    fitted: FittedOracle
    cal_idx: np.ndarray
    cal_x: np.ndarray
    cal_y: np.ndarray
    cal_pred: Prediction


def fit_subject(subject: Subject, cfg: Config) -> SubjectFit:
    """:class:`SubjectFit` of ``subject`` with the benchmark's fit parameters and seed."""
    m = subject.model
    train_x, val_x = m.prepare_array(subject.train_x), m.prepare_array(subject.val_x)
    val_pred = m.predict_batched(val_x)
    fitted = fit_oracle(
        m.features(train_x),
        subject.train_y,
        m.features(val_x),
        subject.val_y,
        val_pred.probabilities,
        idi=None,
        params=replace(cfg.fit, seed=cfg.seed),
    )
    cal_idx = fitted.calibration_index
    cal_x = val_x[cal_idx]
    return SubjectFit(
        train_x, val_x, val_pred, fitted, cal_idx, cal_x, subject.val_y[cal_idx], m.predict_batched(cal_x)
    )


def _calibrate(
    subject: Subject, cfg: Config, fit: SubjectFit, say: Callable[[str], None]
) -> tuple[list[_Variant], dict[tuple[str, ...], EstimatorCalibration], dict[int, EstimatorCalibration]]:
    """The oracle and calibration of each IDI variant (the label-free one first), the label-free
    calibrations without each scenario's kin (``cfg.held_out``) and those of the other seeds."""
    m = subject.model
    params = replace(cfg.fit, seed=cfg.seed)
    train_x, fitted = fit.train_x, fit.fitted
    cal_x, cal_y, cal_pred = fit.cal_x, fit.cal_y, fit.cal_pred
    tdi, adi = fitted.oracle.tdi, fitted.oracle.adi
    variants: list[_Variant] = []
    held: dict[tuple[str, ...], EstimatorCalibration] = {}  # calibrations without a scenario's kin
    seeded: dict[int, EstimatorCalibration] = {}  # calibrations of other seeds
    for idi_name, parts in [("none", None), *subject.partitions.items()]:
        idi = IdiRuleSet.from_yaml(idi_yaml(parts), m.classes) if parts else None
        oracle = Oracle(idi, tdi, adi)
        meta = {"form": form_metadata(cal_y, parts)} if parts else None
        res = oracle.judge(m.features(cal_x), cal_pred.probabilities, cal_pred.predicted, metadata=meta)
        cal = EstimatorCalibration.fit(cal_pred.confidences, cal_pred.predicted == cal_y, res.failed)
        sets = calibration_sets(
            m, oracle, cal_x, cal_y, train_x=train_x, metadata=meta, n_sets=params.shift_sets, seed=params.seed
        )
        cal_features = m.features(cal_x)
        if idi_name == "none":  # the label-free variant, whose targets the flag is measured against
            full = flagged_calibration(sets, cal, cal_features, m.n_classes, params.seed)
        else:
            full = cal.with_shift(sets.fit(params.seed))
        variants.append(_Variant(idi_name, oracle, full, parts))
        if idi_name == "none" and cfg.held_out:
            kin_sets = sorted({sc.calibration_kin for sc in scenarios_for(subject)} - {()})
            for k, kin in enumerate(kin_sets, 1):
                say(f"[{subject.name}] calibrating without {', '.join(kin)} ({k}/{len(kin_sets)})")
                held_sets = calibration_sets(
                    m,
                    oracle,
                    cal_x,
                    cal_y,
                    train_x=train_x,
                    n_sets=params.shift_sets,
                    seed=params.seed,
                    exclude=kin,
                )
                held[kin] = flagged_calibration(held_sets, cal, cal_features, m.n_classes, params.seed)
        if idi_name == "none":
            extra = [s for s in dict.fromkeys(cfg.calibration_seeds) if s != cfg.seed]
            for k, s in enumerate(extra, 1):
                say(f"[{subject.name}] calibrating with seed {s} ({k}/{len(extra)})")
                seeded[s] = cal.with_shift(
                    calibration_sets(m, oracle, cal_x, cal_y, train_x=train_x, n_sets=params.shift_sets, seed=s).fit(s)
                )
    return variants, held, seeded


def _scenario_records(
    subject: Subject,
    cfg: Config,
    sc: Scenario,
    test_x: np.ndarray,
    tdi: TrainingInvariants,
    calibrated: tuple[list[_Variant], dict[tuple[str, ...], EstimatorCalibration], dict[int, EstimatorCalibration]],
    say: Callable[[str], None],
) -> list[Record]:
    """Every estimator's records over ``cfg.reps`` windows of one scenario, for each variant, the pseudo-estimators
    (held out, other seeds) and the windows of other sizes."""
    m = subject.model
    variants, held, seeded = calibrated
    extra_sizes = [n for n in dict.fromkeys(cfg.window_sizes) if n != cfg.size]
    records: list[Record] = []
    t1 = time.perf_counter()
    pool_x, pool_y, seg_len, class_index = scenario_pool(subject, sc, cfg, test_x)
    pred = m.predict_batched(pool_x)
    correct = pred.predicted == pool_y
    pool_f = m.features(pool_x)
    rules = tdi.rule_index(pool_f)
    judged = []
    for v in variants:
        meta = {"form": form_metadata(pool_y, v.idi_partitions)} if v.idi_partitions else None
        judged.append(v.oracle.judge(m.features(pool_x), pred.probabilities, pred.predicted, metadata=meta).verdict)
    pool = _Pool(pred.confidences, pred.probabilities, pred.predicted, pool_f, rules)
    for rep in range(cfg.reps):
        rr = np.random.default_rng(stable_seed(cfg.seed, subject.name, sc.name, rep))
        idx = draw_window(rr, sc, cfg.size, seg_len, class_index)
        truth = float(correct[idx].mean())
        for v, verdicts in zip(variants, judged, strict=True):
            stats = pool.window(verdicts, v.calibration, idx)
            window = estimate_window(stats, v.calibration)
            tr = _tr(window, v.calibration)
            for name, e in window.estimates.items():
                t = tr if name == RECOMMENDED_ESTIMATOR else (float("nan"), None)
                records.append(Record(subject.name, v.name, sc.name, rep, name, e.value, e.lower, e.upper, truth, *t))
            if v.name == "none":  # shift_aware again under the label-free pseudo-estimators
                others = {seeded_name(s): scal for s, scal in seeded.items()}
                if cfg.held_out:
                    others[HELD_OUT] = held.get(sc.calibration_kin, v.calibration)
                for pseudo, ocal in others.items():
                    ow = estimate_window(stats, ocal)
                    g = ow.estimates.get(RECOMMENDED_ESTIMATOR)
                    t = _tr(ow, ocal) if pseudo == HELD_OUT else (float("nan"), None)
                    if g is not None:
                        records.append(
                            Record(
                                subject.name,
                                "none",
                                sc.name,
                                rep,
                                pseudo,
                                g.value,
                                g.lower,
                                g.upper,
                                truth,
                                *t,
                            )
                        )
        for size in extra_sizes:  # shift_aware on windows of other sizes (label-free, shipped seed)
            rs = np.random.default_rng(stable_seed(cfg.seed, subject.name, sc.name, rep, "size", size))
            idx_s = draw_window(rs, sc, size, seg_len, class_index)
            free = variants[0].calibration
            g = estimate_all(pool.window(judged[0], free, idx_s), free).get(RECOMMENDED_ESTIMATOR)
            if g is not None:
                truth_s = float(correct[idx_s].mean())
                records.append(
                    Record(subject.name, "none", sc.name, rep, sized_name(size), g.value, g.lower, g.upper, truth_s)
                )
    say(f"[{subject.name}] {sc.name:28s} pool accuracy {float(correct.mean()):.3f} ({time.perf_counter() - t1:.1f}s)")
    return records


def run_subject(subject: Subject, cfg: Config, say: Callable[[str], None] = print) -> list[Record]:
    t0 = time.perf_counter()
    m = subject.model
    test_x = m.prepare_array(subject.test_x)
    fit = fit_subject(subject, cfg)
    tdi = fit.fitted.oracle.tdi
    assert tdi is not None  # fit_oracle always builds the TDI tree
    calibrated = _calibrate(subject, cfg, fit, say)
    say(
        f"[{subject.name}] oracle fitted and calibrated in {time.perf_counter() - t0:.1f}s "
        f"(val accuracy {float((fit.val_pred.predicted == subject.val_y).mean()):.3f}, "
        f"calibration split {len(fit.cal_idx)} with {int((fit.cal_pred.predicted != fit.cal_y).sum())} errors)"
    )
    assert calibrated[0][0].name == "none"  # the label-free variant comes first
    records: list[Record] = []
    for sc in scenarios_for(subject):
        records += _scenario_records(subject, cfg, sc, test_x, tdi, calibrated, say)
    return records
