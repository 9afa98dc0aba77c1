"""``fit`` and ``load``: a model's bundle in a notebook, fitted as ``icos-agent fit`` fits it (the same stages under
the same progress bar) or read from a directory, and its ``estimate`` over any data."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from agent.api import (
    CalibrationPlan,
    DataLimits,
    FitParams,
    FitParamsError,
    FitReport,
    InvariantBundle,
    OnnxClassifier,
    TableColumns,
    UserError,
    Windowed,
    WindowedPair,
    Windowing,
    default_classes,
    fit_bundle,
    fit_table_bundle,
    fit_warnings,
    flag_name,
    image_reading,
    rebatched,
)
from icos_agent._inputs import BATCH_ROWS, Batches
from icos_agent.estimates import ALERT_MARGIN, Estimates

#: What a model's score output holds (``auto``: probabilities after a Softmax or when named so, else logits).
ScoresKind = Literal["auto", "logits", "probabilities"]


def _fit_params(options: dict[str, Any]) -> FitParams:
    """The fit parameters among ``options``, by field name or by the flag's name (``trees`` or ``n_estimators``);
    a value out of range says which."""
    names = {f.name: f.name for f in dataclasses.fields(FitParams)}
    names.update({flag_name(f).replace("-", "_"): f.name for f in dataclasses.fields(FitParams)})
    given = {names[k]: options.pop(k) for k in list(options) if k in names}
    try:
        return FitParams(**given)
    except FitParamsError as exc:
        raise UserError(f"{exc.name} {exc.problem}") from None


def _model(model: str | Path | OnnxClassifier, scores_output: str | None, scores_kind: ScoresKind) -> OnnxClassifier:
    if isinstance(model, OnnxClassifier):
        return model
    return OnnxClassifier.load(model, scores_output=scores_output, scores_kind=scores_kind)


class Bundle:
    """A model and its bundle: :meth:`estimate` judges data with it, :meth:`save` writes the bundle as ``fit --out``
    does. ``report``: the fit's figures (None for a bundle loaded from disk). ``model`` None: a bundle fitted from
    logged predictions (:func:`fit_reference`), which judges the logged probabilities of its data."""

    def __init__(
        self,
        model: OnnxClassifier | None,
        bundle: InvariantBundle,
        report: FitReport | None = None,
        directory: Path | None = None,
    ) -> None:
        self.model = model
        self.invariants = bundle
        self.report = report
        #: where the bundle was read from or saved to (None: not yet saved)
        self.directory = directory
        if model is not None:
            model.decision_threshold = bundle.decision_threshold

    @property
    def classes(self) -> list[str]:
        return list(self.invariants.classes if self.model is None else self.model.classes)

    @property
    def warnings(self) -> list[str]:
        """What ``fit`` warns of (none for a bundle loaded from disk)."""
        return [] if self.report is None else fit_warnings(self.report.calibration, self.report.validation)

    def save(self, directory: str | Path) -> Path:
        """Write the bundle (JSON and ONNX files with their digests), as ``icos-agent fit --out`` does."""
        self.invariants.save(directory)
        self.directory = Path(directory)
        return self.directory

    def estimate(
        self,
        data: Any,
        timestamp: Any = None,
        window: str | int | None = None,
        labels: Any = None,
        *,
        metadata: Sequence[str] = (),
        challenger: Bundle | None = None,
        alert_margin: float = ALERT_MARGIN,
        batch_rows: int = BATCH_ROWS,
        progress: bool = True,
    ) -> Estimates:
        """Every estimate per window of ``data``, as ``icos-agent check`` and a running agent compute them.

        ``data``: a data frame, an array, a path (``.npz``, ``.csv``, ``.parquet``, a directory or glob of Parquet
        files, an image folder) or an iterator of batches (frames, arrays, or ``(x, labels[, timestamps])``
        tuples), read ``batch_rows`` rows at a time. ``timestamp`` and ``labels``: column names, or arrays of one
        value per row. ``window``: a duration (``"1h"``, the default with a timestamp) cuts windows of time
        aligned on the epoch in UTC; a number of rows cuts windows of that many rows; without either, one window
        of every row. ``challenger``: another version's bundle, fitted with ``champion=`` this model.
        """
        if window is None and timestamp is not None:
            window = "1h"
        windowing = Windowing.of(window)
        if self.model is None:
            return self._estimate_logged(
                data, timestamp, windowing, labels, metadata, challenger, alert_margin, batch_rows
            )
        batches = Batches(
            data, self.model, labels=labels, timestamp=timestamp, metadata=metadata, batch_rows=batch_rows
        )
        windowed = Windowed(self.model, self.invariants, windowing)
        paired = None
        if challenger is not None:
            if challenger.model is None:
                raise UserError("challenger= is a model's bundle (fitted with champion=): this one has no model")
            paired = WindowedPair(windowed, challenger.model, challenger.invariants)
        from tqdm import tqdm

        with tqdm(total=batches.n, desc="estimate", unit="rows", disable=not progress, leave=False) as bar:
            for rows in rebatched(batches, batch_rows):
                added = windowed.add(rows)
                if paired is not None and added is not None:
                    paired.add(rows.x, rows.metadata or None, added)
                bar.update(len(rows))
        if windowed.total.stats is None:
            raise UserError("estimate: the data has no rows")
        return Estimates(windowed, alert_margin=alert_margin, paired=paired)

    def _estimate_logged(
        self,
        data: Any,
        timestamp: Any,
        windowing: Windowing,
        labels: Any,
        metadata: Sequence[str],
        challenger: Bundle | None,
        alert_margin: float,
        batch_rows: int,
    ) -> Estimates:
        """``estimate`` with a bundle fitted from logged predictions: data frames of logged rows, judged as
        ``icos-agent check`` judges a table with such a bundle."""
        from icos_agent.reference import table_batches

        table = self.invariants.table
        if table is None:
            raise UserError("this bundle was fitted from a model: load it with its model (icos_agent.load)")
        if challenger is not None:
            raise UserError("challenger= compares ONNX models: a bundle fitted from logged predictions has none")
        if batch_rows < 1:
            raise UserError("batch_rows must be at least 1")
        columns = self.logged_columns(metadata)
        windowed = Windowed(None, self.invariants, windowing)
        for batch, ts in table_batches(data, columns, labels=labels, timestamp=timestamp, batch_rows=batch_rows):
            windowed.add_table(batch, ts)
        if windowed.total.stats is None:
            raise UserError("estimate: the data has no rows")
        return Estimates(windowed, alert_margin=alert_margin)

    def logged_columns(self, metadata: Sequence[str] = ()) -> TableColumns:
        """The columns a bundle fitted from logged predictions reads of a logged row: its probability and feature
        columns, and the metadata columns named (or those the IDI rules read)."""
        table = self.invariants.table
        if table is None:
            raise UserError("this bundle was fitted from a model: load it with its model (icos_agent.load)")
        return TableColumns(table.proba_columns, table.feature_columns, None, tuple(metadata or self._metadata))

    @property
    def _metadata(self) -> list[str]:
        """The metadata columns the IDI rules read (a bundle fitted from logged predictions reads them by name)."""
        idi = self.invariants.idi
        return sorted(idi.metadata_fields) if idi is not None else []


def fit(
    model: str | Path | OnnxClassifier,
    train: Any,
    val: Any,
    *,
    label_column: str | None = None,
    metadata: Sequence[str] = (),
    idi: str | Path | None = None,
    champion: str | Path | OnnxClassifier | None = None,
    scores_output: str | None = None,
    scores_kind: ScoresKind = "auto",
    plan: CalibrationPlan | None = None,
    progress: bool = True,
    **options: Any,
) -> Bundle:
    """Fit a model's bundle, as ``icos-agent fit --model M --train T --val V`` does: the same stages, under the same
    progress bar. ``train`` and ``val``: ``(frame, "label")``, a frame with ``label_column``, ``(x, y)`` arrays, or
    a path (``.npz``, ``.csv``, ``.parquet``, an image folder). ``options``: the fit parameters, by the names of
    ``icos-agent fit``'s flags or of :class:`invariants.fit_params.FitParams`'s fields (``trees=30``,
    ``confidence=0.99``). ``champion``: the model this one is the challenger of."""
    params = _fit_params(options)
    if options:
        raise UserError(f"fit: unknown option(s) {', '.join(sorted(options))} (see `icos-agent fit --help`)")
    onnx = _model(model, scores_output, scores_kind)
    limits = DataLimits()
    from icos_agent._inputs import fit_dataset

    train_set = fit_dataset(train, onnx, label_column, metadata, limits)
    val_set = fit_dataset(val, onnx, label_column, metadata, limits)
    image = image_reading(onnx, None)
    preprocess = image[1].to_dict() if image is not None and hasattr(train_set.x, "preprocess") else None

    def say(message: str) -> None:
        if progress:
            print(f"  {message}", file=sys.stderr)

    report = fit_bundle(
        onnx,
        train_set,
        val_set,
        idi_path=idi,
        params=params,
        progress=say,
        preprocess=preprocess,
        plan=plan or CalibrationPlan(),
        champion=None if champion is None else _model(champion, None, "auto"),
    )
    out = Bundle(onnx, report.bundle, report)
    for warning in out.warnings:
        say(f"warning: {warning}")
    return out


def fit_reference(
    reference: Any,
    *,
    proba_columns: Sequence[str],
    label_column: str | None = None,
    feature_columns: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    classes: Sequence[str] | None = None,
    metadata: Sequence[str] = (),
    idi: str | Path | None = None,
    plan: CalibrationPlan | None = None,
    progress: bool = True,
    **options: Any,
) -> Bundle:
    """Fit a bundle from a model's logged predictions, as ``icos-agent fit --reference`` does: ``reference`` a data
    frame (or ``(frame, "label")``) of features, the model's predicted probabilities (``proba_columns``: one per
    class, or the probability of class 1 of a binary model) and the labels. Features: ``feature_columns``, or every
    other numeric column but ``exclude`` (ids, the logged predicted class). ``classes``: their names, in the order
    of ``proba_columns`` (default as the CLI's). ``options``: the fit parameters, as :func:`fit` takes them."""
    from icos_agent._inputs import _is_frame
    from icos_agent.reference import reference_columns

    if isinstance(reference, tuple) and len(reference) == 2 and isinstance(reference[1], str):
        reference, label_column = reference
    if not _is_frame(reference) or label_column is None:
        raise UserError("fit_reference reads a data frame and its label column: (frame, 'label') or label_column=")
    params = _fit_params(options)
    if options:
        raise UserError(f"fit_reference: unknown option(s) {', '.join(sorted(options))}")
    columns, skipped = reference_columns(reference, proba_columns, label_column, feature_columns, metadata, exclude)

    def say(message: str) -> None:
        if progress:
            print(f"  {message}", file=sys.stderr)

    if skipped:
        say(f"non-numeric columns left out of the features: {', '.join(skipped)}")
    from agent.api import table_batch

    ref = table_batch(reference, columns, "reference")
    names = list(classes) if classes is not None else default_classes(list(proba_columns))
    report = fit_table_bundle(
        ref, columns, names, idi_path=idi, params=params, progress=say, plan=plan or CalibrationPlan()
    )
    out = Bundle(None, report.bundle, report)
    for warning in out.warnings:
        say(f"warning: {warning}")
    return out


def load(bundle_dir: str | Path, model: str | Path | OnnxClassifier | None = None) -> Bundle:
    """A bundle written by ``fit`` (or ``icos-agent fit``) and its model (whose digest the bundle checks); without
    ``model``, a bundle fitted from logged predictions (:func:`fit_reference`, ``icos-agent fit --reference``)."""
    if model is None:
        if InvariantBundle.table_source(bundle_dir) is None:
            raise UserError(f"{bundle_dir} was fitted from a model: give model= (its ONNX file)")
        return Bundle(None, InvariantBundle.load(bundle_dir), directory=Path(bundle_dir))
    onnx = _model(model, None, "auto")
    return Bundle(onnx, InvariantBundle.load(bundle_dir, expected_model_sha256=onnx.sha256), directory=Path(bundle_dir))
