"""``rule`` at ``fit``: the selected TDI rules (:mod:`agent.estimation.segments.kinds.rule` reads them)."""

from __future__ import annotations

from collections.abc import Sequence

from agent.estimation.segments.kinds import rule as serving
from agent.estimation.segments.segmentation import Dimension
from agent.offline.calibration.segments.data import SegmentData, ViewShape
from agent.offline.calibration.segments.kinds.base import SegmentKindFit
from invariants.fit_params import CalibrationPlan
from invariants.tdi import TdiRule, format_threshold


def rule_name(
    index: int, rule: TdiRule, names: Sequence[str] | None, onehot: frozenset[int], classes: Sequence[str]
) -> str:
    """``TDI rule 12: x[3] > 0.5 & city!=paris => 7``: the rule's path read as conditions on the view's columns
    (a one-hot column's test as ``column=value`` or ``column!=value``) and the class its leaf predicts."""

    def condition(j: int, op: str, threshold: float) -> str:
        name = names[j] if names is not None and j < len(names) else f"x[{j}]"
        if j in onehot and "=" in name:
            return name if op == ">" else name.replace("=", "!=", 1)
        return f"{name} {op} {format_threshold(threshold)}"

    body = serving.CONDITIONS_JOIN.join(condition(j, op, t) for j, op, t in rule.conditions)
    cls = classes[rule.label] if 0 <= rule.label < len(classes) else str(rule.label)
    head = f"TDI rule {index}: {body}" if body else f"TDI rule {index}:"
    return f"{head}{serving.LEAF_CLASS}{cls}"


class Rule(SegmentKindFit):
    """The selected TDI rules of most training support one by one, as many as
    :attr:`~invariants.fit_params.CalibrationPlan.segment_rules` and the budget allow, the other selected rules
    together, and the predictions in no selected rule's leaf."""

    kind = serving.Rule

    def define(
        self, data: SegmentData, shape: ViewShape, plan: CalibrationPlan, budget: int, seed: int
    ) -> list[Dimension]:
        dim = _rules(data, shape, plan, budget)
        return [] if dim is None else [dim]


def _rules(data: SegmentData, shape: ViewShape, plan: CalibrationPlan, budget: int) -> Dimension | None:
    tdi = data.tdi
    if tdi is None:
        return None
    selected = [i for i, r in enumerate(tdi.rules) if r.selected]
    if not selected:
        return None
    selected.sort(key=lambda i: -tdi.rules[i].support)
    cap = min(plan.segment_rules, budget - 1)  # one segment left for "no selected TDI rule"
    if len(selected) > cap:  # and one for the other selected rules together
        cap = min(cap, budget - 2)
    if cap < 1:
        return None
    own = selected[:cap]
    onehot = frozenset(j for g in shape.columns if g.onehot for j in g.columns)
    names = [rule_name(i, tdi.rules[i], tdi.feature_names, onehot, data.classes) for i in own]
    rest = len(selected) > len(own)
    if rest:
        names.append("other selected TDI rules")
    names.append("no selected TDI rule")
    none_id = len(names) - 1
    lookup = [none_id] * len(tdi.rules)
    for j, i in enumerate(own):
        lookup[i] = j
    for i in selected[len(own) :]:
        lookup[i] = len(own)
    return Dimension(serving.Rule.name, "TDI rule", "rule", tuple(names), lookup=tuple(lookup))
