"""The shared audit runner: time budget, subsets, MLflow records; the scheduler's trigger checks."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from agent.audits.params import DScoreParams, MetamorphicParams, MutationParams
from agent.audits.runner import AuditOutcome, AuditTimeout, audit_record, run_audit
from agent.core.scheduler import check_trigger, validate_cron
from agent.model.classifier import OnnxClassifier, default_model_path


@pytest.fixture(scope="module")
def model() -> OnnxClassifier:
    return OnnxClassifier.load(default_model_path())


@pytest.fixture(scope="module")
def images() -> tuple[np.ndarray, np.ndarray]:
    from agent.data.datasets import mnist_splits

    s = mnist_splits()
    return s.test.x[:64], s.test.y[:64]


def test_deadline_stops_between_steps(model: OnnxClassifier, images: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = images
    steps: list[tuple[int, int]] = []
    with pytest.raises(AuditTimeout, match="time budget"):
        run_audit(
            "dscore",
            model,
            x,
            y,
            DScoreParams(n=2, batch_size=16),
            progress=lambda d, t: steps.append((d, t)),
            deadline=time.monotonic() - 1,
        )
    assert steps == [(0, 1)]  # checked before the first forward pass
    with pytest.raises(AuditTimeout):
        run_audit("mutation", model, x, y, MutationParams(k=10, repetitions=3), deadline=time.monotonic() - 1)


def test_subset_and_label_free(model: OnnxClassifier, images: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = images
    res = run_audit("dscore", model, x.reshape(64, -1), y, DScoreParams(n=2, max_samples=20, label_free=True))
    assert res.params["n_samples"] == 20
    assert res.metrics["base_accuracy"] == 1.0
    meta = run_audit("metamorphic", model, x, None, MetamorphicParams(transformations=["brightness"]))
    assert meta.params["label_free"] is True


def test_audit_record_flattens_params_and_keeps_finite_metrics(
    model: OnnxClassifier, images: tuple[np.ndarray, np.ndarray]
) -> None:
    x, y = images
    res = run_audit("metamorphic", model, x, y, MetamorphicParams(transformations=["shift", "blur"], order=2))
    res.metrics["not_finite"] = float("nan")
    now = time.time()
    outcome = AuditOutcome("metamorphic", "success", now - 1, now, "cli", "x.npz", 64, res, id="abc")
    rec = audit_record(outcome, model_name="mnist", model_version="2", model_sha256=model.sha256)
    assert json.loads(str(rec.params["transformations"]))[0]["name"] == "shift"
    assert "not_finite" not in rec.metrics and "overall_violation_rate" in rec.metrics
    assert json.loads(rec.artifacts["report.json"])["id"] == "abc"
    assert rec.run_tags()["icos.model.sha256"] == model.sha256


def test_bad_shape_is_an_audit_error(model: OnnxClassifier) -> None:
    from agent.audits.report import AuditError

    with pytest.raises(AuditError, match="do not fit the model input"):
        run_audit("dscore", model, np.zeros((3, 10), dtype=np.float32), None, DScoreParams())


def test_triggers() -> None:
    check_trigger(None, 5.0)
    check_trigger("*/5 * * * *", None)
    assert validate_cron(" 0  3 * * 1 ") == "0 3 * * 1"
    for cron, interval in ((None, None), ("* * * * *", 1.0)):
        with pytest.raises(ValueError, match="exactly one"):
            check_trigger(cron, interval)
    with pytest.raises(ValueError, match="5 fields"):
        validate_cron("* * * *")
    with pytest.raises(ValueError, match="not valid"):
        validate_cron("61 * * * *")
    with pytest.raises(ValueError, match="positive"):
        check_trigger(None, 0.0)
