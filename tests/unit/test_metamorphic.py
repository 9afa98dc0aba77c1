"""Metamorphic audit (LAMPION §3-4 idea for images and tables)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agent.audits.metamorphic import (
    apply_relation,
    build_relations,
    parse_specs,
    run_metamorphic_audit,
    wilson_interval,
)
from agent.audits.report import AuditError
from agent.perturb.transforms import TransformContext

ROOT = Path(__file__).resolve().parents[2]
DIGITS_CNN = ROOT / "agent" / "shipped_models" / "digits_cnn.onnx"


@pytest.fixture(scope="module")
def digits_model() -> tuple[object, np.ndarray]:
    """The shipped digits CNN's ``predict_proba`` and the digits test images (pixel range 0..16)."""
    if not DIGITS_CNN.is_file():
        pytest.skip(f"shipped model {DIGITS_CNN.relative_to(ROOT)} is missing")
    from agent.data.datasets import digits_splits
    from agent.model.classifier import OnnxClassifier

    return OnnxClassifier.load(DIGITS_CNN).predict_proba, digits_splits().test.x


@pytest.fixture(scope="module")
def iris_model() -> tuple[object, np.ndarray]:
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    x, y = load_iris(return_X_y=True)
    model = LogisticRegression(max_iter=1000).fit(x, y)
    return model.predict_proba, x


def test_identity_like_transformations_give_no_violations(digits_model: tuple[object, np.ndarray]) -> None:
    predict, x = digits_model
    r = run_metamorphic_audit(
        predict,  # type: ignore[arg-type]
        x,
        transformations=[{"name": "shift", "max_pixels": 0}, {"name": "brightness", "params": {"delta": 0.0}}],
        seed=1,
    )
    assert r.metrics["overall_violation_rate"] == 0.0 and r.metrics["any_violation_rate"] == 0.0
    for rel in r.details["relations"]:
        assert rel["violations"] == 0 and rel["n"] == len(x)
        assert rel["mean_confidence_drop"] == 0.0 and rel["wilcoxon_p"] == 1.0
        assert rel["violation_rate_lower"] == 0.0 and 0 < rel["violation_rate_upper"] < 0.02


def test_label_breaking_noise_gives_many_violations(digits_model: tuple[object, np.ndarray]) -> None:
    predict, x = digits_model
    r = run_metamorphic_audit(
        predict,  # type: ignore[arg-type]
        x,
        transformations=[{"name": "gaussian_noise", "sigma": 1.0, "label": "heavy_noise"}, "blur"],
        seed=0,
    )
    heavy = next(rel for rel in r.details["relations"] if rel["relation"] == "heavy_noise")
    assert heavy["violation_rate"] > 0.5
    assert heavy["mean_confidence_drop"] > 0.3 and heavy["wilcoxon_p"] < 1e-6
    assert heavy["violation_rate_lower"] < heavy["violation_rate"] < heavy["violation_rate_upper"]
    assert r.metrics["heavy_noise_violation_rate"] == heavy["violation_rate"]
    assert r.details["overall"]["worst_relation"] == "heavy_noise"
    assert r.metrics["max_violation_rate"] == heavy["violation_rate"]
    json.loads(r.to_json())


def test_higher_order_compositions_are_seeded(digits_model: tuple[object, np.ndarray]) -> None:
    predict, x = digits_model
    cfg = ["shift", "brightness", "rotation", "gaussian_noise"]
    calls: list[tuple[int, int]] = []
    a = run_metamorphic_audit(
        predict,  # type: ignore[arg-type]
        x,
        transformations=cfg,
        order=2,
        seed=7,
        progress=lambda d, t: calls.append((d, t)),
    )
    b = run_metamorphic_audit(predict, x, transformations=cfg, order=2, seed=7)  # type: ignore[arg-type]
    assert a.to_json() == b.to_json()
    names = [rel["relation"] for rel in a.details["relations"]]
    assert len(names) == 6 and names[0] == "shift+brightness" and calls[-1] == (6, 6)
    assert "shift__brightness_violation_rate" in a.metrics
    some = run_metamorphic_audit(
        predict,  # type: ignore[arg-type]
        x,
        transformations=cfg,
        order=3,
        seed=7,
        max_compositions=2,
    )
    again = run_metamorphic_audit(
        predict,  # type: ignore[arg-type]
        x,
        transformations=cfg,
        order=3,
        seed=7,
        max_compositions=2,
    )
    assert len(some.details["relations"]) == 2 and some.to_json() == again.to_json()


def test_transformed_inputs_are_seeded_per_relation_name() -> None:
    x = np.random.default_rng(0).uniform(0, 16, (20, 1, 8, 8)).astype(np.float32)
    ctx = TransformContext((0.0, 16.0))
    specs = parse_specs(["shift", "rotation", "gaussian_noise"])
    rel = (specs[0], specs[2])
    one = apply_relation(x, rel, 3, ctx)
    np.testing.assert_array_equal(one, apply_relation(x, rel, 3, ctx))
    assert not np.array_equal(one, apply_relation(x, rel, 4, ctx))
    assert one.dtype == np.float32 and one.min() >= 0 and one.max() <= 16
    assert [tuple(s.label for s in r) for r in build_relations(specs, 2, 0)] == [
        ("shift", "rotation"),
        ("shift", "gaussian_noise"),
        ("rotation", "gaussian_noise"),
    ]


def test_shift_moves_whole_pixels_with_zero_fill() -> None:
    x = np.random.default_rng(1).uniform(1, 16, (30, 1, 6, 6)).astype(np.float32)
    out = apply_relation(x, parse_specs([{"name": "shift", "max_pixels": 1}]), 0, TransformContext((0.0, 16.0)))
    for img, moved in zip(x, out, strict=True):
        candidates = []
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                ref = np.zeros_like(img)
                ref[..., max(0, dy) : 6 + min(0, dy), max(0, dx) : 6 + min(0, dx)] = img[
                    ..., max(0, -dy) : 6 - max(0, dy), max(0, -dx) : 6 - max(0, dx)
                ]
                candidates.append(np.array_equal(ref, moved))
        assert sum(candidates) == 1


def test_brightness_clips_to_the_data_range() -> None:
    x = np.full((5, 1, 4, 4), 15.0, dtype=np.float32)
    out = apply_relation(x, parse_specs([{"name": "brightness", "delta": 0.9}]), 0, TransformContext((0.0, 16.0)))
    assert out.min() >= 0.0 and out.max() <= 16.0


def test_flips_are_refused_unless_declared_safe(digits_model: tuple[object, np.ndarray]) -> None:
    predict, x = digits_model
    for flip in ("hflip", "vflip"):
        with pytest.raises(AuditError, match="declare flips safe"):
            run_metamorphic_audit(predict, x, transformations=[flip])  # type: ignore[arg-type]
    r = run_metamorphic_audit(predict, x, transformations=["hflip", "vflip"], flips_safe=True)  # type: ignore[arg-type]
    assert r.params["flips_safe"] and r.metrics["hflip_violation_rate"] > 0


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([], "no transformations"),
        (["zoom"], "unknown transformation"),
        ([{"name": "shift", "max_px": 2}], "unknown parameter"),
        ([{"name": "shift", "max_pixels": 1.5}], "whole number"),
        ([{"name": "blur", "sigma": -1}], ">= 0"),
        ([{"name": "blur", "sigma": "big"}], "finite number"),
    ],
)
def test_bad_configs_are_refused(items: list[object], message: str) -> None:
    with pytest.raises(AuditError, match=message):
        parse_specs(items)  # type: ignore[arg-type]


def test_order_larger_than_the_set_is_refused() -> None:
    with pytest.raises(AuditError, match="order 3"):
        build_relations(parse_specs(["shift", "blur"]), 3, 0)


def test_table_relations(iris_model: tuple[object, np.ndarray]) -> None:
    predict, x = iris_model
    r = run_metamorphic_audit(
        predict,  # type: ignore[arg-type]
        x,
        transformations=[
            {"name": "scale", "epsilon": 0.0, "label": "no_scale"},
            {"name": "scale", "epsilon": 0.01},
            {"name": "noise", "sigma": 0.05},
            {"name": "noise", "sigma": 3.0},
        ],
        seed=2,
    )
    rates = {rel["relation"]: rel["violation_rate"] for rel in r.details["relations"]}
    assert rates["no_scale"] == 0.0
    assert rates["scale"] < 0.05 and rates["noise"] < 0.1
    assert rates["noise_2"] > 0.3  # duplicate names get a suffix
    with pytest.raises(AuditError, match="needs images"):
        run_metamorphic_audit(predict, x, transformations=["rotation"])  # type: ignore[arg-type]


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    lo, hi = wilson_interval(0, 100)
    assert lo == 0.0 and hi == pytest.approx(0.0370, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
