"""Input-data-dependent invariants (IDIs), ICOS paper §4.2 and §5.4.

An IDI encodes upfront knowledge of the operational domain: "if the operational input belongs
to partition X, the label predicted by the model cannot be y". The paper writes them as
clauses (eq. 1), e.g. ``fail :- input_image ∈ P1, output ∉ {0, 3, 6, 8, 9}``.

Rules are written by hand in a small YAML language (parsed safely: no Python tags, anchors or aliases, no
evaluation of any expression)::

    rules:
      - name: no-straight-lines          # required, unique
        when: {field: form, equals: P1}  # one condition, or a list (all must hold)
        allowed_labels: [0, 3, 6, 8, 9]  # XOR forbidden_labels
      - name: adults-only
        when: [{feature: age, lt: 18}, {field: country, in: [FR, IT]}]
        forbidden_labels: [approve]

A condition has exactly one subject, ``field`` (a metadata name), ``input`` (a named model input of one
value per sample: a table column, a text) or ``feature`` (a column of the feature view: a table's
feature name or the index form ``x[i]``), and exactly one operator among ``equals``, ``not_equals``,
``in``, ``not_in``, ``lt``, ``le``, ``gt``, ``ge``, and, on text, ``length_lt`` and ``length_gt`` (its
length in characters), e.g. ``{input: review, length_gt: 2000}`` or ``{input: city, not_in: [Oslo,
Lyon]}``. A rule fires (the prediction fails) when all of its conditions hold and the predicted label is not allowed /
is forbidden. A sample whose metadata is missing never satisfies a condition on it, so a
rule about that field cannot fire for it (missing data is never an error).

Metadata values compare as text and, when both sides read as numbers, numerically too:
``equals: 3`` matches the metadata values ``3``, ``3.0`` and ``"3"``. ``None``, float NaN and
the empty string mean "missing".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from invariants.idi_conditions import (
    _INDEX_FORM,
    _NUMERIC_OPS,
    _SET_OPS,
    _SUBJECTS,
    OPERATORS,
    Condition,
    Scalar,
    Value,
    _is_number,
)
from invariants.idi_eval import _Column, _condition_mask
from invariants.untrusted import bounded_repr, safe_load_yaml

__all__ = [
    "OPERATORS",
    "Condition",
    "IdiRule",
    "IdiRuleError",
    "IdiRuleSet",
]

_RULE_KEYS = ("name", "when", "allowed_labels", "forbidden_labels")


class IdiRuleError(ValueError):
    """An IDI rule file is invalid; the message names the rule (by number and name) and the key."""


@dataclass(frozen=True)
class IdiRule:
    """``fail :- C1 ∧ … ∧ Cn, output ∉ allowed`` (or ``output ∈ forbidden``); labels are class indices."""

    name: str
    conditions: tuple[Condition, ...]
    allowed: frozenset[int] | None
    forbidden: frozenset[int] | None


# ----------------------------------------------------------------------------- parsing


class _Where:
    def __init__(self, number: int, name: str | None) -> None:
        self.number = number
        self.name = name

    def error(self, message: str) -> IdiRuleError:
        label = f"rule {self.number}" + (f" ({bounded_repr(self.name)})" if self.name is not None else "")
        return IdiRuleError(f"{label}: {message}")


def _parse_scalar(raw: object, where: _Where, key: str, numeric: bool) -> Scalar:
    if numeric:
        if not _is_number(raw) or not math.isfinite(float(raw)):  # type: ignore[arg-type]
            raise where.error(f"operator '{key}' needs a finite number, got {bounded_repr(raw)}")
        return raw  # type: ignore[return-value]
    if isinstance(raw, str) or _is_number(raw):
        if isinstance(raw, float) and not math.isfinite(raw):
            raise where.error(f"operator '{key}' needs a finite number or a string, got {bounded_repr(raw)}")
        return raw  # type: ignore[return-value]
    raise where.error(f"operator '{key}' needs a string or a number (quote it), got {bounded_repr(raw)}")


def _parse_condition(raw: object, where: _Where, position: int) -> Condition:
    if not isinstance(raw, Mapping):
        raise where.error(f"condition {position} must be a mapping like {{field: form, equals: P1}}")
    subjects = [k for k in raw if k in _SUBJECTS]
    operators = [k for k in raw if k in OPERATORS]
    unknown = [k for k in raw if k not in _SUBJECTS and k not in OPERATORS]
    if unknown:
        if not subjects:
            raise where.error(
                f"unknown key {bounded_repr(unknown[0])} in condition {position} "
                "(expected 'field', 'input' or 'feature')"
            )
        raise where.error(f"unknown operator {bounded_repr(unknown[0])}")
    if len(subjects) != 1:
        if not subjects:
            raise where.error(f"condition {position} needs one subject, 'field', 'input' or 'feature'")
        raise where.error(f"condition {position} has several subjects ({', '.join(subjects)}); use one")
    if len(operators) != 1:
        if not operators:
            raise where.error(f"condition {position} needs one operator among {', '.join(OPERATORS)}")
        raise where.error(f"condition {position} has several operators ({', '.join(operators)}); use one")
    subject, op = subjects[0], operators[0]
    target = raw[subject]
    index: int | None = None
    if subject in ("field", "input"):
        if not isinstance(target, str) or not target:
            raise where.error(f"'{subject}' must be a name, got {bounded_repr(target)}")
        name = target
    else:
        if isinstance(target, int) and not isinstance(target, bool) and target >= 0:
            index, name = target, f"x[{target}]"
        elif isinstance(target, str) and target:
            match = _INDEX_FORM.match(target)
            index = int(match.group(1)) if match else None
            name = target
        else:
            raise where.error(f"'feature' must be a feature name or x[i], got {bounded_repr(target)}")
    numeric = op in _NUMERIC_OPS or subject == "feature"
    value: Value
    if op in _SET_OPS:
        items = raw[op]
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
            raise where.error(f"operator '{op}' needs a non-empty list, got {bounded_repr(items)}")
        value = tuple(_parse_scalar(v, where, op, numeric) for v in items)
    else:
        value = _parse_scalar(raw[op], where, op, numeric)
    return Condition(subject=subject, name=name, op=op, value=value, index=index)


def _parse_labels(raw: object, classes: Sequence[str], where: _Where, key: str) -> frozenset[int]:
    items: list[object]
    if isinstance(raw, (str, int)) and not isinstance(raw, bool):
        items = [raw]
    elif isinstance(raw, Sequence) and not isinstance(raw, (str, bytes)):
        items = list(raw)
    else:
        raise where.error(f"'{key}' must be a list of class names or indices, got {bounded_repr(raw)}")
    if not items:
        raise where.error(f"'{key}' must list at least one label")
    names = {c: i for i, c in reversed(list(enumerate(classes)))}
    out: set[int] = set()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise where.error(f"'{key}': label {bounded_repr(item)} is neither a class name nor a class index")
        if isinstance(item, int):
            if not 0 <= item < len(classes):
                raise where.error(f"'{key}': class index {item} out of range 0..{len(classes) - 1}")
            out.add(item)
        elif item in names:
            out.add(names[item])
        else:
            raise where.error(f"'{key}': unknown class {bounded_repr(item)}")
    return frozenset(out)


def _parse_rule(raw: object, classes: Sequence[str], number: int, seen: set[str]) -> IdiRule:
    where = _Where(number, None)
    if not isinstance(raw, Mapping):
        raise where.error("must be a mapping with 'name', 'when' and 'allowed_labels' or 'forbidden_labels'")
    name = raw.get("name")
    if name is not None and isinstance(name, str):
        where.name = name
    for key in raw:
        if key not in _RULE_KEYS:
            raise where.error(f"unknown key {bounded_repr(key)} (expected one of {', '.join(_RULE_KEYS)})")
    if "name" not in raw:
        raise where.error("missing required key 'name'")
    if not isinstance(name, str) or not name.strip():
        raise where.error(f"'name' must be a non-empty string, got {bounded_repr(name)}")
    if name in seen:
        raise where.error(f"duplicate rule name {bounded_repr(name)}")
    if "when" not in raw:
        raise where.error("missing required key 'when'")
    when = raw["when"]
    conditions_raw = [when] if isinstance(when, Mapping) else when
    if not isinstance(conditions_raw, list) or not conditions_raw:
        raise where.error("'when' must be a condition or a non-empty list of conditions")
    conditions = tuple(_parse_condition(c, where, i + 1) for i, c in enumerate(conditions_raw))
    has_allowed, has_forbidden = "allowed_labels" in raw, "forbidden_labels" in raw
    if has_allowed == has_forbidden:
        raise where.error("needs exactly one of 'allowed_labels' and 'forbidden_labels'")
    allowed = _parse_labels(raw["allowed_labels"], classes, where, "allowed_labels") if has_allowed else None
    forbidden = _parse_labels(raw["forbidden_labels"], classes, where, "forbidden_labels") if has_forbidden else None
    return IdiRule(name=name, conditions=conditions, allowed=allowed, forbidden=forbidden)


# ----------------------------------------------------------------------------- rule set


class IdiRuleSet:
    """An ordered list of IDIs over a classifier's classes (the first firing rule is reported)."""

    def __init__(self, rules: Iterable[IdiRule], classes: Sequence[str]) -> None:
        self.rules: list[IdiRule] = list(rules)
        self.classes: tuple[str, ...] = tuple(str(c) for c in classes)
        for i, rule in enumerate(self.rules):
            labels = rule.allowed if rule.allowed is not None else rule.forbidden
            if labels is None or (rule.allowed is not None and rule.forbidden is not None):
                raise IdiRuleError(
                    f"rule {i + 1} ({bounded_repr(rule.name)}): needs exactly one of allowed / forbidden"
                )
            if any(not 0 <= label < len(self.classes) for label in labels):
                raise IdiRuleError(f"rule {i + 1} ({bounded_repr(rule.name)}): class index out of range")

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, text: str, classes: Sequence[str]) -> IdiRuleSet:
        """Parse the YAML rule language (safe loading only: Python tags, anchors and aliases are refused)."""
        if not classes:
            raise IdiRuleError("IDI rules need the model's class list")
        try:
            document = safe_load_yaml(text)
        except yaml.YAMLError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise IdiRuleError(f"not a valid IDI rule file: {first}") from exc
        except RecursionError:
            raise IdiRuleError("not a valid IDI rule file: nested too deeply") from None
        if not isinstance(document, Mapping) or "rules" not in document:
            raise IdiRuleError("an IDI rule file is a mapping with a 'rules' list")
        extra = [k for k in document if k != "rules"]
        if extra:
            raise IdiRuleError(f"unknown top-level key {bounded_repr(extra[0])} (only 'rules' is allowed)")
        raw_rules = document["rules"]
        if raw_rules is None:
            raw_rules = []
        if not isinstance(raw_rules, list):
            raise IdiRuleError("'rules' must be a list")
        seen: set[str] = set()
        rules = []
        for number, raw in enumerate(raw_rules, start=1):
            rule = _parse_rule(raw, classes, number, seen)
            seen.add(rule.name)
            rules.append(rule)
        return cls(rules, classes)

    @classmethod
    def load(cls, path: str | Path, classes: Sequence[str]) -> IdiRuleSet:
        """Read and parse a rule file; errors name the file."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise IdiRuleError(f"{path}: cannot read IDI rules ({exc.strerror or exc})") from exc
        except UnicodeDecodeError as exc:
            raise IdiRuleError(f"{path}: not UTF-8 text") from exc
        try:
            return cls.from_yaml(text, classes)
        except IdiRuleError as exc:
            raise IdiRuleError(f"{path}: {exc}") from exc

    def to_yaml(self) -> str:
        """The rules in the YAML language; ``from_yaml(to_yaml(), classes)`` gives equal rules."""
        by_name = len(set(self.classes)) == len(self.classes)

        def labels(indices: frozenset[int]) -> list[str | int]:
            # digits-like classes named by their own index read best as plain numbers
            return [self.classes[i] if by_name and self.classes[i] != str(i) else i for i in sorted(indices)]

        out = []
        for rule in self.rules:
            conditions = []
            for cond in rule.conditions:
                value: Any = list(cond.value) if isinstance(cond.value, tuple) else cond.value
                conditions.append({cond.subject: cond.name, cond.op: value})
            entry: dict[str, Any] = {"name": rule.name}
            entry["when"] = conditions[0] if len(conditions) == 1 else conditions
            if rule.allowed is not None:
                entry["allowed_labels"] = labels(rule.allowed)
            else:
                assert rule.forbidden is not None
                entry["forbidden_labels"] = labels(rule.forbidden)
            out.append(entry)
        return yaml.safe_dump({"rules": out}, sort_keys=False, allow_unicode=True, default_flow_style=None)

    # -- introspection ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.rules)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdiRuleSet) and self.rules == other.rules and self.classes == other.classes

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IdiRuleSet({len(self.rules)} rules, {len(self.classes)} classes)"

    @property
    def metadata_fields(self) -> frozenset[str]:
        """Metadata names the rules read."""
        return frozenset(c.name for r in self.rules for c in r.conditions if c.subject == "field")

    @property
    def input_fields(self) -> frozenset[str]:
        """Model inputs the rules read (their values are passed with the metadata, by name)."""
        return frozenset(c.name for r in self.rules for c in r.conditions if c.subject == "input")

    @property
    def feature_names_needed(self) -> frozenset[str]:
        """Tabular feature names the rules read (index-form ``x[i]`` features are not listed)."""
        return frozenset(c.name for r in self.rules for c in r.conditions if c.subject == "feature" and c.index is None)

    def validate_features(self, feature_names: Sequence[str] | None, n_features: int | None) -> None:
        """Raise :class:`IdiRuleError` when a feature condition cannot be resolved for this input.

        ``evaluate`` treats an unresolvable feature as missing (the condition is false); call
        this once at start-up to turn such a configuration mistake into a clear error.
        """
        names = list(feature_names) if feature_names is not None else None
        for number, rule in enumerate(self.rules, start=1):
            for cond in rule.conditions:
                if cond.subject != "feature":
                    continue
                where = _Where(number, rule.name)
                if cond.index is None:
                    if names is None or cond.name not in names:
                        raise where.error(f"unknown feature {bounded_repr(cond.name)}")
                elif n_features is not None and cond.index >= n_features:
                    raise where.error(f"feature {cond.name} out of range (the input has {n_features})")

    def describe(self, i: int) -> str:
        """Rule ``i`` as a clause, e.g. ``fail :- form = P1, output ∉ {0, 3, 6, 8, 9}``."""
        rule = self.rules[i]
        body = " & ".join(c.text() for c in rule.conditions)
        if rule.allowed is not None:
            head = "∉ {" + ", ".join(self.classes[j] for j in sorted(rule.allowed)) + "}"
        else:
            assert rule.forbidden is not None
            head = "∈ {" + ", ".join(self.classes[j] for j in sorted(rule.forbidden)) + "}"
        return f"fail :- {body}, output {head}"

    # -- evaluation ---------------------------------------------------------------------------

    def evaluate(
        self,
        labels: np.ndarray,
        metadata: Mapping[str, Sequence[Any] | np.ndarray | Any] | None = None,
        features: np.ndarray | None = None,
        feature_names: Sequence[str] | None = None,
    ) -> np.ndarray:
        """Index of the first rule that fires for each sample, ``-1`` when none does (int32 [N]).

        ``metadata`` maps a field to one value per sample or to a single (batch-level) value;
        ``features`` is the flat input [N, D] for feature conditions. Vectorised per rule.
        """
        labels = np.asarray(labels).reshape(-1)
        n = labels.shape[0]
        out = np.full(n, -1, dtype=np.int32)
        if n == 0 or not self.rules:
            return out
        flat = None
        if features is not None:
            flat = np.asarray(features)
            flat = flat.reshape(flat.shape[0], -1)
            if flat.shape[0] != n:
                raise ValueError(f"features have {flat.shape[0]} rows for {n} labels")
        columns: dict[str, _Column] = {}
        for i, rule in enumerate(self.rules):
            undecided = out == -1
            if not undecided.any():
                break
            if rule.allowed is not None:
                fires = ~np.isin(labels, np.fromiter(rule.allowed, dtype=np.int64))
            else:
                assert rule.forbidden is not None
                fires = np.isin(labels, np.fromiter(rule.forbidden, dtype=np.int64))
            fires &= undecided
            for cond in rule.conditions:
                if not fires.any():
                    break
                fires &= _condition_mask(cond, n, columns, metadata, flat, feature_names)
            out[fires] = i
        return out
