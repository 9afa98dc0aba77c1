"""Metamorphic robustness audit: label-preserving transformations of images and tables.

LAMPION (Applis, Panichella, van Deursen, ASE-NIER 2021) tests a model with *metamorphic
transformations* that keep the oracle's answer (§3): a transformed input must get the same label
as the original; a model whose label changes violates the metamorphic relation. Transformations
are configured (type, parameters, seed) and applied singly (*first order*) or composed (*higher
order*, §3 "order"); §4 compares the model's behaviour before and after with the Wilcoxon test.

Here the same idea for image and tabular classifiers:

* images ``[N, C, H, W]`` (or ``[N, H, W]``): ``shift`` (integer shift by at most ``max_pixels``,
  zero fill), ``brightness`` (offset of at most ``delta`` of the data range), ``contrast`` (scale
  around the image mean by ``1 ± amount``), ``gaussian_noise`` (``sigma`` of the data range),
  ``rotation`` (at most ``max_degrees``, bilinear, zero fill), ``blur`` (Gaussian, ``sigma`` px),
  ``hflip``/``vflip`` (only when flips are declared safe: a flipped 6 can be a 9). Results are
  clipped to the data's value range.
* tables ``[N, D]`` (any data): ``scale`` (every value ``×(1 + u)``, ``u ~ U[−epsilon, epsilon]``)
  and ``noise`` (``N(0, (sigma·std_j)²)`` added to column ``j``, ``std_j`` from the audited data).

Random parameters are drawn per sample from a generator seeded by the audit seed and the relation
name, so a relation's inputs do not depend on which other relations are configured. The
transformations themselves live in :mod:`agent.perturb.transforms`.

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

from agent.audits.report import AuditError, AuditResult, ProgressFn
from agent.perturb.transforms import TRANSFORMS, TransformContext

__all__ = [
    "MetamorphicConfigError",
    "TransformSpec",
    "apply_relation",
    "build_relations",
    "parse_specs",
    "run_metamorphic_audit",
    "wilson_interval",
]

PredictProba = Callable[[np.ndarray], np.ndarray]
Z95 = 1.959963984540054


class MetamorphicConfigError(AuditError):
    """The transformation configuration is invalid (unknown name/parameter, unsafe flip, ...)."""


@dataclass(frozen=True)
class TransformSpec:
    """One configured transformation: registry ``name``, parameters and a unique ``label``."""

    name: str
    params: Mapping[str, float] = field(default_factory=dict)
    label: str = ""

    def resolved(self) -> dict[str, float]:
        return {**TRANSFORMS[self.name].defaults, **self.params}


def parse_specs(
    items: Sequence[TransformSpec | str | Mapping[str, Any]], *, flips_safe: bool = False
) -> list[TransformSpec]:
    """Validate transformation specs given as names, dicts (``{"name": ..., "params": {...}}`` or
    ``{"name": ..., <param>: ...}``, optional ``"label"``) or :class:`TransformSpec`.

    Flips are refused unless ``flips_safe`` is declared. Duplicate labels get a numeric suffix.
    """
    if not items:
        raise MetamorphicConfigError("no transformations configured")
    specs: list[TransformSpec] = []
    seen: dict[str, int] = {}
    for item in items:
        if isinstance(item, TransformSpec):
            name, params, label = item.name, dict(item.params), item.label
        elif isinstance(item, str):
            name, params, label = item, {}, ""
        elif isinstance(item, Mapping):
            body = dict(item)
            name = body.pop("name", None)
            label = str(body.pop("label", "") or "")
            nested = body.pop("params", None)
            if nested is not None and not isinstance(nested, Mapping):
                raise MetamorphicConfigError(f"'params' of transformation {name!r} must be a mapping")
            params = {**(dict(nested) if nested else {}), **body}
        else:
            raise MetamorphicConfigError(f"cannot read transformation spec {item!r}")
        if not isinstance(name, str) or name not in TRANSFORMS:
            raise MetamorphicConfigError(f"unknown transformation {name!r}; choose from {', '.join(TRANSFORMS)}")
        info = TRANSFORMS[name]
        if info.is_flip and not flips_safe:
            raise MetamorphicConfigError(
                f"{name} is not label-preserving in general (a flipped 6 may read as 9); "
                "declare flips safe for this data set to use it"
            )
        unknown = sorted(set(params) - set(info.defaults))
        if unknown:
            raise MetamorphicConfigError(
                f"unknown parameter(s) {unknown} for {name}; it takes {sorted(info.defaults) or 'none'}"
            )
        clean: dict[str, float] = {}
        for key, value in params.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise MetamorphicConfigError(f"parameter {key} of {name} must be a finite number, got {value!r}")
            if value < 0 and key != "fill":
                raise MetamorphicConfigError(f"parameter {key} of {name} must be >= 0, got {value}")
            clean[key] = float(value)
        if name == "shift" and not float(clean.get("max_pixels", 2)).is_integer():
            raise MetamorphicConfigError("shift max_pixels must be a whole number of pixels")
        base = label or name
        if "+" in base:
            raise MetamorphicConfigError(f"transformation label {base!r} must not contain '+'")
        seen[base] = seen.get(base, 0) + 1
        specs.append(TransformSpec(name, clean, base if seen[base] == 1 else f"{base}_{seen[base]}"))
    return specs


def build_relations(
    specs: Sequence[TransformSpec], order: int, seed: int, max_compositions: int | None = None
) -> list[tuple[TransformSpec, ...]]:
    """The relations to test: each spec alone (``order=1``) or every combination of ``order``
    distinct specs, applied in configuration order; ``max_compositions`` keeps a seeded random
    subset of them."""
    if order < 1:
        raise MetamorphicConfigError(f"order must be >= 1, got {order}")
    if order > len(specs):
        raise MetamorphicConfigError(f"order {order} needs at least {order} transformations, got {len(specs)}")
    combos = list(itertools.combinations(specs, order))
    if max_compositions is not None:
        if max_compositions < 1:
            raise MetamorphicConfigError(f"max_compositions must be >= 1, got {max_compositions}")
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
    """Transform a batch by the relation's transformations in order (seeded by seed and name)."""
    rng = _relation_rng(seed, _relation_name(relation))
    out = np.asarray(x, dtype=np.float64)
    for spec in relation:
        info = TRANSFORMS[spec.name]
        if info.images_only and out.ndim < 3:
            raise MetamorphicConfigError(f"{spec.name} needs images [N, (C,) H, W]; the data has shape {list(x.shape)}")
        out = info.fn(out, rng, ctx, spec.resolved())
    return out.astype(x.dtype, copy=False) if x.dtype.kind == "f" else out


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (95 % by default); ``(0, 1)`` for ``n = 0``."""
    if n <= 0:
        return 0.0, 1.0
    phat = successes / n
    denom = 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    lower = 0.0 if successes <= 0 else max(0.0, centre - half)
    upper = 1.0 if successes >= n else min(1.0, centre + half)
    return lower, upper


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


def _predict(predict_proba: PredictProba, x: np.ndarray, batch_size: int | None) -> np.ndarray:
    if batch_size is None or len(x) <= batch_size:
        return np.asarray(predict_proba(x), dtype=np.float64)
    return np.concatenate(
        [np.asarray(predict_proba(x[i : i + batch_size]), dtype=np.float64) for i in range(0, len(x), batch_size)]
    )


def _key(name: str) -> str:
    return name.replace("+", "__")


def run_metamorphic_audit(
    predict_proba: PredictProba,
    x: np.ndarray,
    *,
    transformations: Sequence[TransformSpec | str | Mapping[str, Any]],
    order: int = 1,
    seed: int = 0,
    max_compositions: int | None = None,
    flips_safe: bool = False,
    value_range: tuple[float, float] | None = None,
    batch_size: int | None = 1024,
    progress: ProgressFn | None = None,
) -> AuditResult:
    """Metamorphic audit of a classifier on reference inputs ``x`` (no labels needed).

    ``value_range`` (clipping range of image transformations) defaults to ``(min(x), max(x))``.
    Metrics: ``overall_violation_rate`` (pooled over relations) with ``_lower``/``_upper``,
    ``overall_mean_confidence_drop``, ``max_violation_rate``, ``any_violation_rate`` (share of
    inputs that violate at least one relation), and per relation ``<relation>_violation_rate``,
    ``_lower``, ``_upper``, ``<relation>_mean_confidence_drop``, ``<relation>_wilcoxon_p``
    (``+`` in composed relation names becomes ``__`` in metric keys).
    """
    specs = parse_specs(transformations, flips_safe=flips_safe)
    relations = build_relations(specs, order, seed, max_compositions)
    x = np.asarray(x)
    if x.ndim < 2 or len(x) == 0:
        raise AuditError(f"metamorphic audit needs a batch [N, ...] of inputs, got shape {list(x.shape)}")
    if x.dtype.kind not in "fiu":
        raise AuditError(f"inputs must be numeric, got {x.dtype}")
    lo, hi = value_range if value_range is not None else (float(np.min(x)), float(np.max(x)))
    ctx = TransformContext((float(lo), float(hi)), x.reshape(len(x), -1).std(axis=0).astype(np.float64), flips_safe)

    base = _predict(predict_proba, x, batch_size)
    if base.ndim != 2 or len(base) != len(x):
        raise AuditError(f"predict_proba must return [N, K] probabilities, got shape {list(base.shape)}")
    labels = base.argmax(axis=1)
    rows = np.arange(len(x))
    conf0 = base[rows, labels]
    any_violation = np.zeros(len(x), dtype=bool)
    per_relation: list[dict[str, Any]] = []
    metrics: dict[str, float] = {}
    total_violations = 0
    drops: list[np.ndarray] = []
    for done, relation in enumerate(relations, start=1):
        name = _relation_name(relation)
        moved = apply_relation(x, relation, seed, ctx)
        probs = _predict(predict_proba, moved, batch_size)
        violated = probs.argmax(axis=1) != labels
        conf1 = probs[rows, labels]
        change = conf1 - conf0
        v = int(violated.sum())
        lower, upper = wilson_interval(v, len(x))
        key = _key(name)
        values = {
            "violation_rate": v / len(x),
            "violation_rate_lower": lower,
            "violation_rate_upper": upper,
            "mean_confidence_drop": float(-change.mean()),
            "wilcoxon_p": _wilcoxon_p(change),
        }
        per_relation.append(
            {
                "relation": name,
                "key": key,
                "transformations": [{"name": s.name, "label": s.label, "params": s.resolved()} for s in relation],
                "n": len(x),
                "violations": v,
                **values,
            }
        )
        metrics.update({f"{key}_{m}": val for m, val in values.items()})
        any_violation |= violated
        total_violations += v
        drops.append(-change)
        if progress is not None:
            progress(done, len(relations))
    pairs = len(x) * len(relations)
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
    params = {
        "order": order,
        "seed": seed,
        "max_compositions": max_compositions,
        "flips_safe": flips_safe,
        "value_range": [float(lo), float(hi)],
        "n_samples": len(x),
        "transformations": [{"name": s.name, "label": s.label, "params": s.resolved()} for s in specs],
    }
    details = {
        "relations": per_relation,
        "overall": {**overall, "n_pairs": pairs, "violations": total_violations, "worst_relation": worst},
        "violation_definition": "predicted label of the transformed input differs from that of the original",
        "confidence_definition": "probability of the original input's predicted label",
    }
    return AuditResult("metamorphic", params, {**overall, **metrics}, details)
