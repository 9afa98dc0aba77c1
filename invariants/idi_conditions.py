"""The vocabulary of IDI conditions (:mod:`invariants.idi`): subjects, operators and :class:`Condition`,
shared by the rule parser and the vectorised evaluation (:mod:`invariants.idi_eval`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

Scalar = str | int | float
Value = Scalar | tuple[Scalar, ...]

OPERATORS: tuple[str, ...] = (
    "equals",
    "not_equals",
    "in",
    "not_in",
    "lt",
    "le",
    "gt",
    "ge",
    "length_lt",
    "length_gt",
)
_LENGTH_OPS = frozenset({"length_lt", "length_gt"})
_NUMERIC_OPS = frozenset({"lt", "le", "gt", "ge"}) | _LENGTH_OPS
_SET_OPS = frozenset({"in", "not_in"})
_SUBJECTS = ("field", "input", "feature")
_INDEX_FORM = re.compile(r"^x\[(\d+)\]$")
_SYMBOLS = {
    "equals": "=",
    "not_equals": "≠",
    "in": "∈",
    "not_in": "∉",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "length_lt": "length <",
    "length_gt": "length >",
}


@dataclass(frozen=True)
class Condition:
    """One constraint of an IDI clause.

    ``subject`` is ``"field"`` (metadata), ``"input"`` (a named model input) or ``"feature"`` (a column of
    the feature view); ``name`` is the field, the input, the feature name, or ``x[i]`` with ``index == i``.
    ``value`` is a scalar, or a tuple of scalars for ``in`` / ``not_in``.
    """

    subject: str
    name: str
    op: str
    value: Value
    index: int | None = None

    def text(self) -> str:
        """The constraint in clause notation, e.g. ``form = P1`` or ``country ∈ {FR, IT}``."""
        if isinstance(self.value, tuple):
            shown = "{" + ", ".join(_show(v) for v in self.value) + "}"
        else:
            shown = _show(self.value)
        return f"{self.name} {_SYMBOLS[self.op]} {shown}"


def _show(v: Scalar) -> str:
    return v if isinstance(v, str) else repr(v)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _as_float(v: object) -> float:
    """``float(v)`` or NaN when ``v`` does not read as a number."""
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
