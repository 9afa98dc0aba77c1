"""What a bundle's segments are defined from at ``fit``: the view's table columns (:func:`column_groups`) and the
training and labeled validation data (:class:`SegmentData`), shared by every kind's fit-time part."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.model.inputs import Signature
from agent.model.views import FeatureView, input_width, is_image
from invariants.tdi import TrainingInvariants

#: Widest raw numeric input read as table columns (wider ones are images or vectors: cut by regions).
MAX_TABLE_INPUT = 64


@dataclass(frozen=True)
class ColumnGroup:
    """A table column of the view: a one-hot group of a categorical input (``columns``, ``values`` the
    categories, the last ``(other)``: unseen at fit) or one numeric column."""

    name: str
    columns: tuple[int, ...]
    values: tuple[str, ...] = ()

    @property
    def onehot(self) -> bool:
        return bool(self.values)


@dataclass(frozen=True)
class ViewShape:
    """What the view's columns are: table columns, and whether part of it is cut by regions instead."""

    columns: tuple[ColumnGroup, ...]
    regions: bool


def column_groups(view: FeatureView | None, signature: Signature | None, names: Sequence[str] | None) -> ViewShape:
    """The table columns of a view (``view`` None: a reference table, every feature a numeric column named
    by ``names``), and whether it needs regions (images, text, tokens, embedding/pooled/hashed/projected)."""
    if view is None or signature is None:
        cols = names or ()
        return ViewShape(tuple(ColumnGroup(str(n), (j,)) for j, n in enumerate(cols)), regions=not cols)
    if view.kind != "raw" or view.projected or view.embedding is not None:
        return ViewShape((), regions=True)
    groups: list[ColumnGroup] = []
    regions = False
    offset = 0
    view_names = list(view.names) if len(view.names) == view.width else [f"x[{j}]" for j in range(view.width)]
    for v in view.inputs:
        spec = signature.get(v.name)
        if v.encoding == "skip" or spec is None:
            continue
        width = input_width(v, spec)
        if v.encoding == "onehot":
            values = (*v.categories, "(other)")
            groups.append(ColumnGroup(v.name, tuple(range(offset, offset + width)), values))
        elif v.encoding == "raw" and not is_image(spec) and width <= MAX_TABLE_INPUT:
            groups += [ColumnGroup(view_names[offset + j], (offset + j,)) for j in range(width)]
        else:
            regions = True
        offset += width
    return ViewShape(tuple(groups), regions=regions or not groups)


@dataclass(frozen=True)
class SegmentData:
    """What segments are defined from: the training view and labels, the validation view, labels,
    probabilities and predicted classes, the calibration split (indices into the validation rows) with its
    oracle verdicts, the TDI tree and the class names."""

    train_features: np.ndarray
    train_y: np.ndarray
    val_features: np.ndarray
    val_y: np.ndarray
    val_probabilities: np.ndarray
    val_predicted: np.ndarray
    calibration_index: np.ndarray
    calibration_verdicts: np.ndarray
    tdi: TrainingInvariants | None
    classes: Sequence[str]
