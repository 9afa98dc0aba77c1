"""The built-in audit kinds, registered in :mod:`agent.audits.registry`: D-Score, data mutation and
metamorphic testing, each with its run function, the models it applies to, CLI flags, printed summaries
and gauges.

Which kind applies to which model follows from the kinds of its inputs (:mod:`agent.audits.modalities`):
D-Score needs a convolutional image model; data mutation needs numeric inputs (and skips the others);
metamorphic relations exist for images, numbers, text, categories and token ids.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from agent.audits.dscore.run import run_dscore
from agent.audits.metamorphic import run_metamorphic_audit
from agent.audits.modalities import InputKinds, input_kinds
from agent.audits.params import (
    DEFAULT_CELL_SHARE,
    DScoreJob,
    DScoreParams,
    MetamorphicJob,
    MetamorphicParams,
    MutationJob,
    MutationParams,
)
from agent.audits.registry import AuditKind, CliRun, register
from agent.audits.relations import default_relations
from agent.audits.report import AuditError, AuditResult, ProgressFn
from agent.data.limits import DataLimits
from agent.errors import UserError
from agent.model.inputs import Inputs
from agent.model.views import is_image
from exporters.audit_metrics import GaugeSpec, GaugeValues
from invariants.untrusted import safe_load_yaml

if TYPE_CHECKING:
    from agent.audits.mutation.run import MutationPlan
    from agent.model.classifier import OnnxClassifier

#: Whether a model (by sha256) has ``Conv`` nodes; a few kept, the graph is parsed once per model.
_CONV_MODELS: dict[str, bool] = {}
MUTATION_METRICS: tuple[str, ...] = ("mae", "mse", "rmse", "accuracy")


def read_yaml(text_or_path: str, what: str) -> Any:
    """A YAML file's content, or ``text_or_path`` itself parsed as YAML when it is no file."""
    p = Path(text_or_path)
    try:
        is_file = p.is_file()
    except OSError:
        is_file = False
    text = p.read_text(encoding="utf-8") if is_file else text_or_path
    try:
        return safe_load_yaml(text)
    except RecursionError:
        raise UserError(f"{what}: not valid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{what}: not valid YAML: {getattr(exc, 'problem', exc)}") from None


def _inputs(model: OnnxClassifier, x: np.ndarray | Inputs) -> Inputs:
    return x if isinstance(x, Inputs) else Inputs({model.signature.names[0]: x})


def _kinds(model: OnnxClassifier, x: np.ndarray | Inputs) -> tuple[Inputs, InputKinds]:
    batch = _inputs(model, x)
    return batch, input_kinds(model.signature, batch, model.view)


# -- D-Score ----------------------------------------------------------------------------------------------
def _has_conv(model: OnnxClassifier) -> bool:
    found = _CONV_MODELS.get(model.sha256)
    if found is None:
        import onnx  # the graph is read only when D-Score is asked of a model

        graph = onnx.load_from_string(model.model_bytes).graph
        found = any(node.op_type == "Conv" and node.domain in ("", "ai.onnx") for node in graph.node)
        if len(_CONV_MODELS) >= 8:
            _CONV_MODELS.clear()
        _CONV_MODELS[model.sha256] = found
    return found


def _dscore_applies(model: OnnxClassifier, kinds: InputKinds) -> str | None:
    spec = model.signature.single
    need = "D-Score needs a convolutional image model (one image input [N, C, H, W] and Conv layers)"
    if spec is None or not is_image(spec) or len(spec.shape) != 3:
        return f"{need}; model {model.name!r} takes {kinds.describe()}"
    if not _has_conv(model):
        return f"{need}; model {model.name!r} has no Conv layer"
    return None


def _run_dscore(
    model: OnnxClassifier,
    x: np.ndarray | Inputs,
    y: np.ndarray | None,
    params: DScoreParams,
    guard: ProgressFn,
    heatmaps: bool,
) -> AuditResult:
    if isinstance(x, Inputs):
        raise AuditError("D-Score needs a convolutional image model with one image input")
    audit = run_dscore(
        model.model_bytes,
        x,
        y,
        n=params.n,
        t=params.t,
        batch_size=params.batch_size,
        output_name=model.scores_output,
        progress=guard,
    )
    result = audit.to_audit_result(heatmaps=heatmaps)
    result.details["base_accuracy"] = audit.base_accuracy
    return result


def _dscore_args(d: argparse.ArgumentParser) -> None:
    d.add_argument("--n", type=int, default=3, help="n×n regions (default 3)")
    d.add_argument("--t", type=float, default=5.0, help="translation hyper-parameter t (default 5)")


def _dscore_summary(out: dict[str, Any]) -> list[str]:
    m = out["result"]["metrics"]
    d = out["result"]["details"]
    n = out["result"]["params"]["n"]
    lines = [
        f"  D-Score {m['dscore']:.4f} = fitness {m['fitness']:.4f} - robustness {m['robustness']:.4f}"
        f"  (base accuracy {m['base_accuracy']:.4f}{', label-free' if d['label_free'] else ''})"
    ]
    for name, key in (
        ("variant accuracy (region deleted)", "variant_accuracies"),
        ("accuracy on translated inputs", "translated_accuracies"),
    ):
        vals = d[key]
        lines.append(f"  {name}:")
        for r in range(n):
            lines.append("    " + "  ".join(f"{v:.3f}" for v in vals[r * n : (r + 1) * n]))
    lines.append(f"  augmentation probability p = {m['augmentation_probability']:.4f}")
    return lines


def _dscore_json(out: dict[str, Any]) -> dict[str, Any]:
    details = out["result"]["details"]
    return {
        **details["score"],
        "base_accuracy": details["base_accuracy"],
        "variant_accuracies": details["variant_accuracies"],
        "translated_accuracies": details["translated_accuracies"],
        **out,
    }


def _dscore_demo(m: Mapping[str, Any]) -> str:
    return (
        f"D-Score {m['dscore']:.3f} (fitness {m['fitness']:.3f}, robustness {m['robustness']:.4f}), "
        f"accuracy {m['base_accuracy']:.3f} -> {m['min_translated_accuracy']:.3f} at worst when translated"
    )


def _dscore_export(result: AuditResult) -> dict[str, GaugeValues]:
    m = result.metrics
    return {
        "icos_dscore": {(): m["dscore"]},
        "icos_dscore_robustness": {(): m["robustness"]},
        "icos_dscore_fitness": {(): m["fitness"]},
        "icos_dscore_base_accuracy_ratio": {(): m["base_accuracy"]},
    }


DSCORE = register(
    AuditKind(
        name="dscore",
        params=DScoreParams,
        job=DScoreJob,
        run=_run_dscore,
        help="D-Score: region deletion and translation (white-box CNN diagnosis)",
        add_arguments=_dscore_args,
        cli_params=lambda args: {"n": args.n, "t": args.t},
        summary_lines=_dscore_summary,
        demo_line=_dscore_demo,
        gauges=(
            GaugeSpec("icos_dscore", "D-Score (eq. 6) of the last successful audit.", baseline=True),
            GaugeSpec("icos_dscore_robustness", "D-Score v_robust (eq. 4, lower is better)."),
            GaugeSpec("icos_dscore_fitness", "D-Score v_fitness (eq. 3)."),
            GaugeSpec("icos_dscore_base_accuracy_ratio", "Accuracy of the unmodified model in the last D-Score audit."),
        ),
        export=_dscore_export,
        cli_json=_dscore_json,
        applies=_dscore_applies,
    )
)


# -- data mutation ----------------------------------------------------------------------------------------
def _mutation_applies(model: OnnxClassifier, kinds: InputKinds) -> str | None:
    if kinds.mutable:
        return None
    return (
        f"data mutation (DEC/IMP/SGN/DIG) changes numbers; model {model.name!r} has no numeric input "
        f"(it takes {kinds.describe()})"
    )


def _mutation_scope(kinds: InputKinds) -> str:
    skipped = kinds.not_mutable
    return f"numeric inputs only: {', '.join(kinds.mutable)}" if skipped and kinds.mutable else ""


def _mutation_plan(params: MutationParams) -> MutationPlan:
    """What both mutation audits (of a fixed model, and retrain mode) mutate, read from ``params``."""
    # pandas stays out of the agent's start-up until a mutation audit runs
    from agent.audits.mutation.run import MutationPlan

    return MutationPlan(params.k, params.cell_share, params.repetitions, params.seed, params.operators)


def _run_mutation(
    model: OnnxClassifier,
    x: np.ndarray | Inputs,
    y: np.ndarray | None,
    params: MutationParams,
    guard: ProgressFn,
    _: bool,
) -> AuditResult:
    # pandas stays out of the agent's start-up until a mutation audit runs
    from agent.audits.mutation.run import run_mutation_audit

    plan = _mutation_plan(params)
    if not isinstance(x, Inputs):
        return run_mutation_audit(model.predict_proba, x, y, plan, progress=guard, batch_size=params.batch_size)
    batch, kinds = _kinds(model, x)
    if not kinds.mutable:
        raise AuditError(_mutation_applies(model, kinds) or "no numeric input to mutate")
    return run_mutation_audit(
        model.predict_proba,
        batch,
        y,
        plan,
        progress=guard,
        batch_size=params.batch_size,
        mutable=kinds.mutable,
        skipped=kinds.not_mutable,
    )


def _mutation_args(m: argparse.ArgumentParser) -> None:
    m.add_argument(
        "--k", type=int, default=None, help="mutated cells per repetition (default: --cell-share of the cells)"
    )
    m.add_argument(
        "--cell-share",
        type=float,
        default=DEFAULT_CELL_SHARE,
        help=f"share of the data's cells mutated per repetition when --k is not given (default {DEFAULT_CELL_SHARE})",
    )
    m.add_argument("--repetitions", type=int, default=5)
    m.add_argument("--operators", default="DEC,IMP,SGN,DIG", help="comma-separated subset of DEC,IMP,SGN,DIG")
    m.add_argument("--seed", type=int, default=0)
    r = m.add_argument_group("retrain mode (the paper's procedure: mutate the training set, retrain)")
    r.add_argument("--spec", help="YAML estimator spec: {estimator: sklearn.ensemble.RandomForestRegressor, params}")
    r.add_argument("--train", help="training table (CSV/Parquet)")
    r.add_argument("--test", help="test table (CSV/Parquet)")
    r.add_argument("--target", help="target column")


def _mutation_params(args: argparse.Namespace) -> dict[str, Any]:
    ops = [o for o in args.operators.split(",") if o.strip()]
    return {
        "k": args.k,
        "cell_share": args.cell_share,
        "repetitions": args.repetitions,
        "operators": ops,
        "seed": args.seed,
    }


def _mutation_retrain(args: argparse.Namespace, params: MutationParams, progress: ProgressFn) -> CliRun | None:
    """Retrain mode (§4-5): mutate ``k`` cells of the training table, retrain the estimator of
    ``--spec``, evaluate on the clean test table; ``None`` when none of its flags is given."""
    if not any(getattr(args, a) for a in ("spec", "train", "test", "target")):
        return None
    # pandas and scikit-learn stay out of the CLI's start-up until retrain mode runs
    from agent.audits.mutation.retrain import read_table, run_retrain_audit

    missing = [f"--{a}" for a in ("spec", "train", "test", "target") if not getattr(args, a)]
    if missing:
        raise UserError(f"retrain mode needs --spec, --train, --test and --target; missing {', '.join(missing)}")
    if args.model or args.data:
        raise UserError("retrain mode trains its own model: drop --model/--data")
    if not Path(args.spec).is_file():
        raise UserError(f"--spec: file not found: {args.spec}")
    spec = read_yaml(args.spec, "--spec")
    if not isinstance(spec, dict):
        raise UserError("--spec must be a mapping: {estimator: <class path>, params: {...}}")
    result = run_retrain_audit(
        spec,
        read_table(args.train, DataLimits.from_args(args)),
        read_table(args.test, DataLimits.from_args(args)),
        args.target,
        _mutation_plan(params),
        progress=progress,
    )
    result.params["spec_sha256"] = hashlib.sha256(Path(args.spec).read_bytes()).hexdigest()
    name = args.model_name or str(spec.get("estimator", "estimator")).rsplit(".", 1)[-1]
    source = f"{args.train} -> {args.test}"
    return result, int(result.params["n_train"]), source, {"name": name, "version": args.model_version, "sha256": ""}


def _mutation_summary(out: dict[str, Any]) -> list[str]:
    details = out["result"]["details"]
    summary = details["summary"]
    lines = []
    skipped = details.get("skipped_inputs") or {}
    if skipped:
        lines.append(
            f"  mutated inputs: {', '.join(out['result']['params']['inputs'])}; skipped (not numeric): "
            + ", ".join(f"{name} ({kind})" for name, kind in skipped.items())
        )
    params = out["result"]["params"]
    share = details.get("mutated_share_of_cells")
    lines.append(
        f"  mutated cells per repetition: {params['k']} of {params.get('cells', params.get('predictor_cells', '?'))}"
        + (f" ({share:.1%})" if share is not None else "")
        + ("" if params.get("cell_share") is None else " (--cell-share; --k sets a count)")
    )
    lines.append("  baseline: " + ", ".join(f"{k} {v:.4f}" for k, v in details["baseline"].items()))
    # accuracy first: the change a reader acts on; the probability errors follow (regression: no accuracy)
    metrics = [m for m in ("accuracy", "mae", "mse", "rmse") if m in details["baseline"]]
    lines.append(f"  {'operator':<9}" + "".join(f"{k + ' Δ%':>20}" for k in metrics))
    for op, s in summary.items():
        cells = []
        for k in metrics:
            mean, std = s[k]["change_pct_mean"], s[k]["change_pct_std"]
            cells.append("n/a" if mean is None else f"{mean:+.2f} ± {std or 0:.2f}")
        note = f"  ({s['note']})" if s.get("note") else ""
        lines.append(f"  {op:<9}" + "".join(f"{c:>20}" for c in cells) + note)
    return lines


def _mutation_json(out: dict[str, Any]) -> dict[str, Any]:
    """The inputs mutated and those skipped (text, categories, token ids), at the top of the object."""
    params = out["result"]["params"]
    if "inputs" not in params:
        return out
    skipped = out["result"]["details"].get("skipped_inputs") or {}
    return {"mutated_inputs": params["inputs"], "skipped_inputs": skipped, **out}


def _mutation_demo(m: Mapping[str, Any]) -> str:
    return (
        f"all operators together: MAE {m.get('all_mae_change_pct_mean', 0):+.1f} %, "
        f"accuracy {m.get('all_accuracy_change_pct_mean', 0):+.2f} % (relative change)"
    )


def _mutation_export(result: AuditResult) -> dict[str, GaugeValues]:
    """Mean and standard deviation of the relative change per metric and operator group, as ratios."""
    m = result.metrics
    means: dict[tuple[str, ...], float] = {}
    stds: dict[tuple[str, ...], float] = {}
    for group in result.details.get("summary", {}):
        for metric in MUTATION_METRICS:
            mean = m.get(f"{group.lower()}_{metric}_change_pct_mean")
            std = m.get(f"{group.lower()}_{metric}_change_pct_std")
            if mean is not None and std is not None:
                means[("mutation", metric, group.lower())] = float(mean) / 100.0
                stds[("mutation", metric, group.lower())] = float(std) / 100.0
    return {"icos_mutation_relative_change_ratio": means, "icos_mutation_relative_change_stddev_ratio": stds}


MUTATION = register(
    AuditKind(
        name="mutation",
        params=MutationParams,
        job=MutationJob,
        run=_run_mutation,
        help="data mutation DEC/IMP/SGN/DIG: relative change of MAE/MSE/RMSE",
        add_arguments=_mutation_args,
        cli_params=_mutation_params,
        summary_lines=_mutation_summary,
        demo_line=_mutation_demo,
        gauges=(
            GaugeSpec(
                "icos_mutation_relative_change_ratio",
                "Mean relative change of the model's error after data mutation (0.25 = +25%).",
                ("audit", "metric", "operator"),
            ),
            GaugeSpec(
                "icos_mutation_relative_change_stddev_ratio",
                "Standard deviation over repetitions of the relative change after data mutation.",
                ("audit", "metric", "operator"),
            ),
        ),
        export=_mutation_export,
        cli_model_required=False,
        cli_alt_run=_mutation_retrain,
        cli_json=_mutation_json,
        applies=_mutation_applies,
        scope=_mutation_scope,
    )
)


# -- metamorphic testing ----------------------------------------------------------------------------------
def _run_metamorphic(
    model: OnnxClassifier,
    x: np.ndarray | Inputs,
    y: np.ndarray | None,
    params: MetamorphicParams,
    guard: ProgressFn,
    _: bool,
) -> AuditResult:
    batch, kinds = _kinds(model, x)
    transformations: list[Any] = (
        list(params.transformations) if params.transformations is not None else default_relations(kinds)
    )
    if not transformations:
        raise AuditError(f"no metamorphic relation applies to model {model.name!r} ({kinds.describe()})")
    result = run_metamorphic_audit(
        model.predict_proba,
        batch,
        kinds=kinds,
        transformations=transformations,
        order=params.order,
        seed=params.seed,
        max_compositions=params.max_compositions,
        flips_safe=params.allow_flips,
        batch_size=params.batch_size,
        progress=guard,
    )
    result.params["label_free"] = True
    return result


def _metamorphic_args(t: argparse.ArgumentParser) -> None:
    t.add_argument(
        "--transformations",
        help='YAML file or inline YAML list, e.g. "[shift, {name: blur, sigma: 0.7}]" or "[{name: typos, '
        'input: review}]" (default: the safe set of each kind of input the model has)',
    )
    t.add_argument("--order", type=int, default=1, help="compose this many transformations (default 1)")
    t.add_argument("--max-compositions", type=int, help="test a seeded subset of the compositions")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--allow-flips", action="store_true", help="declare horizontal/vertical flips label-preserving")


def _transformations(value: str | None) -> list[Any] | None:
    if value is None:
        return None
    loaded = read_yaml(value, "--transformations")
    if isinstance(loaded, dict) and "transformations" in loaded:
        loaded = loaded["transformations"]
    if isinstance(loaded, str):
        loaded = [s.strip() for s in loaded.split(",") if s.strip()]
    if not isinstance(loaded, list) or not loaded:
        raise UserError("--transformations must be a list of names or {name: ..., <param>: ...} mappings")
    return loaded


def _metamorphic_params(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "transformations": _transformations(args.transformations),
        "order": args.order,
        "seed": args.seed,
        "allow_flips": args.allow_flips,
        "max_compositions": args.max_compositions,
    }


def _metamorphic_summary(out: dict[str, Any]) -> list[str]:
    m = out["result"]["metrics"]
    lines = [
        f"  overall violation rate {m['overall_violation_rate']:.4f}"
        f" [{m['overall_violation_rate_lower']:.4f}, {m['overall_violation_rate_upper']:.4f}]"
    ]
    several = sum(len(v) for v in (out["result"]["params"].get("inputs") or {}).values()) > 1
    for r in out["result"]["details"]["relations"]:
        on = ", ".join(r.get("inputs", [])) if several else ""
        lines.append(
            f"  {r['relation']:<32} violations {r['violation_rate']:.4f}"
            f"  confidence drop {r['mean_confidence_drop']:+.4f}" + (f"  ({on})" if on else "")
        )
    return lines


def _metamorphic_demo(m: Mapping[str, Any]) -> str:
    return (
        f"labels changed on {m['overall_violation_rate']:.1%} of transformed inputs "
        f"(worst relation {m['max_violation_rate']:.1%})"
    )


def _metamorphic_export(result: AuditResult) -> dict[str, GaugeValues]:
    relations = result.details.get("relations", [])
    violations: dict[tuple[str, ...], float] = {(str(r["relation"]),): float(r["violation_rate"]) for r in relations}
    violations[("all",)] = float(result.metrics["overall_violation_rate"])
    return {"icos_metamorphic_violation_ratio": violations}


METAMORPHIC = register(
    AuditKind(
        name="metamorphic",
        params=MetamorphicParams,
        job=MetamorphicJob,
        run=_run_metamorphic,
        help="metamorphic testing: label changes under label-preserving edits",
        add_arguments=_metamorphic_args,
        cli_params=_metamorphic_params,
        summary_lines=_metamorphic_summary,
        demo_line=_metamorphic_demo,
        gauges=(
            GaugeSpec(
                "icos_metamorphic_violation_ratio",
                "Share of inputs whose predicted label changes under a metamorphic relation.",
                ("relation",),
                replace=True,
            ),
        ),
        export=_metamorphic_export,
    )
)
