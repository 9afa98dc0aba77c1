"""The audit registry is the one place an audit kind is declared: a kind registered here (and only
here) appears in the config section, the CLI, the metrics, the run records and the demo line."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import Field

from agent.audits.config import AUDIT_KINDS, PARAM_MODELS, audits_config_model
from agent.audits.params import CommonParams, _Schedule
from agent.audits.registry import AuditKind, audit_metrics, export_result, register, unregister
from agent.audits.report import AuditResult
from agent.audits.runner import AuditOutcome, audit_record, run_audit
from agent.cli import build_parser
from exporters.audit_metrics import GaugeSpec, GaugeValues


class ToyParams(CommonParams):
    """A toy audit: the share of inputs above ``threshold``."""

    threshold: float = Field(0.5, ge=0)


class ToyJob(_Schedule, ToyParams):
    pass


def _run(model: Any, x: Any, y: Any, params: ToyParams, guard: Any, heatmaps: bool) -> AuditResult:
    guard(1, 1)
    share = float((x > params.threshold).mean())
    return AuditResult("toy", {"threshold": params.threshold, "n_samples": len(x)}, {"share": share}, {})


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threshold", type=float, default=0.5, help="count inputs above this value")


def _export(result: AuditResult) -> dict[str, GaugeValues]:
    return {"icos_toy_share_ratio": {(): result.metrics["share"]}}


TOY = AuditKind(
    name="toy",
    params=ToyParams,
    job=ToyJob,
    run=_run,
    help="toy audit: share of inputs above a threshold",
    add_arguments=_args,
    cli_params=lambda args: {"threshold": args.threshold},
    summary_lines=lambda out: [f"  share {out['result']['metrics']['share']:.2f}"],
    demo_line=lambda m: f"share {m['share']:.2f}",
    gauges=(GaugeSpec("icos_toy_share_ratio", "Share of inputs above the threshold.", baseline=True),),
    export=_export,
)


@pytest.fixture
def toy() -> Iterator[AuditKind]:
    register(TOY)
    try:
        yield TOY
    finally:
        unregister("toy")
    assert "toy" not in AUDIT_KINDS


def test_builtin_kinds_in_order() -> None:
    assert list(AUDIT_KINDS) == ["dscore", "mutation", "metamorphic"]
    assert set(PARAM_MODELS) == set(AUDIT_KINDS)


def test_a_name_registers_once(toy: AuditKind) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(toy)


def test_config_section_has_the_kind(toy: AuditKind) -> None:
    model = audits_config_model()
    assert list(model.model_fields)[:4] == ["dscore", "mutation", "metamorphic", "toy"]
    cfg = model.model_validate({"toy": {"interval": "1h", "threshold": 0.2, "data": {"source": "live"}}})
    assert list(cfg.jobs()) == ["toy"]
    params = cfg.params_for("toy")
    assert isinstance(params, ToyParams) and params.threshold == 0.2
    assert PARAM_MODELS["toy"] is ToyParams
    with pytest.raises(ValueError, match="set exactly one of cron and interval"):
        model.model_validate({"toy": {"threshold": 0.2}})


def test_cli_parser_has_the_kind(toy: AuditKind) -> None:
    args = build_parser().parse_args(["audit", "toy", "--model", "m.onnx", "--data", "d.npz", "--threshold", "0.7"])
    assert args.audit_kind == "toy" and args.threshold == 0.7 and args.model == "m.onnx"


def test_metrics_and_run_record_of_the_kind(toy: AuditKind) -> None:
    registry = CollectorRegistry()
    metrics = audit_metrics(registry)
    text = generate_latest(registry).decode()
    assert 'icos_audit_runs_total{audit="toy",status="success"} 0.0' in text
    # absent until the first successful run (never NaN), and so is its baseline
    assert "# TYPE icos_toy_share_ratio gauge" in text and "\nicos_toy_share_ratio " not in text
    assert "\nicos_toy_share_ratio_baseline " not in text

    class _Model:
        n_features, input_shape = 4, (4,)
        input = type("I", (), {"dtype": np.float32})()

    x = np.array([[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]], dtype=np.float32)
    result = run_audit("toy", _Model(), x, None, ToyParams(threshold=0.5))  # type: ignore[arg-type]
    export_result(metrics, result)
    assert "icos_toy_share_ratio 0.5" in generate_latest(registry).decode()

    now = time.time()
    outcome = AuditOutcome("toy", "success", now - 1, now, "cli", "d.npz", 2, result, id="t1")
    record = audit_record(outcome, model_name="m")
    assert record.kind == "toy" and record.name == "toy m"
    assert record.metrics["share"] == 0.5 and record.params["threshold"] == 0.5
    assert toy.demo_line(result.metrics) == "share 0.50"


def _registry_with_metrics() -> CollectorRegistry:
    registry = CollectorRegistry()
    audit_metrics(registry)
    return registry


def test_unregistered_kind_is_gone_everywhere() -> None:
    assert "toy" not in audits_config_model().model_fields
    assert "icos_toy_share_ratio" not in generate_latest(_registry_with_metrics()).decode()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["audit", "toy"])
