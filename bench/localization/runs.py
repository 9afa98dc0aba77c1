"""The localization benchmark's harness: real models of the zoo fitted as ``icos-agent fit`` fits them, a fault
injected into the inputs of one segment, and every window's segment table read against the truth.

A *subject* is a zoo model with its bundle (:func:`fit_subject`). A *fault* picks the rows it breaks from
the subject's test split (by their segment on the clean inputs, or by their true class) and breaks them
(:data:`FAULTS`): a numeric column zeroed in the rows of one category of a table (a broken upstream field), a
new subpopulation (a category value never seen at fit), one class's inputs corrupted, the inputs of one
region of an image or text view degraded, a text source whose vocabulary changed. The *target* is the segment
the fault was injected into (for a corrupted class: the region holding most of that class's clean inputs).

The faulted split and the clean one are predicted and judged once (:class:`Pool`); each window then draws
``size`` rows of a pool with replacement and reads them as an agent's window would (the additive statistics
of :class:`~agent.estimation.statistics.window.WindowStats`, the estimates, the headline and the segment table,
:func:`~agent.estimation.segments.table.segment_table`), against the true accuracy of each segment's rows in
the window. Every rule of the scoring (:class:`Outcome`) is fixed here, whatever the faults: the target
ranked first, in the top two, its estimate within 0.05 of its true accuracy; on clean windows, the largest
contribution of any segment. Windows of a shift of every row (each of the zoo's shifts) must read as a change
across the traffic (:mod:`agent.estimation.segments.scope`), and the faulted ones as a change in a few segments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.data.files import Dataset
from agent.estimation.calibration import EstimatorCalibration
from agent.estimation.estimators.active import DEFAULT_FLOOR, rate_for, spread_probabilities, uncertainty
from agent.estimation.estimators.registry import estimate_window, headline_estimator, headline_of
from agent.estimation.intervals import Estimate
from agent.estimation.segments.realized import SegmentLabels
from agent.estimation.segments.segmentation import Segmentation, truth_counts
from agent.estimation.segments.table import SegmentTable, segment_table
from agent.estimation.statistics.window import WindowStats
from agent.labels.change_focus import focus_factors, focus_weights
from agent.model.classifier import OnnxClassifier
from agent.offline.check import judge
from agent.offline.fit import fit_bundle
from bench.zoo import Split, ZooModel, build
from invariants.bundle import Bundle
from invariants.fit_params import FitParams

#: How close a segment's estimate must be to its true accuracy (the issue's target).
ESTIMATE_TOLERANCE = 0.05
#: The largest contribution a clean window's segments may show (the issue's target).
CLEAN_CONTRIBUTION = 0.02
#: Labels drawn per window for the realized accuracy of the target (the issue's target).
LABELS = 100
#: Labels per window the target's realized interval is also measured at, drawn where the changes are (the curve
#: on which the labels that match :data:`LABELS` uniform draws' interval are interpolated).
FOCUS_GRID = (10, 15, 25, 35, 50, 70, 100)
#: The half-width of a realized interval that has no label (its accuracy anywhere in [0, 1]).
NO_LABEL_HALF = 0.5
#: The strength (of 1) of the zoo's shifts applied to every row of the test split: each window of them is a change
#: across the traffic, which the table must not offer as one segment's.
EVERY_ROW_STRENGTH = 1.0


@dataclass(frozen=True)
class Subject:
    """A zoo model, its loaded classifier and its bundle fitted as ``icos-agent fit`` fits it."""

    zoo: ZooModel
    model: OnnxClassifier
    bundle: Bundle
    calibration: EstimatorCalibration
    fit_seconds: float

    @property
    def name(self) -> str:
        return self.zoo.name

    @property
    def segments(self) -> Segmentation:
        seg = self.calibration.segments
        assert seg is not None, f"{self.name}: the bundle has no segments"
        return seg


def fit_subject(name: str, workdir: str, params: FitParams, sizes: tuple[int, int, int] | None = None) -> Subject:
    """Build zoo model ``name`` (cached in ``workdir``) and fit its bundle."""
    import time

    zoo = build(name, workdir, seed=params.seed, **({"sizes": sizes} if sizes else {}))
    model = OnnxClassifier.load(
        zoo.path, name=name, scores_output=zoo.scores_output, scores_kind=zoo.scores_kind, classes=list(zoo.classes)
    )
    started = time.perf_counter()
    report = fit_bundle(
        model, Dataset(zoo.train.inputs, zoo.train.y), Dataset(zoo.val.inputs, zoo.val.y), params=params
    )
    return Subject(zoo, model, report.bundle, report.calibration, time.perf_counter() - started)


@dataclass(frozen=True)
class Pool:
    """A split predicted and judged once: what every window draws its rows from."""

    verdicts: np.ndarray
    confidences: np.ndarray
    probabilities: np.ndarray
    predicted: np.ndarray
    features: np.ndarray
    rules: np.ndarray | None
    correct: np.ndarray
    ids: np.ndarray

    @classmethod
    def of(cls, subject: Subject, split: Split) -> Pool:
        judged = judge(subject.model, subject.bundle, split.inputs)
        pred = judged.prediction
        assert judged.features is not None
        ids = subject.segments.ids(judged.features, pred.predicted, judged.tdi_rules, len(split))
        return cls(
            np.asarray(judged.result.verdict),
            np.asarray(pred.confidences, dtype=np.float64),
            pred.probabilities,
            pred.predicted,
            judged.features,
            judged.tdi_rules,
            pred.predicted == split.y,
            ids,
        )


def segment_rows(subject: Subject, split: Split, segment: int) -> np.ndarray:
    """The rows of ``split`` in ``segment`` on their clean inputs."""
    pool = Pool.of(subject, split)
    return np.flatnonzero(pool.ids[subject.segments.dimension_of(segment)] == segment)


# -- faults ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Injected:
    """A fault as injected: the faulted split, the rows it broke and the segment it was injected into."""

    split: Split
    rows: np.ndarray
    target: int
    #: how it broke the inputs, where the fault has several ways
    how: str = ""


#: ``fault(subject, split, rng) -> [Injected]``: one injection per target the fault tries.
Fault = Callable[[Subject, Split, np.random.Generator], list[Injected]]


def _targets(
    seg: Segmentation, wanted: Callable[[int], bool], count: int, rng: np.random.Generator, min_share: float = 0.05
) -> list[int]:
    """Up to ``count`` segments of the dimensions ``wanted`` (by index) holding at least ``min_share`` of the
    validation data, drawn at random (seeded)."""
    ref = seg.reference
    found = []
    for d, (_, a, b) in enumerate(seg.spans()):
        if wanted(d):
            total = max(sum(ref.n[a:b]), 1)
            found += [s for s in range(a, b) if ref.n[s] / total >= min_share]
    if not found:
        return []
    return sorted(int(s) for s in rng.choice(found, size=min(count, len(found)), replace=False))


def _kind(seg: Segmentation, kind: str) -> Callable[[int], bool]:
    return lambda d: seg.dimensions[d].kind == kind


def _with_rows(split: Split, rows: np.ndarray, name: str, values: np.ndarray) -> Split:
    column = split.inputs[name].copy()
    column[rows] = values
    return split.with_inputs(**{name: column})


def _break(column: np.ndarray, rows: np.ndarray, how: str, rng: np.random.Generator, other: np.ndarray) -> np.ndarray:
    """``column`` (one value per row, or ``[N, 1]``) broken in ``rows``: ``zeroed`` (a null read as 0),
    ``scaled`` (a unit changed upstream: ×100), ``shuffled`` (a join gone wrong: the values of other rows),
    ``swapped`` (another column's values in its place: ``other``) or ``stuck`` (a sensor stuck at the value it
    had in the first broken row)."""
    out = column.copy()
    if how == "zeroed":
        out[rows] = 0
    elif how == "scaled":
        out[rows] = column[rows] * 100
    elif how == "shuffled":
        out[rows] = column[rng.permutation(rows)]
    elif how == "swapped":
        out[rows] = other[rows].reshape(out[rows].shape).astype(out.dtype)
    else:
        out[rows] = column[rows[0]] if len(rows) else 0
    return out


#: How a broken column breaks, one after the other over a fault's targets.
BREAKS = ("zeroed", "scaled", "shuffled", "swapped", "stuck")


def _costliest(zoo: ZooModel, candidates: Sequence[Any], breaking: Callable[[Split, Any], Split]) -> Any:
    """The candidate column whose zeroing costs the model the most accuracy on the validation data."""
    return min(candidates, key=lambda c: zoo.accuracy(breaking(zoo.val, c)))


def broken_column(subject: Subject, split: Split, rng: np.random.Generator) -> list[Injected]:
    """A table's numeric column broken (:func:`_break`) in the rows of one category of its most class-informative
    categorical column; the column broken is the one whose zeroing costs the model the most accuracy on the
    validation data."""
    seg = subject.segments
    numeric = [n for n in subject.zoo.input_names if split.inputs[n].dtype.kind in "fiu"]
    categorical = [i for i, d in enumerate(seg.dimensions) if d.kind == "column" and d.source in ("onehot", "values")]
    if not numeric or not categorical:
        return []
    worst = _costliest(subject.zoo, numeric, lambda sp, n: _with_rows(sp, np.arange(len(sp)), n, 0))
    other = split.inputs[next((n for n in numeric if n != worst), worst)]
    out = []
    for i, target in enumerate(_targets(seg, lambda d: d == categorical[0], len(BREAKS), rng)):
        rows = segment_rows(subject, split, target)
        how = BREAKS[i % len(BREAKS)]
        broken = _break(split.inputs[worst], rows, how, rng, other).astype(split.inputs[worst].dtype)
        out.append(Injected(split.with_inputs(**{worst: broken}), rows, target, how))
    return out


def broken_column_in_bin(subject: Subject, split: Split, rng: np.random.Generator) -> list[Injected]:
    """A table of numeric columns only: one column broken (:func:`_break`) in the rows of one quantile bin of
    another."""
    seg = subject.segments
    (name,) = subject.zoo.input_names
    x = split.inputs[name]
    if x.ndim != 2:
        return []

    def zeroed(sp: Split, j: int) -> Split:
        v = sp.inputs[name].copy()
        v[:, j] = 0
        return sp.with_inputs(**{name: v})

    worst = _costliest(subject.zoo, range(x.shape[1]), zeroed)
    other = x[:, (worst + 1) % x.shape[1]]
    out: list[Injected] = []
    for target in _targets(seg, _kind(seg, "column"), 2 * len(BREAKS), rng, min_share=0.15):
        dim = seg.dimensions[seg.dimension_of(target)]
        if dim.columns == (worst,) or len(out) == len(BREAKS):
            continue
        rows = segment_rows(subject, split, target)
        broken = x.copy()
        how = BREAKS[len(out) % len(BREAKS)]
        broken[:, worst] = _break(x[:, worst], rows, how, rng, other)
        out.append(Injected(split.with_inputs(**{name: broken}), rows, target, how))
    return out


def new_subpopulation(subject: Subject, split: Split, rng: np.random.Generator) -> list[Injected]:
    """A fifth of the rows come from a population never seen at fit: their category of the table's
    first categorical column is a new value (target: that column's ``unseen at fit`` segment)."""
    seg = subject.segments
    onehot = [d for d in seg.dimensions if d.kind == "column" and d.source == "onehot"]
    if not onehot:
        return []
    dim = onehot[0]
    target = seg.offsets[seg.dimensions.index(dim)] + len(dim.segments) - 1
    rows = np.sort(rng.choice(len(split), size=len(split) // 5, replace=False))
    values = np.array([f"new_{dim.name}_{i}" for i in range(len(rows))], dtype=object).reshape(-1, 1)
    column = split.inputs[dim.name].copy()
    column[rows] = values
    return [Injected(split.with_inputs(**{dim.name: column}), rows, target)]


def _region_of(subject: Subject, split: Split, rows: np.ndarray) -> int | None:
    """The region holding most of ``rows`` on their clean inputs."""
    seg = subject.segments
    regions = [i for i, d in enumerate(seg.dimensions) if d.kind == "region"]
    if not regions:
        return None
    pool = Pool.of(subject, split)
    ids = pool.ids[regions[0], rows]
    return int(np.bincount(ids).argmax())


def _shifted(subject: Subject, split: Split, rows: np.ndarray, kind: str, strength: float, seed: int) -> Split:
    """``split`` with the zoo's shift ``kind`` applied to ``rows`` only."""
    part = subject.zoo.shift(split.take(rows), strength, seed, kind)
    return split.with_inputs(**{k: _put(v, rows, part.inputs[k]) for k, v in split.inputs.items()})


def _put(column: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = column.copy()
    out[rows] = values
    return out


def degraded_region(kind: str, strength: float) -> Fault:
    """The inputs of one region of the view degraded by the zoo's shift ``kind`` (images: blur or brightness;
    text: a source whose vocabulary changed)."""

    def fault(subject: Subject, split: Split, rng: np.random.Generator) -> list[Injected]:
        out = []
        for target in _targets(subject.segments, _kind(subject.segments, "region"), 3, rng, min_share=0.08):
            rows = segment_rows(subject, split, target)
            seed = int(rng.integers(1 << 30))
            out.append(Injected(_shifted(subject, split, rows, kind, strength, seed), rows, target))
        return out

    fault.__name__ = f"region_{kind}"
    return fault


def corrupted_class(kind: str, strength: float) -> Fault:
    """The inputs of one true class corrupted by the zoo's shift ``kind`` (target: the region holding most of
    that class's clean inputs)."""

    def fault(subject: Subject, split: Split, rng: np.random.Generator) -> list[Injected]:
        out = []
        classes = rng.choice(len(subject.zoo.classes), size=min(3, len(subject.zoo.classes)), replace=False)
        for c in sorted(int(c) for c in classes):
            rows = np.flatnonzero(split.y == c)
            target = _region_of(subject, split, rows)
            if target is None:
                continue
            seed = int(rng.integers(1 << 30))
            out.append(Injected(_shifted(subject, split, rows, kind, strength, seed), rows, target))
        return out

    fault.__name__ = f"class_{kind}"
    return fault


# -- windows --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One window read against the truth: where the target ranked, its label-free estimate (and whether it said
    it could give one), its realized accuracy from :data:`LABELS` labels drawn as the agent's stratified draws
    draw them, its true accuracy, and, for the whole window, the largest contribution of any segment and whether
    any segment was reported changed (clean windows: ``target`` is -1)."""

    model: str
    fault: str
    target: int
    target_name: str
    rank: int
    estimate: Estimate | None
    estimable: bool
    realized: float | None
    realized_n: int
    truth: float | None
    top: str
    top_contribution: float
    any_changed: bool
    window_truth: float
    window_headline: float | None
    retained: float = 1.0
    #: the window's change read as across the traffic (:mod:`agent.estimation.segments.scope`)
    widespread: bool = False
    #: the half-width of the target's realized interval from labels drawn where the changes are, at every count
    #: of :data:`FOCUS_GRID`, and from :data:`LABELS` uniform draws (:class:`Window`)
    focused_halves: tuple[float, ...] = ()
    uniform_half: float = NO_LABEL_HALF

    @property
    def first(self) -> bool:
        return self.rank == 1

    @property
    def top_two(self) -> bool:
        return 1 <= self.rank <= 2

    @property
    def close(self) -> bool:
        """Its realized accuracy from the labels drawn within the tolerance of its truth."""
        return (
            self.realized is not None
            and self.truth is not None
            and abs(self.realized - self.truth) <= ESTIMATE_TOLERANCE
        )

    @property
    def honest(self) -> bool:
        """Its label-free interval covers its truth, or it said it cannot be estimated label-free."""
        if not self.estimable or self.estimate is None:
            return True
        return self.truth is not None and self.estimate.lower <= self.truth <= self.estimate.upper

    @property
    def quiet(self) -> bool:
        """A clean window's verdict: no segment reported changed, none contributing above the tolerance."""
        return not self.any_changed and self.top_contribution <= CLEAN_CONTRIBUTION


@dataclass(frozen=True)
class Window:
    """A window as the agent reads it (its segment table) and as the truth is: its rows' accuracy, the labels
    drawn in it."""

    table: SegmentTable
    truth: float
    headline: float | None
    labels: SegmentLabels
    #: labels drawn where the changes are at every count of :data:`FOCUS_GRID`, then :data:`LABELS` uniform ones
    #: (drawn from a generator of their own, so that measuring them leaves every other draw as it was)
    curve: tuple[SegmentLabels, ...] = ()


def read_window(
    subject: Subject,
    pool: Pool,
    rows: np.ndarray,
    rng: np.random.Generator,
    curve_rng: np.random.Generator | None = None,
) -> Window:
    """The segment table of a window of ``pool``'s ``rows`` as an agent reads it, the window's true accuracy, its
    headline estimate and :data:`LABELS` labels drawn where the stratified draws put them
    (:func:`draw_labels`); with ``curve_rng``, the :attr:`Window.curve` draws too."""
    cal, seg = subject.calibration, subject.segments
    stats = WindowStats.from_batch(
        pool.verdicts[rows],
        pool.confidences[rows],
        cal,
        probabilities=pool.probabilities[rows],
        labels=pool.predicted[rows],
        features=pool.features[rows],
        tdi_rules=None if pool.rules is None else pool.rules[rows],
    )
    estimates = estimate_window(stats, cal).estimates
    lead = headline_of(estimates, headline_estimator(subject.bundle.headline))
    headline = lead[1] if lead is not None else None
    truth = truth_counts(pool.ids[:, rows], seg.size, pool.correct[rows])
    table = segment_table(stats, cal, estimates, truth=truth)
    assert table is not None
    labels = draw_labels(subject, pool, rows, table, rng)
    curve: tuple[SegmentLabels, ...] = ()
    if curve_rng is not None:
        curve = tuple(draw_labels(subject, pool, rows, table, curve_rng, n) for n in FOCUS_GRID)
        curve += (draw_labels(subject, pool, rows, table, curve_rng, LABELS, focused=False),)
    headline_value = None if headline is None else headline.value
    return Window(table, float(pool.correct[rows].mean()), headline_value, labels, curve)


def draw_labels(
    subject: Subject,
    pool: Pool,
    rows: np.ndarray,
    table: SegmentTable,
    rng: np.random.Generator,
    count: int = LABELS,
    *,
    focused: bool = True,
) -> SegmentLabels:
    """``count`` labels of the window's rows (in expectation), drawn as the agent's stratified draws draw them
    before any label came back (each prediction's calibrated uncertainty, times its focus where the inputs changed,
    :mod:`agent.labels.change_focus`, at the default floor), with their inverse probabilities as weights; not
    ``focused``: uniform draws (every row at the same probability)."""
    ids = pool.ids[:, rows]
    if focused:
        f = subject.calibration.predicted_correct(pool.confidences[rows], pool.verdicts[rows])
        u = uncertainty(f)
        focus = focus_factors(ids, focus_weights(table.rows), len(rows))
        g = np.ones(len(rows)) if focus is None else focus
        rate = rate_for(f, count / len(rows), float(u.mean()), DEFAULT_FLOOR, spread=u, focus=g)
        pi = spread_probabilities(u, rate, float(u.mean()), DEFAULT_FLOOR, g, float(g.mean()))
    else:
        pi = np.full(len(rows), min(count / len(rows), 1.0))
    drawn = rng.random(len(rows)) < pi
    return SegmentLabels.of(ids[:, drawn], subject.segments.size, pool.correct[rows][drawn], 1.0 / pi[drawn])


def outcome(subject: Subject, fault: str, window: Window, target: int) -> Outcome:
    table = window.table
    ranked = [r.index for r in table.rows]
    row = next((r for r in table.rows if r.index == target), None) if target >= 0 else None
    top = table.rows[0]
    realized_n, realized = window.labels.estimate(target) if target >= 0 else (0, None)
    halves = tuple(_half_width(labels, target) for labels in window.curve) if target >= 0 else ()
    return Outcome(
        subject.name,
        fault,
        target,
        subject.segments.names()[target] if target >= 0 else "",
        ranked.index(target) + 1 if target in ranked else 0,
        None if row is None else row.estimate,
        row is not None and row.estimable,
        None if realized is None else realized.value,
        realized_n,
        None if row is None else row.truth_accuracy,
        top.name,
        max(r.contribution for r in table.rows),
        any(r.change.changed for r in table.rows),
        window.truth,
        window.headline,
        widespread=table.widespread,
        focused_halves=halves[: len(FOCUS_GRID)],
        uniform_half=halves[-1] if halves else NO_LABEL_HALF,
    )


def _half_width(labels: SegmentLabels, segment: int) -> float:
    """The half-width of ``segment``'s realized interval from ``labels`` (:data:`NO_LABEL_HALF` without one)."""
    _, est = labels.estimate(segment)
    return NO_LABEL_HALF if est is None else (est.upper - est.lower) / 2


@dataclass
class Run:
    """Every window of a benchmark run, and how long each subject's fit took."""

    faulted: list[Outcome] = field(default_factory=list)
    clean: list[Outcome] = field(default_factory=list)
    #: windows of the test split with one of the zoo's shifts applied to every row
    every_row: list[Outcome] = field(default_factory=list)
    fit_seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def run_subject(subject: Subject, faults: Sequence[Fault], *, reps: int, size: int, seed: int, run: Run) -> None:
    """Every fault of ``faults`` on ``subject``, ``reps`` windows of ``size`` rows each, and as many clean
    windows."""
    rng = np.random.default_rng([seed, 53])
    curve_rng = np.random.default_rng([seed, 59])
    split = subject.zoo.test
    clean = Pool.of(subject, split)
    for _ in range(reps):
        window = read_window(subject, clean, _rows_of(len(split), size, rng), rng)
        run.clean.append(outcome(subject, "clean", window, -1))
    for fault in faults:
        injected = fault(subject, split, rng)
        if not injected:
            run.notes.append(f"{subject.name}: {fault.__name__} has no segment to inject into")
        for inj in injected:
            pool = Pool.of(subject, inj.split)
            target, retained = live_target(subject, pool, inj)
            name = _moved(subject, inj.target, target)
            label = f"{fault.__name__} ({inj.how})" if inj.how else fault.__name__
            for _ in range(reps):
                window = read_window(subject, pool, _rows_of(len(split), size, rng), rng, curve_rng)
                o = outcome(subject, label, window, target)
                run.faulted.append(Outcome(**{**o.__dict__, "target_name": name, "retained": retained}))
    for kind in subject.zoo.shifts:  # a change of every row: across the traffic, in no one segment
        pool = Pool.of(subject, subject.zoo.shift(split, EVERY_ROW_STRENGTH, int(rng.integers(1 << 30)), kind))
        for _ in range(reps):
            window = read_window(subject, pool, _rows_of(len(split), size, rng), rng)
            run.every_row.append(outcome(subject, kind, window, -1))


def _rows_of(available: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """A window's rows: ``size`` distinct rows of the split, as live traffic brings each input once, at most half
    the split (so that windows differ: each is a random half or less of it)."""
    return np.sort(rng.choice(available, size=min(size, available // 2), replace=False))


def live_target(subject: Subject, pool: Pool, injected: Injected) -> tuple[int, float]:
    """The segment the agent finds most of the broken rows in, among those of the dimension the fault was
    injected into (the injected segment itself unless the fault moved its inputs, as a darkened image leaves
    its region), and the share of the broken rows in it."""
    dim = subject.segments.dimension_of(injected.target)
    ids = pool.ids[dim, injected.rows]
    if not len(ids):
        return injected.target, 0.0
    counts = np.bincount(ids)
    target = int(counts.argmax())
    return target, float(counts[target] / len(ids))


def _moved(subject: Subject, injected: int, live: int) -> str:
    names = subject.segments.names()
    return names[live] if live == injected else f"{names[injected]} -> {names[live]}"


#: The faults tried on each kind of model.
FAULTS: dict[str, tuple[Fault, ...]] = {
    "tabular": (broken_column, new_subpopulation),
    "numeric_table": (broken_column_in_bin,),
    "text": (degraded_region("vocabulary_drift", 1.0),),
    "image": (degraded_region("blur", 1.0), corrupted_class("brightness", 1.0)),
}
