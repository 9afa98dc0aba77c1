"""The vectorised evaluation of IDI conditions over a batch (:mod:`invariants.idi`): metadata fields and
named inputs as normalised columns (text, numbers, presence), feature columns of the view, and each
operator as a boolean mask over the batch."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from invariants.idi_conditions import _LENGTH_OPS, _NUMERIC_OPS, _SET_OPS, Condition, Scalar, _as_float, _is_number
from invariants.untrusted import bounded_repr


class _Column:
    """One metadata field normalised for a batch: text, numbers (NaN = not a number), presence."""

    def __init__(self, raw: object, n: int, field: str) -> None:
        self.n = n
        self._text: np.ndarray | None = None
        self._num: np.ndarray | None = None
        if raw is None:
            self.present = np.zeros(n, dtype=bool)
            self._text = np.full(n, "", dtype=str)
            self._num = np.full(n, np.nan)
            return
        arr = np.asarray(raw)
        if arr.ndim == 0:
            scalar = arr.item()
            if isinstance(scalar, bytes):
                scalar = scalar.decode("utf-8", errors="replace")
            missing = scalar is None or scalar == "" or (isinstance(scalar, float) and math.isnan(scalar))
            self.present = np.full(n, not missing)
            self._text = np.full(n, "" if missing else str(scalar), dtype=object)
            self._num = np.full(n, math.nan if missing else _as_float(scalar))
            return
        if arr.ndim != 1 or arr.shape[0] != n:
            raise ValueError(
                f"metadata field {bounded_repr(field)} has shape {arr.shape}, expected one value or {n} values"
            )
        kind = arr.dtype.kind
        if kind == "U" and isinstance(raw, (list, tuple)):
            # a list mixing text with None or NaN becomes text ('None', 'nan') in a str array:
            # read it value by value, so those stay missing
            arr, kind = np.asarray(raw, dtype=object), "O"
        if kind in "iub":
            self._num = arr.astype(np.float64)
            self.present = np.ones(n, dtype=bool)
        elif kind == "f":
            self._num = arr.astype(np.float64)
            self.present = ~np.isnan(self._num)
        else:
            if kind == "S":
                text = np.char.decode(arr, "utf-8", errors="replace")
                present = text != ""
            elif kind == "U":
                text = arr
                present = text != ""
            else:
                obj = arr.astype(object)
                text = obj.astype(str)
                is_bytes = np.char.startswith(text, "b'") | np.char.startswith(text, 'b"')
                if is_bytes.any():
                    text[is_bytes] = np.char.decode(obj[is_bytes].astype(bytes), "utf-8", errors="replace")
                present = ~np.equal(obj, np.asarray(None, dtype=object)) & (text != "") & (text != "nan")
            self._text = text
            self.present = present

    @property
    def text(self) -> np.ndarray | None:
        """Text of each value (``None`` for an all-numeric column: no text-only value can match)."""
        return self._text

    @property
    def num(self) -> np.ndarray:
        if self._num is None:
            assert self._text is not None
            uniques, inverse = np.unique(self._text, return_inverse=True)
            self._num = np.array([_as_float(u) for u in uniques], dtype=np.float64)[inverse.reshape(-1)]
        return self._num


def _equal_mask(column: _Column, value: Scalar) -> np.ndarray:
    mask = np.zeros(column.n, dtype=bool)
    number = float(value) if _is_number(value) else _as_float(value)
    if not math.isnan(number):
        mask |= column.num == number
    if column.text is not None:
        mask |= column.text == (value if isinstance(value, str) else str(value))
    return mask & column.present


def _feature_column(
    cond: Condition, features: np.ndarray | None, feature_names: Sequence[str] | None
) -> np.ndarray | None:
    if features is None:
        return None
    index = cond.index
    if index is None:
        if feature_names is None or cond.name not in feature_names:
            return None
        index = list(feature_names).index(cond.name)
    if index >= features.shape[1]:
        return None
    return np.asarray(features[:, index], dtype=np.float64)


def _condition_mask(
    cond: Condition,
    n: int,
    columns: dict[str, _Column],
    metadata: Mapping[str, object] | None,
    features: np.ndarray | None,
    feature_names: Sequence[str] | None,
) -> np.ndarray:
    if cond.subject in ("field", "input"):  # the agent passes a model input's values by its name
        if metadata is None or cond.name not in metadata:
            return np.zeros(n, dtype=bool)
        if cond.name not in columns:
            columns[cond.name] = _Column(metadata[cond.name], n, cond.name)
        column = columns[cond.name]
    else:
        values = _feature_column(cond, features, feature_names)
        if values is None:
            return np.zeros(n, dtype=bool)
        column = _Column(values, n, cond.name)
    op, value = cond.op, cond.value
    if op in _LENGTH_OPS:
        assert not isinstance(value, tuple)
        text = column.text if column.text is not None else np.full(n, "", dtype=object)
        lengths = np.fromiter((len(str(t)) for t in text), dtype=np.float64, count=n)
        hit = lengths < float(value) if op == "length_lt" else lengths > float(value)
        return hit & column.present
    if op in _NUMERIC_OPS:
        assert not isinstance(value, tuple)
        num, threshold = column.num, float(value)
        with np.errstate(invalid="ignore"):
            if op == "lt":
                return num < threshold
            if op == "le":
                return num <= threshold
            if op == "gt":
                return num > threshold
            return num >= threshold
    if op in _SET_OPS:
        assert isinstance(value, tuple)
        hit = np.zeros(n, dtype=bool)
        for item in value:
            hit |= _equal_mask(column, item)
    else:
        assert not isinstance(value, tuple)
        hit = _equal_mask(column, value)
    if op in ("not_equals", "not_in"):
        return column.present & ~hit
    return hit
