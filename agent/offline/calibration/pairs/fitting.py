"""A challenger's pair with its champion, calibrated at the challenger's ``fit``: the disagreement model,
the window correction and the model-error term of the paired difference
(:class:`~agent.estimation.pairs.calibration.PairCalibration`).

Both models run on the labeled validation split and on corrupted copies of it (the corruptions
``shift_aware`` learns from: :func:`~agent.offline.calibration.corruptions.iter_shifted_sets` for one
numeric tensor, :mod:`~agent.offline.calibration.input_corruptions` otherwise), each copy made once and
read by both. Only the two probability vectors are used, never an oracle verdict, so every validation
row is out of sample for both models (the champion's ADI forest was trained on part of that split).

* The disagreement model is fitted on every disagreement of the clean split and of the corrupted copies,
  the clean rows weighing as much in all as the corrupted ones.
* The model-error term is learnt out of kind: the corruption kinds are split into
  :attr:`~invariants.fit_params.CalibrationPlan.pair_folds` folds; per fold the model is refitted without
  its kinds (and without a fold of the clean rows), and windows drawn from the held-out kinds (one kind
  each, a fifth clean, a third under a random class prior) give their disagreement rate ``p``, mean ``g``,
  true mean ``d`` and the sampling variance the interval already carries.
* The window correction (least squares of the mean ``d`` on ``[1, ḡ, p, ḡp]``) is fitted on those windows;
  cross-fitted over the folds, its error ``e`` gives the model-error term: per disagreement-rate bin the
  :attr:`~invariants.fit_params.CalibrationPlan.pair_error_level` quantile of ``sqrt(max(e² − z²s², 0))``,
  never smaller for a higher rate.

A pair known by tables of predictions (no model to corrupt inputs for) is calibrated on the clean rows
alone: its error term covers the clean split's windows under class-prior shifts only
(``corrupted_sets == 0``, which reports mark).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from agent.errors import UserError
from agent.estimation.intervals import Z95
from agent.estimation.pairs.calibration import (
    P_EDGES,
    DisagreementModel,
    PairCalibration,
    pair_features,
    window_design,
)
from agent.model.classifier import OnnxClassifier
from agent.model.inputs import Inputs
from agent.offline.calibration.corruptions import iter_shifted_sets, schedule
from agent.offline.calibration.input_corruptions import InputCorruption, input_corruptions
from invariants.fit_params import CalibrationPlan

#: Share of the model-error windows drawn from the clean rows.
CLEAN_SHARE = 0.2
#: Share of the model-error windows drawn under a random class prior, and the Dirichlet concentrations.
PRIOR_SHARE = 1 / 3
PRIOR_CONCENTRATIONS = (0.5, 2.0, 5.0)
#: Fewest windows of a disagreement-rate bin for its own quantile (else the overall one).
MIN_BIN_WINDOWS = 20


@dataclass(frozen=True)
class PairedSet:
    """One labeled set run through both models: its name (corruption kind; ``clean``), both probability
    vectors ``[N, K]``, both predicted classes and the true classes."""

    name: str
    prob_a: np.ndarray
    prob_b: np.ndarray
    y: np.ndarray
    label_a: np.ndarray
    label_b: np.ndarray

    @classmethod
    def of(
        cls,
        name: str,
        prob_a: np.ndarray,
        prob_b: np.ndarray,
        y: np.ndarray,
        label_a: np.ndarray | None = None,
        label_b: np.ndarray | None = None,
    ) -> PairedSet:
        la = np.asarray(prob_a).argmax(1) if label_a is None else np.asarray(label_a)
        lb = np.asarray(prob_b).argmax(1) if label_b is None else np.asarray(label_b)
        return cls(name, np.asarray(prob_a), np.asarray(prob_b), np.asarray(y), la, lb)

    def take(self, rows: np.ndarray) -> PairedSet:
        return PairedSet(
            self.name, self.prob_a[rows], self.prob_b[rows], self.y[rows], self.label_a[rows], self.label_b[rows]
        )

    def outcome(self) -> tuple[np.ndarray, np.ndarray]:
        """Disagreement mask and ``d = 1{B right} − 1{A right}`` per row."""
        d = (self.label_b == self.y).astype(np.int64) - (self.label_a == self.y).astype(np.int64)
        return self.label_a != self.label_b, d

    def features(self, rows: np.ndarray) -> np.ndarray:
        return pair_features(self.prob_a[rows], self.prob_b[rows], self.label_a[rows], self.label_b[rows])


def fit_disagreement_model(
    features: np.ndarray, outcome: np.ndarray, weight: np.ndarray | None = None, ridge: float = 1e-3
) -> DisagreementModel:
    """Penalised maximum likelihood (Newton–Raphson, at most 50 steps) on disagreements: ``outcome`` is
    ``d`` (−1: A right, +1: B right, 0: neither); ``weight`` per row (default 1)."""
    x = np.asarray(features, dtype=np.float64)
    d = np.asarray(outcome).reshape(-1)
    w = np.ones(len(d)) if weight is None else np.asarray(weight, dtype=np.float64)
    k = x.shape[1]
    if len(d) == 0:  # a model paired with itself never disagrees
        return DisagreementModel((0.0,) * k, (0.0,) * k)
    y = np.column_stack([d == -1, d == 1]).astype(np.float64)
    total = float(w.sum())
    pen = ridge * total * np.diag(np.r_[0.0, np.ones(k - 1)])
    beta = np.zeros((2, k))
    share = np.clip((w[:, None] * y).sum(0) / total, 0.5 / total, 1.0)
    beta[:, 0] = np.log(share / max(1.0 - share.sum(), 0.5 / total))
    for _ in range(50):
        z = x @ beta.T
        top = np.maximum(z.max(1), 0.0)
        e = np.exp(z - top[:, None])
        p = e / (e.sum(1) + np.exp(-top))[:, None]
        grad = np.concatenate([x.T @ (w * (y[:, j] - p[:, j])) - pen @ beta[j] for j in range(2)])
        hess = np.zeros((2 * k, 2 * k))
        for i in range(2):
            for j in range(2):
                c = p[:, i] * ((i == j) - p[:, j])
                hess[i * k : (i + 1) * k, j * k : (j + 1) * k] = (x * (w * c)[:, None]).T @ x
        hess += np.kron(np.eye(2), pen) + 1e-9 * np.eye(2 * k)
        step = np.linalg.solve(hess, grad)
        beta += step.reshape(2, k)
        if float(np.abs(step).max()) < 1e-8:
            break
    return DisagreementModel(tuple(float(v) for v in beta[0]), tuple(float(v) for v in beta[1]))


def _rows(clean: PairedSet, shifted: list[PairedSet]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features, outcomes and weights of every disagreement: the clean rows weigh as much in all as the
    corrupted ones (in-distribution traffic matters as much as every drift together)."""
    feats, outs, sizes = [], [], []
    for s in [clean, *shifted]:
        dis, d = s.outcome()
        rows = np.flatnonzero(dis)
        feats.append(s.features(rows))
        outs.append(d[rows])
        sizes.append(len(rows))
    n_clean, n_shifted = float(sizes[0]), float(sum(sizes[1:]))
    scale = n_shifted / n_clean if n_clean and n_shifted else 1.0
    weights = [np.full(n, scale if i == 0 else 1.0) for i, n in enumerate(sizes)]
    return np.concatenate(feats), np.concatenate(outs), np.concatenate(weights)


def _model(clean: PairedSet, shifted: list[PairedSet]) -> DisagreementModel:
    return fit_disagreement_model(*_rows(clean, shifted))


def _window(
    rng: np.random.Generator, sets: list[PairedSet], clean: PairedSet, plan: CalibrationPlan
) -> tuple[PairedSet, np.ndarray]:
    """A window of rows of one set (a fifth of them clean), a third under a Dirichlet class prior. Single-kind
    windows, as a live drift is: a mixture would average the kinds' errors away."""
    size = int(rng.integers(plan.pair_window_size[0], plan.pair_window_size[1] + 1))
    s = clean if rng.uniform() < CLEAN_SHARE or not sets else sets[int(rng.integers(len(sets)))]
    if rng.uniform() < PRIOR_SHARE:
        prior = rng.dirichlet(np.full(s.prob_a.shape[1], float(rng.choice(PRIOR_CONCENTRATIONS))))
        p = prior[s.y]
        return s, rng.choice(len(s.y), size, p=p / p.sum())
    return s, rng.integers(0, len(s.y), size)


def _error_table(p: np.ndarray, need: np.ndarray, level: float) -> tuple[float, ...]:
    """The ``level`` quantile of the needed model error per disagreement-rate bin (the overall one where a
    bin has fewer than :data:`MIN_BIN_WINDOWS` windows), never smaller for a higher rate (more disagreement,
    more shift)."""
    bins = np.searchsorted(np.asarray(P_EDGES), p, side="right")
    overall = float(np.quantile(need, level)) if len(need) else 1.0
    table = [
        float(np.quantile(need[bins == b], level)) if int((bins == b).sum()) >= MIN_BIN_WINDOWS else overall
        for b in range(len(P_EDGES) + 1)
    ]
    return tuple(float(v) for v in np.maximum.accumulate(table))


def _least_squares(x: np.ndarray, t: np.ndarray, ridge: float = 1e-3) -> np.ndarray:
    if len(t) < x.shape[1]:
        return np.r_[0.0, 1.0, np.zeros(x.shape[1] - 2)]
    penalty = ridge * len(t) * np.diag(np.r_[0.0, np.ones(x.shape[1] - 1)])
    return np.asarray(np.linalg.solve(x.T @ x + penalty, x.T @ t))


#: One model-error window: its fold, disagreement rate, mean g, mean d and the sampling variance of its mean.
_WindowRow = tuple[int, float, float, float, float]


def _fold_windows(
    fold: int,
    model: DisagreementModel,
    held: list[PairedSet],
    test_clean: PairedSet,
    plan: CalibrationPlan,
    rng: np.random.Generator,
) -> list[_WindowRow]:
    """The model-error windows of one fold, from the sets the fold's model was not fitted on."""
    cache = {}
    for s in [test_clean, *held]:
        dis, d = s.outcome()
        rows = np.flatnonzero(dis)
        g, var = np.zeros(len(d)), np.zeros(len(d))
        if len(rows):
            qa, qb = model.predict(s.features(rows))
            g[rows] = qb - qa
            var[rows] = qa + qb - (qb - qa) ** 2
        cache[id(s)] = (dis, d, g, var)
    out: list[_WindowRow] = []
    for _ in range(plan.pair_windows_per_fold):
        s, i = _window(rng, held, test_clean, plan)
        dis_s, d_s, g_s, var_s = cache[id(s)]
        dis = dis_s[i]
        if not dis.any():
            continue
        d, g, var = d_s[i][dis], g_s[i][dis], var_s[i][dis]
        out.append((fold, len(d) / len(dis), float(g.mean()), float(d.mean()), float(var.sum()) / len(d) ** 2))
    return out


def fit_pair(
    clean: PairedSet,
    shifted: list[PairedSet],
    *,
    seed: int = 0,
    plan: CalibrationPlan = CalibrationPlan(),
    level: float | None = None,
    champion_sha256: str | None = None,
    z: float = Z95,
) -> PairCalibration:
    """The pair's calibration from the clean validation split and its corrupted copies (module docstring);
    ``level`` defaults to the plan's :attr:`~invariants.fit_params.CalibrationPlan.pair_error_level`."""
    level = plan.pair_error_level if level is None else level
    rng = np.random.default_rng(seed)
    model = _model(clean, shifted)
    folds = plan.pair_folds
    kinds = sorted({s.name for s in shifted})
    fold_of_kind = {k: i % folds for i, k in enumerate(rng.permutation(kinds))}
    clean_fold = rng.integers(0, folds, len(clean.y))
    rows: list[_WindowRow] = []
    for fold in range(folds):
        held = [s for s in shifted if fold_of_kind[s.name] == fold]
        inside = [s for s in shifted if fold_of_kind[s.name] != fold]
        keep = clean_fold != fold
        if not keep.any() or keep.all():
            continue
        fold_model = _model(clean.take(np.flatnonzero(keep)), inside)
        rows += _fold_windows(fold, fold_model, held, clean.take(np.flatnonzero(~keep)), plan, rng)
    dis_rate = float(clean.outcome()[0].mean()) if len(clean.y) else 0.0
    meta = {
        "champion_sha256": champion_sha256,
        "level": level,
        "corrupted_sets": len(shifted),
        "rows": len(clean.y),
        "disagreement_rate": dis_rate,
    }
    if not rows:  # too few rows or no disagreement anywhere: the worst-case bracket
        return PairCalibration(model, (1.0,) * (len(P_EDGES) + 1), **meta)  # type: ignore[arg-type]
    fold_w, p, g_bar, truth, s2 = (np.asarray(c) for c in zip(*rows, strict=True))
    x = window_design(g_bar, p)
    e = np.empty(len(truth))
    for fold in range(folds):  # the window correction cross-fitted over the folds for the error term
        out = fold_w == fold
        if out.any():
            e[out] = truth[out] - np.clip(x[out] @ _least_squares(x[~out], truth[~out]), -1.0, 1.0)
    need = np.sqrt(np.maximum(e * e - z * z * s2, 0.0))
    window = tuple(float(c) for c in _least_squares(x, truth))
    return PairCalibration(model, _error_table(p, need, level), window, **meta)  # type: ignore[arg-type]


# -- running both models over the validation split and its corrupted copies -----------------------------


def _check_pair(champion: OnnxClassifier, challenger: OnnxClassifier) -> None:
    """Both versions must read the same inputs and predict the same classes."""
    if champion.n_classes != challenger.n_classes:
        raise UserError(
            f"the champion predicts {champion.n_classes} classes and the challenger {challenger.n_classes}: "
            "versions compared on the same inputs must share their classes"
        )
    a, b = champion.signature, challenger.signature
    if [(s.name, s.shape) for s in a.inputs] != [(s.name, s.shape) for s in b.inputs]:
        raise UserError(
            "the champion and the challenger read different inputs "
            f"({[s.name for s in a.inputs]} vs {[s.name for s in b.inputs]}): compare versions of one model"
        )


def _both(champion: OnnxClassifier, challenger: OnnxClassifier, x: Inputs | np.ndarray) -> tuple[np.ndarray, ...]:
    pa, pb = champion.predict_prepared(x), challenger.predict_prepared(x)
    return pa.probabilities, pb.probabilities, pa.predicted, pb.predicted


def _batched(
    champion: OnnxClassifier,
    challenger: OnnxClassifier,
    x: Inputs,
    transform: Callable[[Inputs], Inputs] | None = None,
) -> tuple[np.ndarray, ...]:
    """Both models on ``x`` a batch at a time (each batch changed once by ``transform``, read by both)."""
    parts: list[tuple[np.ndarray, ...]] = []
    for batch in x.batches(challenger.signature.batch_rows()):
        parts.append(_both(champion, challenger, transform(batch) if transform is not None else batch))
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))


def _at(corrupt: InputCorruption, strength: float, rng: np.random.Generator) -> Callable[[Inputs], Inputs]:
    """``corrupt`` at one strength, as a change of each batch (drawing from the fit's ``rng``)."""
    return lambda batch: corrupt(batch, strength, rng)


def _paired(name: str, outputs: tuple[np.ndarray, ...], y: np.ndarray) -> PairedSet:
    prob_a, prob_b, label_a, label_b = outputs
    return PairedSet(name, prob_a, prob_b, np.asarray(y), label_a, label_b)


def paired_sets(
    champion: OnnxClassifier,
    challenger: OnnxClassifier,
    val_x: Inputs,
    val_y: np.ndarray,
    train_x: Inputs,
    *,
    n_sets: int | None,
    seed: int,
) -> tuple[PairedSet, Iterator[PairedSet]]:
    """The clean validation split and its corrupted copies (made one at a time, as they are read) through
    both models. ``val_x`` and ``train_x`` are prepared for the challenger (the champion reads the same)."""
    _check_pair(champion, challenger)
    clean = _paired("clean", _batched(champion, challenger, val_x), val_y)
    single = challenger.signature.single
    if single is not None and not single.is_string and single.fixed:
        xs = val_x[single.name]
        sets = iter_shifted_sets(xs, challenger.input_shape, train_x=train_x[single.name], n_sets=n_sets, seed=seed)

        def tensor_copies() -> Iterator[PairedSet]:
            for s in sets:
                x = challenger.prepare_file(s.x.astype(xs.dtype, copy=False))
                yield _paired(s.name, _batched(champion, challenger, x), val_y)

        return clean, tensor_copies()
    corruptions = input_corruptions(challenger, train_x)
    rng = np.random.default_rng(seed)

    def input_copies() -> Iterator[PairedSet]:
        for name, strength in schedule(sorted(corruptions), n_sets, rng) if corruptions else []:
            yield _paired(name, _batched(champion, challenger, val_x, _at(corruptions[name], strength, rng)), val_y)

    return clean, input_copies()
