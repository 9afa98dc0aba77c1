"""The parameters of one fit, each default stated once (ICOS paper §5.4, Tables 4 and 5), and the sizes of
its calibration (:class:`CalibrationPlan`).

:class:`FitParams` is read by :func:`invariants.fitting.fit_oracle`, the model and table fits of the
agent, the ``icos-agent fit`` flags (generated from the fields: name, type, default and help), the
bundle manifest (``fit_params`` records every field that applies to the bundle's source, under the
field's name) and the generated CLI reference (every field with its docstring). A new knob is one
field here, with its docstring, plus the code that reads it.

Field metadata (set with :func:`knob`): ``help``, one line for the command line; ``flag``, the
flag's name where it is not the field's (also the name of the parameter in MLflow runs);
``when_none``, what a ``None`` default means; ``cite``, where the default comes from; ``applies``,
the sources (:data:`MODEL`, :data:`TABLE`) a field means something for.

:class:`CalibrationPlan` holds what is not a user's choice: how many samples, corrupted copies, windows,
folds and resamples the estimators' calibration draws, each with its reason. The offline calibration
(``agent/offline/calibration/``) and the fit's stages read them there and nowhere else.

This module imports nothing outside the standard library, so the command line can build its flags
without loading numpy.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import operator
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "MODEL",
    "SOURCES",
    "TABLE",
    "CalibrationPlan",
    "FitParams",
    "FitParamsError",
    "field_docs",
    "flag_name",
    "knob",
    "knobs",
]

#: A bundle fitted from an ONNX model and its training and validation data.
MODEL = "model"
#: A bundle fitted from a reference table of predictions (no model); recorded as ``source``.
TABLE = "table"
SOURCES = (MODEL, TABLE)

_T = TypeVar("_T")


def knob(
    default: _T,
    help: str,
    *,
    flag: str | None = None,
    when_none: str | None = None,
    cite: str | None = None,
    applies: tuple[str, ...] = SOURCES,
) -> _T:
    """A field of :class:`FitParams` with its command-line metadata (see the module docstring)."""
    unknown = set(applies) - set(SOURCES)
    if unknown or not applies:
        raise ValueError(f"applies must name some of {SOURCES}, got {applies}")
    metadata = {"help": help, "flag": flag, "when_none": when_none, "cite": cite, "applies": tuple(applies)}
    return dataclasses.field(default=default, metadata=metadata)  # type: ignore[no-any-return]


class FitParamsError(ValueError):
    """A fit parameter out of its range: ``name`` is the field, ``problem`` what is wrong with it."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name} {problem}")
        self.name = name
        self.problem = problem


@dataclass(frozen=True)
class FitParams:
    """How invariants, oracle and estimators are fitted; every default is stated here only."""

    # -- TDIs: the decision tree on the training data (paper §4.3, §5.4, Table 4) ---------------
    confidence: float = knob(0.99, "minimum confidence C of a selected TDI rule", cite="ICOS §5.4")
    """A TDI rule (a leaf of the tree) is selected when the share of its training records that carry its
    class is at least C. 0.99 is the paper's value for every model and dataset (§5.4, RQ1): a rule that
    is wrong on more than 1% of its own training records raises false alarms on right predictions.
    A lower C selects more rules, which find more errors and raise more false alarms (§6.2, RQ2)."""

    support: int = knob(8, "a selected TDI rule needs more than S training records", cite="ICOS §5.4")
    """A TDI rule is selected only when its leaf holds more than S training records (strict, as in the
    public ICOS workflow). The paper tunes S per dataset (§5.4: 140 for MNIST, 14 for CIFAR10, 11 for
    ImageNet, 8 for CIFAR100, the median support of the rules with C >= 0.99). The agent fits models
    it knows nothing about, on training sets often far smaller than MNIST's, so it takes the smallest,
    which still leaves rules on a small set. Low-support rules find rare errors and cost false alarms
    (§6.2): raise S when the oracle's FPR is high."""

    min_samples_leaf: int = knob(
        5, "at least this many training records in every leaf of the TDI tree", cite="ICOS Table 4"
    )
    """The tree's "min number records per node" of Table 4 (C4.5 with the Gini index, no pruning). It
    bounds the tree's size and keeps every leaf's confidence a share of several records."""

    tdi_max_records: int = knob(
        200_000, "the TDI tree grows on at most this many training records (a stratified sample beyond)"
    )
    """The tree's cost grows with its records times their depth: 500,000 rows of a million-row reference
    table took most of a two-minute fit, for rules finer than its validation data can tell apart (on a
    synthetic million-row table, 200,000 records gave 3,467 rules instead of 7,890, the oracle's TPR
    0.855 instead of 0.869 at the same FPR, and half the time). Training sets up to this size are used
    whole, as the paper uses them; a larger one is sampled, stratified by class, with the fit's seed."""

    # -- ADIs: the random forest on the validation data's probabilities (§4.4, Table 5) --------
    n_estimators: int = knob(100, "trees of the ADI random forest", flag="trees", cite="ICOS Table 5")
    """Table 5's "number of models" (KNIME's default). The forest is evaluated through ONNX on every
    judged prediction, so its size is the ADIs' share of the judging cost; fewer trees fit and judge
    faster with a noisier "model wrong" vote."""

    # -- the calibration split --------------------------------------------------------------------
    calibration_fraction: float = knob(
        0.3, "share of the validation data held out of ADI training to measure the oracle's TPR/FPR"
    )
    """The validation data is split, stratified by "model wrong / right", into ADI training and this
    held-out share, on which the whole oracle's TPR/FPR is measured and the estimators are calibrated.
    The paper trains the forest on the whole validation set and measures on labelled operational data
    (§5.4, §5.3); the agent has no such data at fit time, so it measures on records the forest has not
    seen. 0.3 is the agent's own choice, not the paper's: most of the data trains the forest, and the
    held-out part still holds enough errors for the rates (``fit`` warns when it holds too few)."""

    seed: int = knob(0, "seed of every random draw of the fit")
    """Seeds the TDI tree's tie-breaks, the ADI forest, the calibration split, the reference table's
    split and the shift-aware calibration (its corruptions and windows), so the same data and
    parameters give the same bundle. Any fixed value does; another seed shows how much a figure owes
    to the draw (docs/estimation.md, "Dependence on the calibration draw")."""

    # -- the model's decision --------------------------------------------------------------------
    decision_threshold: float | None = knob(
        None,
        "binary models: class 1 is predicted when its probability is at least this",
        when_none="argmax, i.e. 0.5",
    )
    """The labels the invariants judge are the model's decisions, so a binary model deployed with a
    threshold other than 0.5 is fitted with it. The bundle stores it, and ``check`` and the agent
    predict with it. ``None``: the argmax of the probabilities, as most classifiers decide."""

    # -- fits from a reference table -----------------------------------------------------------
    train_fraction: float = knob(
        0.5,
        "share of the reference table's rows that fit the TDIs; the rest is validation",
        applies=(TABLE,),
    )
    """A reference table replaces the training and validation data: this share of its rows (stratified
    by label) grows the TDI tree and the rest is split again by ``calibration_fraction``. The paper uses
    separate training and validation sets (§5.2); a half gives the tree and the forest with its
    calibration the same amount of data, as neither is known to need more."""

    # -- the shift-aware estimator (model fits only: it perturbs the model's inputs) -------------
    shift_sets: int | None = knob(
        None,
        "corrupted copies of the calibration split that the shift_aware estimator learns from",
        when_none="a few per corruption, as the calibration chooses",
        applies=(MODEL,),
    )
    """The shift-aware estimator learns how accuracy falls under drift from copies of the calibration
    split, each corrupted with one transformation at one strength (docs/estimation.md). ``None`` leaves
    the count to the calibration plan (:class:`CalibrationPlan`: a few copies per corruption, whose
    strengths it spreads evenly; fewer for image files). Fewer copies fit faster and teach the estimator
    fewer drifts."""

    # -- what the invariants read (model fits only) -----------------------------------------------
    features: str | None = knob(
        None,
        "the feature view the invariants read: raw, pooled, embedding[:TENSOR] or hashed",
        when_none="chosen from the model's inputs",
        applies=(MODEL,),
    )
    """A tree over 150,528 raw pixels or over text it cannot split is no invariant: each sample is read
    through a view (docs/models.md). ``raw`` keeps the inputs (tables, MNIST-sized images: rules about the
    inputs themselves), ``pooled`` averages large images to a few cells, ``embedding`` reads the model's
    own penultimate representation (the input of its last dense layer, or the tensor named after the
    colon), ``hashed`` hashes text and token ids into bags. ``None`` chooses from the model's inputs: raw
    for small numeric inputs, the embedding for large images, text and tokens where the graph has one."""

    # -- segments: where a drop is --------------------------------------------------------------
    max_segments: int = knob(
        64, "at most this many segments in all (predicted class, table columns, TDI rules, regions); 0: none"
    )
    """Every window is also reported cut into segments fixed at ``fit`` (docs/diagnosis.md): the predicted
    class, each categorical column's values and each numeric column's quantile bins (table views), the
    selected TDI rule a prediction falls under, and regions of the view (images, text, embeddings). Every
    segment costs each window a few sums and each replica a few exported series (docs/scaling.md), so
    their number is bounded here; kinds past the bound keep fewer segments (the most frequent) or are left
    out. 64 bounds what the segments add to a replica's window statistics at 320 series (five sums per
    segment), and keeps a table of a dozen columns whole."""

    def __post_init__(self) -> None:
        if self.features is not None and self.features.partition(":")[0] not in (
            "raw",
            "pooled",
            "embedding",
            "hashed",
        ):
            raise FitParamsError(
                "features", f"must be raw, pooled, embedding[:TENSOR] or hashed, got {self.features!r}"
            )
        self._check("confidence", float, 0.0, 1.0, closed=True)
        self._check("support", int, 0)
        self._check("min_samples_leaf", int, 1)
        self._check("tdi_max_records", int, 1)
        self._check("n_estimators", int, 1)
        self._check("calibration_fraction", float, 0.0, 1.0)
        self._check("seed", int, 0)
        self._check("decision_threshold", float, 0.0, 1.0, optional=True)
        self._check("train_fraction", float, 0.0, 1.0)
        self._check("shift_sets", int, 1, optional=True)
        self._check("max_segments", int, 0)

    def _check(
        self, name: str, kind: type, low: float, high: float = 0.0, *, closed: bool = False, optional: bool = False
    ) -> None:
        """Check that ``name`` lies within its range (integers: ``low`` or more; numbers: within
        ``[low, high]`` when ``closed``, else ``(low, high)``) and store it as a plain ``int`` or
        ``float``, so the manifest's JSON holds what the fit used."""
        value = getattr(self, name)
        if value is None and optional:
            return
        try:
            number = operator.index(value) if kind is int else float(value)
        except (TypeError, ValueError):
            wanted = "an integer" if kind is int else "a number"
            raise FitParamsError(name, f"must be {wanted}, got {value!r}") from None
        if kind is int and number < low:
            raise FitParamsError(name, f"must be at least {low:g}, got {number}")
        if kind is float and not (low <= number <= high if closed else low < number < high):
            span = f"[{low:g}, {high:g}]" if closed else f"({low:g}, {high:g})"
            raise FitParamsError(name, f"must be within {span}, got {number:g}")
        object.__setattr__(self, name, number)

    def recorded(self, source: str | None = None) -> dict[str, Any]:
        """The fields that apply to ``source`` (every source when ``None``) by name: what a bundle's
        manifest records under ``fit_params``."""
        return {f.name: getattr(self, f.name) for f in knobs(source)}

    def named(self, source: str | None = None) -> dict[str, Any]:
        """:meth:`recorded` under the names users give the fields (:func:`flag_name`, e.g. ``trees``):
        the parameters of a fit's MLflow run."""
        return {flag_name(f): getattr(self, f.name) for f in knobs(source)}


@dataclass(frozen=True)
class CalibrationPlan:
    """Every size of the estimators' calibration at ``fit``: samples, corrupted copies, windows, folds and
    resamples. Each is stated here only, with its reason; the functions that use one default to it."""

    # -- inputs read from files (image folders): each sample costs milliseconds to read and predict -----
    view_sample: int = 512
    """Training samples of a file source the feature view is chosen on (the view's categories and widths
    are read from every training value of an in-memory source)."""

    lazy_train_sample: int = 256
    """Training samples of a file source that set the corruptions' parameters (the pixel range); the
    shift-aware reference is still the view of the whole training split, computed once."""

    lazy_calibration: int = 400
    """Calibration samples of a file source that are corrupted: each corrupted set is one pass of the model
    over them, and large images cost milliseconds each."""

    lazy_sets: int = 48
    """Corrupted sets of a file source's calibration samples (``fit --shift-sets`` overrides it)."""

    # -- corrupted copies of the calibration split -------------------------------------------------------
    sets_per_corruption: int = 8
    """Copies per corruption: its strengths fall one in each eighth of (0, 1], from harmless to
    label-breaking, so every corruption covers the continuum."""

    min_sets: int = 88
    """Fewest corrupted copies in all, when a model's inputs have few corruptions (one per image-kind
    corruption at the strengths above): the windows need that many sets to mix."""

    # -- wide inputs: every corrupted row is one pass of a model over many values ----------------------
    wide_values: int = 1024
    """Values per sample above which one numeric tensor that is not an image is wide (token ids padded to a
    fixed length, a long vector of counts): a model reading that many per row is often slow on each
    (attention over thousands of positions), so its corrupted copies are bounded in rows
    (:attr:`wide_rows`) rather than in count. Tables are not wide; images keep their copies (image files
    their own bounds, :attr:`lazy_sets`)."""

    wide_rows: int = 4096
    """Corrupted rows in all (copies × calibration rows) of a wide input: about a minute of a model at 80
    rows/s. The copies are :meth:`sets_for` the corruptions, fewer where the calibration split would take
    more rows, and at least :attr:`wide_min_sets`; a calibration split larger than
    ``wide_rows / wide_min_sets`` rows is sampled down to that."""

    wide_min_sets: int = 24
    """Fewest corrupted copies of a wide input (three per corruption of a table-like input): fewer would
    leave the windows too few drifts to mix."""

    # -- the shift-aware regressions (windows drawn from the judged sets) --------------------------------
    shift_windows: int = 2000
    """Windows drawn to fit the regressions: enough for 100-300 trees without overfitting one window."""

    window_size: tuple[int, int] = (400, 1600)
    """Smallest and largest window (samples): the range of live windows the estimate is read on."""

    interval_folds: int = 3
    """Groups the corruptions of no related group (text, tokens, categories) are dealt into, each held out in
    turn, as every group of related corruptions is (geometry, resolution, photometry, noise and occlusion of
    images; noise, scale, missing and swapped values of tables), to measure the regressions' out-of-family
    error (the interval's model-error term)."""

    min_interval_windows: int = 50
    """Fewest training windows a held-out group leaves for its refit; a group leaving fewer is skipped."""

    clean_windows: int = 200
    """Windows of the clean calibration split the trust model's clean statistics come from."""

    trust_points: int = 600
    """Calibration windows the trust model keeps per model kind to measure a live window's distance from
    (they are stored in the bundle: this bounds its size)."""

    # -- choosing the headline from evidence -------------------------------------------------------------
    headline_folds: int = 2
    """Folds of the calibration split: each is measured by estimators calibrated on the others."""

    windows_per_kind: int = 40
    """Simulated windows per kind of shift and fold."""

    max_window: int = 1000
    """Largest simulated window (rows); a smaller fold gives windows of its own size."""

    min_fold_rows: int = 30
    """Fewest held-out rows per fold for a choice; below it the default headline is kept, without evidence."""

    bootstrap: int = 100
    """Resamples of the calibration rows and of the windows behind a choice against the default: each
    recalibrates the estimators that need only the judged predictions on every fold's resampled rows."""

    min_choice_errors: int = 20
    """Fewest wrong predictions in the calibration split for a headline other than the default: ten per
    fold of :attr:`headline_folds`, as many as a correction needs (below them the folds' calibrations and
    their windows' truth rest on the same handful of errors)."""

    support: float = 0.95
    """Share of the resamples in which a candidate must beat the default headline to replace it."""

    # -- a challenger's pair with its champion (``fit --champion``) ----------------------------------
    pair_folds: int = 5
    """Groups of corruption kinds held out in turn: the disagreement model refitted without each, and
    windows of the held-out kinds give the paired difference's model-error term (out of kind, as a live
    drift is)."""

    pair_windows_per_fold: int = 400
    """Windows drawn from the held-out kinds per fold (one kind each, a fifth clean, a third under a
    random class prior): enough for a 99% quantile per disagreement-rate bin."""

    pair_window_size: tuple[int, int] = (300, 1600)
    """Smallest and largest window of paired predictions the model-error term is measured on."""

    pair_error_level: float = 0.99
    """Quantile of the model error per disagreement-rate bin: the 95% interval of the difference then
    holds on more than 95% of held-out windows (at 0.95 it called the wrong version better on 1% of
    windows, at 0.99 on 0.3%: python -m bench.challenger)."""

    # -- the flag "this number may be wrong" ----------------------------------------------------------------
    flag_corruption_windows: int = 140
    """Windows of the corruptions a refit of ``shift_aware`` left out, per refit: the shifts the flag learns
    to tell from, of kinds the estimate was fitted without."""

    flag_windows_per_kind: int = 20
    """Windows of every simulated shift of the headline's choice (clean, label, tilts, subpopulation,
    confidence, mixture), per refit: the shifts the flag must not cry wolf on."""

    flag_held_out_sets: int = 3
    """Corrupted copies of each kind of shift held out of every ``shift_aware`` fit (inversions and large
    covariate moves: the calibration's ``HELD_OUT_KINDS``), at strengths one in each of equal slices of
    (0, 1]: what only the flag's fit sees."""

    flag_held_out_windows: int = 30
    """Windows of each held-out kind of shift, per refit: a kind no refit (nor the shipped estimate) was
    fitted on, so the flag learns to raise on inputs unlike anything the estimate saw."""

    flag_table_windows_per_kind: int = 40
    """Windows of every simulated shift per fold of the calibration split, for a bundle without
    ``shift_aware`` (no refits: the estimators are calibrated on the other fold)."""

    flag_window_size: tuple[int, int] = (300, 1600)
    """Smallest and largest window the flag is fitted on (a fold's rows at most, for a bundle without
    ``shift_aware``)."""

    # -- segments (``fit --max-segments`` bounds them all) -----------------------------------------------
    segment_classes: int = 12
    """Predicted classes that are segments of their own (the most frequent on the validation data); the
    others form one segment. Twelve keep every class of most models and a dashboard panel readable."""

    segment_rules: int = 8
    """Selected TDI rules that are segments of their own (those of most training support); the other
    selected rules form one segment, the predictions under no selected rule another."""

    segment_regions: int = 8
    """Regions (k-means centres) of an image, text or embedding view: few enough that each holds a few
    hundred validation predictions, so that its reference accuracy means something."""

    segment_region_rows: int = 4000
    """Training rows the regions are clustered on (a sample of larger sets)."""

    segment_columns: int = 8
    """Table columns cut into segments (the most class-informative first, while the bound allows)."""

    segment_values: int = 8
    """Segments of a categorical column: its most frequent values one by one, the rarer ones together and
    the values never seen at fit together."""

    segment_bins: int = 4
    """Quantile bins of a numeric column (quartiles of the training values)."""

    segment_discrete: int = 8
    """A numeric column with at most this many distinct training values is read as categorical (codes,
    counts, flags), its values as segments."""

    segment_min_rows: int = 50
    """Fewest training rows per region: fewer training rows give fewer regions."""

    def sets_for(self, corruptions: int) -> int:
        """Corrupted copies when ``fit --shift-sets`` does not say: :attr:`sets_per_corruption` per
        corruption, at least :attr:`min_sets`."""
        return max(self.min_sets, self.sets_per_corruption * corruptions)

    def wide_sample_rows(self) -> int:
        """Calibration rows of a wide input that are corrupted (a larger split is sampled down)."""
        return max(1, self.wide_rows // self.wide_min_sets)

    def wide_sets(self, corruptions: int, rows: int) -> int:
        """Corrupted copies of ``rows`` calibration rows of a wide input (see :attr:`wide_rows`)."""
        return min(self.sets_for(corruptions), max(self.wide_min_sets, self.wide_rows // max(rows, 1)))


def knobs(source: str | None = None) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of :class:`FitParams` that apply to ``source`` (to every source when ``None``)."""
    wanted = SOURCES if source is None else (source,)
    if not set(wanted) <= set(SOURCES):
        raise ValueError(f"unknown fit source {source!r}; one of {SOURCES}")
    return tuple(f for f in dataclasses.fields(FitParams) if set(wanted) <= set(f.metadata["applies"]))


def flag_name(field: dataclasses.Field[Any]) -> str:
    """The name users give a field: its command-line flag without ``--`` and with ``_`` (``trees``)."""
    return str(field.metadata.get("flag") or field.name)


def field_docs() -> dict[str, str]:
    """Each field's docstring (the string after it in the class body), whitespace folded: read from
    this module's source, since Python keeps no attribute docstrings at run time."""
    tree = ast.parse(inspect.getsource(FitParams))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef)).body
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs
