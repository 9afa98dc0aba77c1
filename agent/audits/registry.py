"""The one registry of audit kinds: everything the agent needs to know about a kind, in one entry.

An :class:`AuditKind` holds a kind's parameter and job (schedule) models, the function that runs
it, its ``icos-agent audit <kind>`` arguments, the text the CLI and the demo print for a result and
the Prometheus gauges it exports. The ``audits`` config section, the CLI, the HTTP routes, the
metrics, the MLflow run records and the demo all iterate :data:`AUDIT_KINDS`, so adding a kind is
one :func:`register` call (the built-in kinds are registered by :mod:`agent.audits.kinds`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from agent.audits.modalities import InputKinds
from agent.audits.params import CommonParams, _Schedule
from agent.audits.report import AuditResult, ProgressFn
from exporters.audit_metrics import AuditMetrics, GaugeSpec, GaugeValues

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from agent.model.classifier import OnnxClassifier
    from agent.model.inputs import Inputs

__all__ = [
    "AUDIT_KINDS",
    "PARAM_MODELS",
    "AuditKind",
    "CliRun",
    "audit_metrics",
    "audits_that_apply",
    "baseline_gauge",
    "export_result",
    "register",
    "unregister",
]

#: ``run(model, x, y, params, progress, heatmaps)``: the kind's audit on prepared inputs: the array of a
#: model of one numeric input, shaped for it, else the model's :class:`~agent.model.inputs.Inputs`.
RunFn = Callable[["OnnxClassifier", "np.ndarray | Inputs", "np.ndarray | None", Any, ProgressFn, bool], AuditResult]
#: ``applies(model, kinds)``: why the kind cannot audit ``model`` (one line), ``None`` when it can.
AppliesFn = Callable[["OnnxClassifier", InputKinds], "str | None"]
#: What a CLI run that brings its own model returns: result, number of inputs, data source, model tags.
CliRun = tuple[AuditResult, int, str, dict[str, str]]


def _no_cli_json(out: dict[str, Any]) -> dict[str, Any]:
    return out


def _no_gauges(result: AuditResult) -> dict[str, GaugeValues]:
    return {}


def _whole_model(kinds: InputKinds) -> str:
    return ""


@dataclass(frozen=True)
class AuditKind:
    """One audit kind.

    * ``params``/``job``: its parameter model and its config entry (parameters plus schedule).
    * ``run``: runs it on inputs shaped for the model (see :func:`agent.audits.runner.run_audit`).
    * ``help``/``add_arguments``/``cli_params``: the ``icos-agent audit <name>`` sub-command, its
      own flags and how they map onto ``params`` fields; ``cli_model_required`` is false when
      ``cli_alt_run`` can run without ``--model``/``--data`` (it returns ``None`` when its flags
      are absent); ``cli_json`` reshapes the ``--json`` object.
    * ``summary_lines``: the CLI's text lines for a result (after the header line);
      ``demo_line``: the demo's one-line summary of a successful run's metrics.
    * ``gauges``/``export``: the Prometheus gauges of the kind and their values for a result; at
      most one gauge, without labels, has a baseline (``GaugeSpec.baseline``: the value alerts
      compare later runs with, :mod:`agent.audits.baselines`).
    * ``applies``: why the kind cannot audit a model, from the kinds of its inputs
      (:mod:`agent.audits.modalities`; ``None``: it audits every model); ``scope``: which of a
      model's inputs it reads, when not all (named in the list of audits that apply).
    """

    name: str
    params: type[CommonParams]
    job: type[_Schedule]
    run: RunFn
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    cli_params: Callable[[argparse.Namespace], dict[str, Any]]
    summary_lines: Callable[[dict[str, Any]], list[str]]
    demo_line: Callable[[Mapping[str, Any]], str]
    gauges: tuple[GaugeSpec, ...] = ()
    export: Callable[[AuditResult], dict[str, GaugeValues]] = _no_gauges
    cli_model_required: bool = True
    cli_alt_run: Callable[[argparse.Namespace, Any, ProgressFn], CliRun | None] | None = None
    cli_json: Callable[[dict[str, Any]], dict[str, Any]] = field(default=_no_cli_json)
    applies: AppliesFn | None = None
    scope: Callable[[InputKinds], str] = _whole_model


#: Every audit kind by name, in registration order (the order of the config, CLI and ``GET /v1/audits``).
AUDIT_KINDS: dict[str, AuditKind] = {}


def register(kind: AuditKind) -> AuditKind:
    """Add ``kind``; a name can be registered once."""
    if kind.name in AUDIT_KINDS:
        raise ValueError(f"audit kind {kind.name!r} is already registered")
    based = [g for g in kind.gauges if g.baseline]
    if len(based) > 1 or any(g.labels for g in based):
        raise ValueError(f"audit kind {kind.name!r}: at most one gauge, without labels, can have a baseline")
    AUDIT_KINDS[kind.name] = kind
    return kind


def audits_that_apply(model: OnnxClassifier, kinds: InputKinds) -> list[str]:
    """The kinds that can audit ``model``, each with the inputs it reads when not all
    (``mutation (numeric inputs: age, income)``)."""
    out = []
    for name, kind in AUDIT_KINDS.items():
        if kind.applies is None or kind.applies(model, kinds) is None:
            scope = kind.scope(kinds)
            out.append(f"{name} ({scope})" if scope else name)
    return out


def baseline_gauge(kind: str) -> str | None:
    """The name of the gauge of ``kind`` that has a baseline, if any."""
    entry = AUDIT_KINDS.get(kind)
    return next((g.name for g in entry.gauges if g.baseline), None) if entry is not None else None


def unregister(name: str) -> None:
    """Remove the kind ``name`` (tests add and remove kinds)."""
    AUDIT_KINDS.pop(name, None)


class _ParamModels(Mapping[str, type[CommonParams]]):
    """``{kind: parameter model}``, read live from :data:`AUDIT_KINDS`."""

    def __getitem__(self, name: str) -> type[CommonParams]:
        return AUDIT_KINDS[name].params

    def __iter__(self) -> Iterator[str]:
        return iter(AUDIT_KINDS)

    def __len__(self) -> int:
        return len(AUDIT_KINDS)


PARAM_MODELS: Mapping[str, type[CommonParams]] = _ParamModels()


def audit_metrics(registry: CollectorRegistry, baselines: Callable[[], Mapping[str, float]] = dict) -> AuditMetrics:
    """The audit metrics on ``registry``: run counters of every kind and every kind's gauges;
    ``baselines()`` gives the current baselines at scrape time (``{gauge name: value}``)."""
    return AuditMetrics(registry, list(AUDIT_KINDS), [g for k in AUDIT_KINDS.values() for g in k.gauges], baselines)


def export_result(metrics: AuditMetrics, result: AuditResult) -> None:
    """Set the gauges of one successful audit result (kinds without gauges set nothing)."""
    kind = AUDIT_KINDS.get(result.kind)
    if kind is not None:
        for name, values in kind.export(result).items():
            metrics.set_gauge(name, values)
