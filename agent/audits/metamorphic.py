"""Metamorphic robustness audit: label-preserving transformations of images, tables, text, categories
and token sequences.

LAMPION (Applis, Panichella, van Deursen, ASE-NIER 2021) tests a model with *metamorphic
transformations* that keep the oracle's answer (§3): a transformed input must get the same label
as the original; a model whose label changes violates the metamorphic relation. Transformations
are configured (type, parameters, seed) and applied singly (*first order*) or composed (*higher
order*, §3 "order"); §4 compares the model's behaviour before and after with the Wilcoxon test.

Here the same idea for classifiers of any inputs; each relation transforms the inputs of its kind
(:mod:`agent.audits.modalities`) and leaves the others alone:

* images ``[N, C, H, W]`` (or ``[N, H, W]``, ``[N, H, W, C]``): ``shift`` (integer shift by at most
  ``max_pixels``, zero fill), ``brightness`` (offset of at most ``delta`` of the data range),
  ``contrast`` (scale around the image mean by ``1 ± amount``), ``gaussian_noise`` (``sigma`` of the
  data range), ``rotation`` (at most ``max_degrees``, bilinear, zero fill), ``blur`` (Gaussian,
  ``sigma`` px), ``hflip``/``vflip`` (only when flips are declared safe: a flipped 6 can be a 9).
  Results are clipped to the data's value range.
* numbers (table columns, and images): ``scale`` (every value ``×(1 + u)``, ``u ~ U[−epsilon,
  epsilon]``) and ``noise`` (``N(0, (sigma·std_j)²)`` added to column ``j``, ``std_j`` from the
  audited data).
* text, categories and token ids: ``typos``, ``case``, ``whitespace``, ``punctuation``;
  ``unseen_category``, ``category_swap``; ``token_swap``, ``token_drop``, ``truncate``
  (:mod:`agent.audits.relations`, which holds every relation).

A relation that does not apply to the model (no input of its kind) is refused with the list of those
that do. Random parameters are drawn per sample from a generator seeded by the audit seed and the
relation name, so a relation's inputs do not depend on which other relations are configured.

Per relation the audit reports the violation rate (share of inputs whose predicted label changes)
with a Wilson 95 % interval, the mean drop of the confidence in the original label, the Wilcoxon
signed-rank p-value of that confidence change, and ``n``.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.audits.modalities import InputKinds, input_kinds
from agent.audits.relations import RELATIONS, RelationContext, applicable, not_applicable, targets
from agent.audits.report import AuditError, AuditResult, ProgressFn
from agent.estimation.intervals import Z95, wilson
from agent.model.inputs import Inputs, InputSpec, Signature
from agent.perturb.transforms import TRANSFORMS, TransformContext

__all__ = [
    "TransformSpec",
    "apply_relation",
    "apply_to_inputs",
    "build_relations",
    "parse_specs",
    "run_metamorphic_audit",
    "wilson_interval",
]

PredictProba = Callable[[Any], np.ndarray]


@dataclass(frozen=True)
class TransformSpec:
    """One configured transformation: registry ``name``, parameters, a unique ``label`` and the
    ``inputs`` it is confined to (empty: every input of its kind)."""

    name: str
    params: Mapping[str, float] = field(default_factory=dict)
    label: str = ""
    inputs: tuple[str, ...] = ()

    def resolved(self) -> dict[str, float]:
        return {**RELATIONS[self.name].defaults, **self.params}

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "label": self.label, "params": self.resolved()}
        if self.inputs:
            out["inputs"] = list(self.inputs)
        return out


def _input_names(name: str, value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not names or not all(isinstance(n, str) and n for n in names):
        raise AuditError(f"'input' of transformation {name!r} must be an input name or a list of them")
    return tuple(names)


def parse_specs(
    items: Sequence[TransformSpec | str | Mapping[str, Any]], *, flips_safe: bool = False
) -> list[TransformSpec]:
    """Validate transformation specs given as names, dicts (``{"name": ..., "params": {...}}`` or
    ``{"name": ..., <param>: ...}``, optional ``"label"`` and ``"input"``) or :class:`TransformSpec`.

    Flips are refused unless ``flips_safe`` is declared. Duplicate labels get a numeric suffix.
    """
    if not items:
        raise AuditError("no transformations configured")
    specs: list[TransformSpec] = []
    seen: dict[str, int] = {}
    for item in items:
        inputs: tuple[str, ...] = ()
        if isinstance(item, TransformSpec):
            name, params, label, inputs = item.name, dict(item.params), item.label, item.inputs
        elif isinstance(item, str):
            name, params, label = item, {}, ""
        elif isinstance(item, Mapping):
            body = dict(item)
            name = body.pop("name", None)
            label = str(body.pop("label", "") or "")
            if "input" in body:
                inputs = _input_names(str(name), body.pop("input"))
            nested = body.pop("params", None)
            if nested is not None and not isinstance(nested, Mapping):
                raise AuditError(f"'params' of transformation {name!r} must be a mapping")
            params = {**(dict(nested) if nested else {}), **body}
        else:
            raise AuditError(f"cannot read transformation spec {item!r}")
        if not isinstance(name, str) or name not in RELATIONS:
            raise AuditError(f"unknown transformation {name!r}; choose from {', '.join(RELATIONS)}")
        info = RELATIONS[name]
        if info.is_flip and not flips_safe:
            raise AuditError(
                f"{name} is not label-preserving in general (a flipped 6 may read as 9); "
                "declare flips safe for this data set to use it"
            )
        unknown = sorted(set(params) - set(info.defaults))
        if unknown:
            raise AuditError(f"unknown parameter(s) {unknown} for {name}; it takes {sorted(info.defaults) or 'none'}")
        clean: dict[str, float] = {}
        for key, value in params.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise AuditError(f"parameter {key} of {name} must be a finite number, got {value!r}")
            if value < 0 and key != "fill":
                raise AuditError(f"parameter {key} of {name} must be >= 0, got {value}")
            if key == "strength" and value > 1:
                raise AuditError(f"parameter strength of {name} must be <= 1, got {value}")
            if key == "vocab" and not float(value).is_integer():
                raise AuditError(f"parameter vocab of {name} must be a whole number of ids")
            clean[key] = float(value)
        if name == "shift" and not float(clean.get("max_pixels", 2)).is_integer():
            raise AuditError("shift max_pixels must be a whole number of pixels")
        base = label or name
        if "+" in base:
            raise AuditError(f"transformation label {base!r} must not contain '+'")
        seen[base] = seen.get(base, 0) + 1
        specs.append(TransformSpec(name, clean, base if seen[base] == 1 else f"{base}_{seen[base]}", inputs))
    return specs


def build_relations(
    specs: Sequence[TransformSpec], order: int, seed: int, max_compositions: int | None = None
) -> list[tuple[TransformSpec, ...]]:
    """The relations to test: each spec alone (``order=1``) or every combination of ``order``
    distinct specs, applied in configuration order; ``max_compositions`` keeps a seeded random
    subset of them."""
    if order < 1:
        raise AuditError(f"order must be >= 1, got {order}")
    if order > len(specs):
        raise AuditError(f"order {order} needs at least {order} transformations, got {len(specs)}")
    combos = list(itertools.combinations(specs, order))
    if max_compositions is not None:
        if max_compositions < 1:
            raise AuditError(f"max_compositions must be >= 1, got {max_compositions}")
        if max_compositions < len(combos):
            rng = np.random.default_rng([seed, 0x5EED])
            keep = sorted(rng.choice(len(combos), size=max_compositions, replace=False).tolist())
            combos = [combos[i] for i in keep]
    return combos


def _relation_name(relation: Sequence[TransformSpec]) -> str:
    return "+".join(s.label for s in relation)


def _relation_rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))


def apply_relation(x: np.ndarray, relation: Sequence[TransformSpec], seed: int, ctx: TransformContext) -> np.ndarray:
    """Transform an array of images or table rows by the relation's transformations in order (seeded by
    seed and name); relations of other inputs go through :func:`apply_to_inputs`."""
    rng = _relation_rng(seed, _relation_name(relation))
    out = np.asarray(x, dtype=np.float64)
    for spec in relation:
        if spec.name not in TRANSFORMS:
            raise AuditError(f"{spec.name} transforms {RELATIONS[spec.name].kind} inputs, not an array")
        info = TRANSFORMS[spec.name]
        if info.images_only and out.ndim < 3:
            raise AuditError(f"{spec.name} needs images [N, (C,) H, W]; the data has shape {list(x.shape)}")
        out = info.fn(out, rng, ctx, spec.resolved())
    return out.astype(x.dtype, copy=False) if x.dtype.kind == "f" else out


def apply_to_inputs(
    batch: Inputs,
    relation: Sequence[TransformSpec],
    seed: int,
    ctx: RelationContext,
    where: Mapping[str, Sequence[str]],
) -> Inputs:
    """Transform a batch by the relation's transformations in order, each on its inputs (``where``: by
    spec label; seeded by seed and relation name)."""
    rng = _relation_rng(seed, _relation_name(relation))
    out = batch
    for spec in relation:
        fn, params = RELATIONS[spec.name].fn, spec.resolved()
        for name in where[spec.label]:
            out = fn(out, name, rng, ctx, params)
    return out


def check_applies(
    specs: Sequence[TransformSpec], kinds: InputKinds, flips_safe: bool = False
) -> dict[str, tuple[str, ...]]:
    """The inputs each spec transforms (by label); a spec that fits no input of the model raises a
    one-line :class:`~agent.audits.report.AuditError` naming the relations that apply."""
    where: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        why = not_applicable(spec.name, kinds, spec.inputs)
        if why is not None:
            raise AuditError(
                f"{why}; relations that apply to this model: {', '.join(applicable(kinds, flips_safe)) or 'none'}"
            )
        where[spec.label] = targets(spec.name, kinds, spec.inputs)
    return where


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a violation rate (:func:`~agent.estimation.intervals.wilson`, 95 % by
    default) with exact ends: 0 when nothing was violated, 1 when everything was; ``(0, 1)`` for ``n = 0``."""
    if n <= 0:
        return 0.0, 1.0
    lower, upper = wilson(successes, n, z)
    return (0.0 if successes <= 0 else lower), (1.0 if successes >= n else upper)


def _wilcoxon_p(diff: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired differences; 1.0 when all are zero."""
    from scipy.stats import wilcoxon  # scipy stays out of start-up until an audit runs

    nonzero = diff[diff != 0]
    if len(nonzero) == 0:
        return 1.0
    try:
        return float(wilcoxon(nonzero, zero_method="wilcox").pvalue)
    except ValueError:
        return math.nan


def _predict(predict: Callable[[Inputs], np.ndarray], x: Inputs, batch_size: int | None) -> np.ndarray:
    if batch_size is None or x.n <= batch_size:
        return np.asarray(predict(x), dtype=np.float64)
    return np.concatenate([np.asarray(predict(b), dtype=np.float64) for b in x.batches(batch_size)])


def _as_inputs(
    predict_proba: PredictProba, x: np.ndarray | Inputs
) -> tuple[Inputs, Callable[[Inputs], np.ndarray], Signature]:
    """A batch as :class:`Inputs` and a predict function on them: an array is one input (``x``) whose
    rows ``predict_proba`` takes as they are."""
    if isinstance(x, Inputs):
        sig = Signature(tuple(_spec_of(name, arr) for name, arr in x.items()))
        return x, predict_proba, sig
    arr = np.asarray(x)
    if arr.ndim < 2 or len(arr) == 0:
        raise AuditError(f"metamorphic audit needs a batch [N, ...] of inputs, got shape {list(arr.shape)}")
    if arr.dtype.kind not in "fiuOUS":
        raise AuditError(f"inputs must be numbers or text, got {arr.dtype}")
    return Inputs({"x": arr}), lambda b: predict_proba(b["x"]), Signature((_spec_of("x", arr),))


def _spec_of(name: str, arr: np.ndarray) -> InputSpec:
    dtype = np.dtype(object) if arr.dtype.kind in "OUS" else arr.dtype
    return InputSpec(name, dtype, tuple(arr.shape[1:]))


def _value_range(ctx: RelationContext) -> list[float] | dict[str, list[float]] | None:
    """The clipping range of image transformations: ``[lo, hi]`` of a model's one numeric input, else
    per input."""
    ranges = {k: [float(lo), float(hi)] for k, (lo, hi) in ctx.value_ranges.items()}
    if len(ranges) == 1:
        return next(iter(ranges.values()))
    return ranges or None


def _key(name: str) -> str:
    return name.replace("+", "__")


def run_metamorphic_audit(
    predict_proba: PredictProba,
    x: np.ndarray | Inputs,
    *,
    transformations: Sequence[TransformSpec | str | Mapping[str, Any]],
    order: int = 1,
    seed: int = 0,
    max_compositions: int | None = None,
    flips_safe: bool = False,
    value_range: tuple[float, float] | None = None,
    batch_size: int | None = 1024,
    progress: ProgressFn | None = None,
    kinds: InputKinds | None = None,
) -> AuditResult:
    """Metamorphic audit of a classifier on reference inputs ``x`` (no labels needed).

    ``x`` is one array (images or table rows, which ``predict_proba`` takes as they are) or a model's
    :class:`Inputs` (which ``predict_proba`` takes; ``kinds``: what each input holds, by default from
    the arrays and their values). ``value_range`` (clipping range of image transformations) defaults
    to each input's ``(min, max)``.
    Metrics: ``overall_violation_rate`` (pooled over relations) with ``_lower``/``_upper``,
    ``overall_mean_confidence_drop``, ``max_violation_rate``, ``any_violation_rate`` (share of
    inputs that violate at least one relation), and per relation ``<relation>_violation_rate``,
    ``_lower``, ``_upper``, ``<relation>_mean_confidence_drop``, ``<relation>_wilcoxon_p``
    (``+`` in composed relation names becomes ``__`` in metric keys).
    """
    specs = parse_specs(transformations, flips_safe=flips_safe)
    relations = build_relations(specs, order, seed, max_compositions)
    batch, predict, signature = _as_inputs(predict_proba, x)
    if batch.n == 0:
        raise AuditError("metamorphic audit needs at least one input")
    kinds = kinds if kinds is not None else input_kinds(signature, batch)
    where = check_applies(specs, kinds, flips_safe)
    ctx = RelationContext.of(batch, kinds, value_range, flips_safe)
    n = batch.n

    base = _predict(predict, batch, batch_size)
    if base.ndim != 2 or len(base) != n:
        raise AuditError(f"predict_proba must return [N, K] probabilities, got shape {list(base.shape)}")
    labels = base.argmax(axis=1)
    rows = np.arange(n)
    conf0 = base[rows, labels]
    any_violation = np.zeros(n, dtype=bool)
    per_relation: list[dict[str, Any]] = []
    drops: list[np.ndarray] = []
    for done, relation in enumerate(relations, start=1):
        moved = apply_to_inputs(batch, relation, seed, ctx, where)
        probs = _predict(predict, moved, batch_size)
        violated = probs.argmax(axis=1) != labels
        change = probs[rows, labels] - conf0
        per_relation.append(_relation_outcome(relation, where, violated, change))
        any_violation |= violated
        drops.append(-change)
        if progress is not None:
            progress(done, len(relations))
    metrics = {f"{r['key']}_{m}": r[m] for r in per_relation for m in _RELATION_METRICS}
    overall, totals = _overall(per_relation, drops, any_violation)
    params = {
        "order": order,
        "seed": seed,
        "max_compositions": max_compositions,
        "flips_safe": flips_safe,
        "value_range": _value_range(ctx),
        "n_samples": n,
        "transformations": [s.describe() for s in specs],
        "inputs": {k: list(kinds.of_kind(k)) for k in kinds.present},
    }
    details = {
        "relations": per_relation,
        "overall": {**overall, **totals},
        "violation_definition": "predicted label of the transformed input differs from that of the original",
        "confidence_definition": "probability of the original input's predicted label",
    }
    return AuditResult("metamorphic", params, {**overall, **metrics}, details)


#: The metrics of one relation, each ``<relation>_<metric>`` in the result's metrics.
_RELATION_METRICS = (
    "violation_rate",
    "violation_rate_lower",
    "violation_rate_upper",
    "mean_confidence_drop",
    "wilcoxon_p",
)


def _relation_outcome(
    relation: Sequence[TransformSpec], where: Mapping[str, Sequence[str]], violated: np.ndarray, change: np.ndarray
) -> dict[str, Any]:
    """One relation's row of the details: which inputs it moved, its violations and confidence change."""
    n = len(violated)
    v = int(violated.sum())
    lower, upper = wilson_interval(v, n)
    name = _relation_name(relation)
    return {
        "relation": name,
        "key": _key(name),
        "transformations": [s.describe() for s in relation],
        "inputs": sorted({i for s in relation for i in where[s.label]}),
        "n": n,
        "violations": v,
        "violation_rate": v / n,
        "violation_rate_lower": lower,
        "violation_rate_upper": upper,
        "mean_confidence_drop": float(-change.mean()),
        "wilcoxon_p": _wilcoxon_p(change),
    }


def _overall(
    per_relation: list[dict[str, Any]], drops: list[np.ndarray], any_violation: np.ndarray
) -> tuple[dict[str, float], dict[str, Any]]:
    """The metrics pooled over the relations, and the counts behind them (for the details)."""
    pairs = sum(r["n"] for r in per_relation)
    total_violations = sum(r["violations"] for r in per_relation)
    lower, upper = wilson_interval(total_violations, pairs)
    rates = [r["violation_rate"] for r in per_relation]
    worst = per_relation[int(np.argmax(rates))]["relation"]
    overall = {
        "overall_violation_rate": total_violations / pairs,
        "overall_violation_rate_lower": lower,
        "overall_violation_rate_upper": upper,
        "overall_mean_confidence_drop": float(np.concatenate(drops).mean()),
        "max_violation_rate": float(max(rates)),
        "any_violation_rate": float(any_violation.mean()),
    }
    return overall, {"n_pairs": pairs, "violations": total_violations, "worst_relation": worst}
