"""The paired difference of every pair of a family over the estimator benchmark's scenarios.

Per family: every version's oracle is fitted as the estimator benchmark fits it (its calibrated
correctness, for the unpaired ``with_labels`` baseline, comes from it); the validation split and its
corrupted copies (:func:`~agent.offline.calibration.corruptions.iter_shifted_sets`, as ``fit --champion``
makes them) run through every version once; every pair is calibrated by the product's
:func:`~agent.offline.calibration.pairs.fitting.fit_pair`. Per scenario the benchmark's pool runs through every
version once and every pair is estimated on the same ``reps`` windows of ``size`` predictions
(:func:`bench.estimators.harness.draw_window`), against the window's true difference.

Designs recorded per window:

* ``label_free``: the agent's label-free interval (model-error term at the plan's 99% quantile);
* ``label_free_95``: the same with the model-error term at the 95% quantile;
* ``sampling_only``: the same without the model-error term (the disagreement model's sampling variance);
* ``with_labels``: the agent's label-assisted interval, every disagreement drawn with
  ``π = min(1, labels / n_D)``;
* ``unpaired_with_labels``: two ``with_labels`` (PPI++ with each version's calibrated correctness, the same
  ``labels`` uniform draws for both), their difference with the half-widths combined as independent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from agent.estimation.estimators.correctness import CorrectnessModel
from agent.estimation.estimators.prediction_powered import prediction_powered_of_sums
from agent.estimation.pairs.calibration import PairCalibration
from agent.estimation.pairs.paired import Difference, PairSums, label_free, with_labels
from agent.offline.calibration.corruptions import iter_shifted_sets
from agent.offline.calibration.pairs.fitting import PairedSet, fit_pair
from bench.challenger.pairs import Family, with_model
from bench.estimators.harness import Config, draw_window, fit_subject, scenario_pool, scenarios_for, stable_seed
from invariants.fit_params import CalibrationPlan
from invariants.oracle import Oracle

DESIGNS = ("label_free", "label_free_95", "sampling_only", "with_labels", "unpaired_with_labels")


@dataclass(frozen=True)
class Record:
    """One design's estimate of one window of one pair, with the window's true difference."""

    family: str
    pair: str
    scenario: str
    rep: int
    design: str
    value: float
    lower: float
    upper: float
    truth: float
    p_dis: float
    labels: int = 0

    @property
    def covered(self) -> bool:
        return self.lower - 1e-12 <= self.truth <= self.upper + 1e-12

    @property
    def wrong_call(self) -> bool:
        """The interval names a version better (excludes 0) that is not better on this window."""
        return (self.lower > 1e-12 and self.truth <= 0) or (self.upper < -1e-12 and self.truth >= 0)

    @property
    def call(self) -> bool:
        return self.lower > 1e-12 or self.upper < -1e-12


@dataclass(frozen=True)
class _Version:
    oracle: Oracle
    correctness: CorrectnessModel


def _fit_version(family: Family, name: str, cfg: Config) -> _Version:
    subject = with_model(family.subject, family.versions[name])
    fit = fit_subject(subject, cfg)
    m = subject.model
    res = fit.fitted.oracle.judge(m.features(fit.cal_x), fit.cal_pred.probabilities, fit.cal_pred.predicted)
    return _Version(
        fit.fitted.oracle,
        CorrectnessModel.fit(fit.cal_pred.confidences, fit.cal_pred.predicted == fit.cal_y, res.failed),
    )


def _ppi(f: np.ndarray, lab: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    e = prediction_powered_of_sums(
        len(f),
        float(f.sum()),
        float((f * f).sum()),
        len(lab),
        float(f[lab].sum()),
        float((f[lab] ** 2).sum()),
        float(y.sum()),
        float((y * f[lab]).sum()),
    )
    assert e is not None
    return e.value, 0.5 * (e.upper - e.lower)


@dataclass(frozen=True)
class _Window:
    """One window of a pair: both probability vectors, both calibrated correctness values and the truth."""

    pa: np.ndarray
    pb: np.ndarray
    fa: np.ndarray
    fb: np.ndarray
    right_a: np.ndarray
    right_b: np.ndarray

    @property
    def d(self) -> np.ndarray:
        return self.right_b.astype(np.int64) - self.right_a.astype(np.int64)

    @property
    def truth(self) -> float:
        return float(self.d.mean())

    @property
    def p(self) -> float:
        return float((self.pa.argmax(1) != self.pb.argmax(1)).mean())


@dataclass(frozen=True)
class _Calibrations:
    """One pair's calibrations: the agent's (99%), at 95%, and without the model-error term."""

    agent: PairCalibration
    at_95: PairCalibration

    @property
    def sampling(self) -> PairCalibration:
        return replace(self.agent, error=(0.0,) * len(self.agent.error))


def _estimates(w: _Window, cals: _Calibrations, labels: int, rng: np.random.Generator) -> list[tuple[str, Difference]]:
    """Every design's estimate of one window (see the module docstring)."""
    dis = cals.agent.disagreements(w.pa, w.pb)
    sums = PairSums.of_disagreements(len(w.pa), dis)
    out: list[tuple[str, Difference | None]] = [
        ("label_free", label_free(sums, cals.agent)),
        ("label_free_95", label_free(sums, cals.at_95)),
        ("sampling_only", label_free(sums, cals.sampling)),
    ]
    # labels: every disagreement drawn with π = min(1, labels / n_D) for the paired form ...
    labeled: Difference | None = Difference(0.0, 0.0, 0.0, len(w.pa))
    if sums.n_dis:
        pi = min(1.0, labels / sums.n_dis)
        drawn = rng.uniform(size=sums.n_dis) < pi
        d = w.d[dis.rows][drawn].astype(np.float64)
        lab = PairSums.of_labeled(dis.g[drawn], d, np.full(int(drawn.sum()), pi))
        labeled = with_labels(sums + lab) if drawn.any() else label_free(sums, cals.agent)
    out.append(("with_labels", labeled))
    # ... and ``labels`` uniform draws for the two unpaired with_labels
    lab_idx = rng.choice(len(w.pa), labels, replace=False)
    va, ha = _ppi(w.fa, lab_idx, w.right_a[lab_idx].astype(np.float64))
    vb, hb = _ppi(w.fb, lab_idx, w.right_b[lab_idx].astype(np.float64))
    h = math.hypot(ha, hb)
    out.append(("unpaired_with_labels", Difference(vb - va, vb - va - h, vb - va + h, len(w.pa), labels)))
    return [(name, e) for name, e in out if e is not None]


def run_family(
    name: str, family: Family, cfg: Config, labels: int = 100, say: Callable[[str], None] = print
) -> tuple[list[Record], dict[str, PairCalibration]]:
    """Every pair of ``family`` over every scenario (module docstring); the records and each pair's
    calibration."""
    t0 = time.perf_counter()
    s = family.subject
    versions = {v: _fit_version(family, v, cfg) for v in dict.fromkeys(x for p in family.pairs for x in p)}
    say(f"[{name}] {len(versions)} oracles fitted in {time.perf_counter() - t0:.0f}s")
    models = family.versions
    val_x, train_x = s.model.prepare_array(s.val_x), s.model.prepare_array(s.train_x)
    clean = {v: models[v].predict_batched(val_x) for v in versions}
    shifted = []
    shift_sets = cfg.fit.shift_sets
    for ss in iter_shifted_sets(val_x, s.model.input_shape, train_x=train_x, n_sets=shift_sets, seed=cfg.seed):
        x = ss.x.astype(val_x.dtype, copy=False)
        shifted.append((ss.name, {v: models[v].predict_batched(x) for v in versions}))
    say(f"[{name}] {len(shifted)} corrupted validation sets predicted ({time.perf_counter() - t0:.0f}s)")
    cals: dict[str, _Calibrations] = {}
    for a, b in family.pairs:
        key = f"{a}->{b}"
        cset = PairedSet.of("clean", clean[a].probabilities, clean[b].probabilities, s.val_y)
        sets = [PairedSet.of(n, p[a].probabilities, p[b].probabilities, s.val_y) for n, p in shifted]
        cals[key] = _Calibrations(fit_pair(cset, sets, seed=cfg.seed), fit_pair(cset, sets, seed=cfg.seed, level=0.95))
        say(f"[{name}] {key}: model error by disagreement rate {[round(e, 3) for e in cals[key].agent.error]}")
    say(f"[{name}] pairs calibrated ({time.perf_counter() - t0:.0f}s)")
    records: list[Record] = []
    test_x = s.model.prepare_array(s.test_x)
    for sc in scenarios_for(s):
        t1 = time.perf_counter()
        pool_x, pool_y, seg_len, class_index = scenario_pool(s, sc, cfg, test_x)
        probs, fs, rights = {}, {}, {}
        for v, ver in versions.items():
            pred = models[v].predict_batched(pool_x)
            failed = ver.oracle.judge(models[v].features(pool_x), pred.probabilities, pred.predicted).failed
            probs[v], rights[v] = pred.probabilities, (pred.predicted == pool_y)
            fs[v] = ver.correctness.predict(pred.confidences, failed)
        for rep in range(cfg.reps):
            idx = draw_window(
                np.random.default_rng(stable_seed(cfg.seed, s.name, sc.name, rep)), sc, cfg.size, seg_len, class_index
            )
            for a, b in family.pairs:
                key = f"{a}->{b}"
                rng = np.random.default_rng(stable_seed(cfg.seed, s.name, sc.name, rep, key, "labels"))
                win = _Window(probs[a][idx], probs[b][idx], fs[a][idx], fs[b][idx], rights[a][idx], rights[b][idx])
                for design, e in _estimates(win, cals[key], labels, rng):
                    records.append(
                        Record(name, key, sc.name, rep, design, e.value, e.lower, e.upper, win.truth, win.p, e.n_labels)
                    )
        say(f"[{name}] {sc.name:26s} ({time.perf_counter() - t1:.1f}s)")
    return records, {k: c.agent for k, c in cals.items()}


def plan_level() -> float:
    """The model-error quantile the agent's calibration uses (the ``label_free`` design)."""
    return CalibrationPlan().pair_error_level
