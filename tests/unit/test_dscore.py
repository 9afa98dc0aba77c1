"""D-Score (paper §IV): the maths against the paper's tables, the graph surgery, the translation."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from agent.audits.dscore.masking import insert_region_masks
from agent.audits.dscore.run import heatmaps_png, run_dscore
from agent.audits.dscore.scores import feature_distribution, g_bound, score, score_from_distributions
from agent.audits.dscore.translation import (
    augment,
    pad_resize,
    region_bounds,
    resize_bilinear,
    translate,
    translation_padding,
)
from agent.audits.report import AuditError
from invariants.onnx_session import OnnxSession

ROOT = Path(__file__).resolve().parents[2]
MNIST_CNN = ROOT / "agent" / "shipped_models" / "mnist_cnn.onnx"

# The tables print 4 decimals and are computed from inputs that are themselves rounded (accuracies
# to 0.01 %, f̃ to 4 significant digits), so a figure may differ from ours by one unit in the last
# place. Rounded to 4 decimals, 13 of Table VI's 18 figures and 22 of all 30 figures reproduced here
# match exactly; the others are one unit off (largest deviation 1.1e-4, CM n=3 D-Score).
TABLE_TOL = 1.5e-4


def tiny_cnn(seed: int = 0, hw: tuple[int, int] = (8, 8), *, dynamic: bool = False, conv_output: bool = False) -> bytes:
    """Two conv layers, random weights; ``conv_output`` makes the first Conv's output a graph output."""
    rng = np.random.default_rng(seed)
    h, w = hw
    arrays = {
        "w1": rng.normal(0, 0.5, (4, 1, 3, 3)),
        "b1": rng.normal(0, 0.1, 4),
        "w2": rng.normal(0, 0.5, (6, 4, 3, 3)),
        "b2": rng.normal(0, 0.1, 6),
        "fc": rng.normal(0, 0.2, (6 * (h // 2) * (w // 2), 10)),
        "fb": np.zeros(10),
    }
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Flatten", ["r2"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["logits"]),
    ]
    dims: list[str | int] = ["N", 1, "H", "W"] if dynamic else ["N", 1, h, w]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])]
    if conv_output:
        outputs.append(helper.make_tensor_value_info("c1", TensorProto.FLOAT, ["N", 4, h, w]))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, dims)],
        outputs,
        [numpy_helper.from_array(a.astype(np.float32), name) for name, a in arrays.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def images(n: int = 64, hw: tuple[int, int] = (8, 8), seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 16, (n, 1, *hw)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# The maths against Tables V-VII
# --------------------------------------------------------------------------------------------

# Table VI (CIFAR-10 model, n = 3): a_i and f̃_i row-major, test accuracy, then the table's
# v_robust, v_fitness and D-Score.
TABLE_VI = {
    "w/o augmentation": (
        [42.31, 48.61, 40.90, 51.22, 62.40, 50.88, 44.29, 55.11, 45.28],
        [7.095, 11.98, 5.866, 10.96, 26.47, 10.78, 7.924, 12.59, 6.327],
        79.66,
        (0.1290, 0.7813, 0.6523),
    ),
    "RHF": (
        [45.32, 52.10, 45.11, 56.63, 66.98, 57.91, 49.10, 58.23, 50.17],
        [3.543, 10.41, 6.011, 6.634, 25.37, 8.257, 9.870, 20.40, 9.491],
        81.22,
        (0.1221, 0.7934, 0.6713),
    ),
    "RVF": (
        [40.99, 47.32, 36.68, 50.43, 58.73, 45.98, 44.33, 49.17, 40.50],
        [2.678, 12.51, 4.407, 10.64, 30.10, 9.152, 8.576, 18.20, 3.723],
        73.70,
        (0.1265, 0.7144, 0.5878),
    ),
    "RR": (
        [32.10, 38.17, 27.98, 41.23, 45.96, 34.47, 35.60, 37.88, 26.35],
        [5.390, 7.338, 7.009, 10.96, 22.60, 15.67, 12.65, 11.36, 7.010],
        67.10,
        (0.1302, 0.6576, 0.5274),
    ),
    "RHV": (
        [38.01, 45.11, 39.81, 47.30, 57.63, 47.83, 43.26, 49.71, 39.99],
        [4.801, 12.03, 8.647, 7.408, 20.65, 10.53, 11.69, 15.02, 9.215],
        75.66,
        (0.1219, 0.7458, 0.6240),
    ),
    "ours (p=0.26)": (
        [49.98, 61.12, 50.01, 66.32, 76.42, 64.33, 57.04, 66.08, 56.97],
        [7.117, 11.84, 7.056, 10.17, 21.95, 9.448, 8.177, 13.51, 10.72],
        79.44,
        (0.0865, 0.7839, 0.6974),
    ),
}


@pytest.mark.parametrize("row", list(TABLE_VI))
def test_table_vi_rows_from_distributions(row: str) -> None:
    a, f, acc, (robust, fitness, dscore) = TABLE_VI[row]
    r = score_from_distributions(acc / 100, np.array(f) / 100, np.array(a) / 100, n_classes=10)
    assert abs(r.robustness - robust) <= TABLE_TOL
    assert abs(r.fitness - fitness) <= TABLE_TOL
    assert abs(r.dscore - dscore) <= TABLE_TOL
    assert r.n == 3 and r.dscore == pytest.approx(r.fitness - r.robustness)


# Table III (variant accuracies f_i) and Table IV (translated accuracies a_i), row-major, with the
# base accuracy and Table V's v_robust, v_fitness, D-Score. Two cells of Table V are not reproduced
# by the paper's own Tables III/IV (MMA n=3 fitness 0.9590 vs printed 0.9581; MMB n=4 v_robust
# 0.2220 vs printed 0.2202, digits swapped), so they are not listed here.


def grid(*rows: list[float]) -> list[float]:
    """A table's n×n block, row by row, flattened row-major."""
    return [v for row in rows for v in row]


TABLE_III_IV_V = {
    "CM n=3": (
        79.66,
        [77.35, 75.76, 77.75, 76.09, 71.04, 76.15, 77.08, 75.56, 77.60],
        [42.31, 48.61, 40.90, 51.22, 62.40, 50.88, 44.29, 55.11, 45.28],
        (0.1290, 0.7813, 0.6523),
    ),
    "MMB n=3": (
        99.08,
        [99.01, 95.64, 98.59, 97.92, 79.43, 95.42, 98.93, 88.16, 98.60],
        [21.03, 41.85, 29.63, 56.20, 96.39, 62.80, 30.01, 42.18, 10.03],
        (0.2758, 0.9527, 0.6769),
    ),
    "MMA n=4": (
        98.56,
        grid(
            [98.41, 96.18, 94.30, 98.40],
            [98.32, 89.26, 86.87, 97.92],
            [98.05, 88.74, 95.67, 98.31],
            [98.39, 97.36, 98.10, 98.43],
        ),
        grid(
            [9.986, 17.89, 23.50, 11.09],
            [17.98, 48.33, 54.86, 19.44],
            [29.36, 55.94, 18.73, 19.66],
            [15.09, 15.18, 17.01, 4.983],
        ),
        (0.2224, 0.9728, 0.7504),
    ),
    "CM n=4": (
        79.66,
        grid(
            [78.39, 77.95, 78.11, 78.20],
            [77.89, 76.84, 76.27, 78.21],
            [78.11, 76.25, 77.05, 77.80],
            [78.23, 77.25, 77.29, 78.07],
        ),
        grid(
            [28.94, 36.62, 36.80, 30.92],
            [36.80, 46.37, 45.72, 38.40],
            [38.90, 48.73, 49.99, 36.96],
            [35.83, 48.33, 44.86, 34.29],
        ),
        (0.1083, 0.7933, 0.6849),
    ),
}


@pytest.mark.parametrize("row", list(TABLE_III_IV_V))
def test_table_v_from_raw_accuracies(row: str) -> None:
    base, variants, translated, (robust, fitness, dscore) = TABLE_III_IV_V[row]
    r = score(base / 100, np.array(variants) / 100, np.array(translated) / 100, n_classes=10)
    assert abs(r.robustness - robust) <= TABLE_TOL
    assert abs(r.fitness - fitness) <= TABLE_TOL
    assert abs(r.dscore - dscore) <= TABLE_TOL
    assert not r.feature_uniform_fallback


def test_cm_feature_distribution_of_table_iii_is_table_vi() -> None:
    """Eq. 1 on Table III's CM n=3 variants gives Table VI's "w/o augmentation" f̃ column."""
    base, variants, _, _ = TABLE_III_IV_V["CM n=3"]
    f, degenerate = feature_distribution(base / 100, np.array(variants) / 100)
    expected = np.array(TABLE_VI["w/o augmentation"][1]) / 100
    assert not degenerate
    np.testing.assert_allclose(f, expected, atol=6e-5)
    assert f.sum() == pytest.approx(1.0)


def test_table_vii_g_values() -> None:
    """Eq. 5 with c = 10. Table VII prints 0.88, 0.50, 0.35; eq. 5 gives 0.8830, 0.5095, 0.3460.

    g(2) and g(4) round to the printed values; the printed g(3) is 0.5095 truncated (rounding gives
    0.51), so it is checked to lie within 0.01 of the print.
    """
    assert round(g_bound(2, 10), 2) == 0.88
    assert round(g_bound(4, 10), 2) == 0.35
    assert g_bound(3, 10) == pytest.approx(2 * math.sqrt(8) / 27 + 0.3)
    assert abs(g_bound(3, 10) - 0.50) < 0.01
    assert math.floor(g_bound(3, 10) * 100) / 100 == 0.50


def test_table_vii_p_for_n2() -> None:
    """Eq. 7, p = v_robust / g(n), with Table V's n = 2 robustness gives Table VII's p row for n=2."""
    for robust, p in [(0.1108, 0.13), (0.2631, 0.30), (0.2179, 0.25)]:  # CM, MMA, MMB
        assert round(robust / g_bound(2, 10), 2) == p


def test_p_and_padded_size() -> None:
    a, f, acc, _ = TABLE_VI["w/o augmentation"]
    r = score_from_distributions(acc / 100, np.array(f) / 100, np.array(a) / 100, n_classes=10)
    assert r.augmentation_probability == pytest.approx(r.robustness / g_bound(3, 10))
    assert r.padded_size_factor == pytest.approx(1 + r.augmentation_probability)
    assert 0 <= r.augmentation_probability <= 1
    assert r.robustness <= r.g


def test_degenerate_feature_distribution_is_uniform_and_flagged() -> None:
    f, degenerate = feature_distribution(0.9, [0.95] * 9)
    assert degenerate and np.allclose(f, 1 / 9)
    r = score(0.9, [0.95] * 9, [0.5] * 9, n_classes=10)
    assert r.feature_uniform_fallback and r.attention_distribution == pytest.approx((1 / 9,) * 9)


def test_score_rejects_non_square_and_mismatched_sizes() -> None:
    with pytest.raises(AuditError):
        score(0.9, [0.8] * 8, [0.5] * 8, n_classes=10)
    with pytest.raises(AuditError):
        score(0.9, [0.8] * 9, [0.5] * 4, n_classes=10)


# --------------------------------------------------------------------------------------------
# Regions and translation
# --------------------------------------------------------------------------------------------


def test_region_bounds_tile_the_map_row_major() -> None:
    h, w, n = 10, 7, 3
    cover = np.zeros((h, w), dtype=int)
    for i in range(n * n):
        r0, r1, c0, c1 = region_bounds(i, n, h, w)
        cover[r0:r1, c0:c1] += 1
    assert (cover == 1).all()
    assert region_bounds(0, 3, 10, 7) == (0, 3, 0, 2)  # upper-left, floor(i·H/n)
    assert region_bounds(5, 3, 10, 7) == (3, 6, 4, 7)  # row 1, column 2
    assert region_bounds(8, 3, 10, 7) == (6, 10, 4, 7)


@pytest.mark.parametrize(("t", "unit"), [(2, 16), (3, 11), (4, 8)])
def test_translation_padding_reproduces_paper_example(t: int, unit: int) -> None:
    """Fig. 4: n = 4, region 7 (1-based; 6 here) pads l/t top, 2l/t bottom, 2k/t left, k/t right."""
    assert translation_padding(6, 4, t, 32, 32) == (unit, 2 * unit, 2 * unit, unit)


def test_translation_padding_defaults_on_mnist_size() -> None:
    assert translation_padding(4, 3, 5, 28, 28) == (6, 6, 6, 6)  # centre: round(28/5) = 6
    assert translation_padding(0, 3, 5, 28, 28) == (0, 12, 0, 12)
    assert translation_padding(8, 3, 5, 28, 28) == (12, 0, 12, 0)


def test_translate_equals_explicit_pad_then_resize() -> None:
    x = images(5, (28, 28))
    for region in range(9):
        top, bottom, left, right = translation_padding(region, 3, 5, 28, 28)
        padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
        expected = resize_bilinear(padded, 28, 28)
        np.testing.assert_allclose(translate(x, region, 3, 5), expected, rtol=1e-5, atol=1e-4)


def test_resize_is_identity_at_same_size_and_keeps_constants() -> None:
    x = images(3, (9, 9))
    np.testing.assert_allclose(resize_bilinear(x, 9, 9), x, rtol=1e-6)
    c = np.full((2, 1, 12, 12), 7.0, dtype=np.float32)
    np.testing.assert_allclose(resize_bilinear(c, 8, 5), 7.0, rtol=1e-6)


def test_translation_moves_content_towards_the_region() -> None:
    x = np.zeros((1, 1, 28, 28), dtype=np.float32)
    x[..., 10:18, 10:18] = 255.0

    def centre(img: np.ndarray) -> tuple[float, float]:
        rows, cols = np.indices(img.shape[-2:])
        m = img[0, 0]
        return float((rows * m).sum() / m.sum()), float((cols * m).sum() / m.sum())

    r0, c0 = centre(x)
    ul, lr, mid = centre(translate(x, 0)), centre(translate(x, 8)), centre(translate(x, 4))
    assert ul[0] < r0 and ul[1] < c0
    assert lr[0] > r0 and lr[1] > c0
    assert mid == pytest.approx((r0, c0), abs=1e-3)


def test_augment_pads_by_p_and_resizes_back() -> None:
    a, f, acc, _ = TABLE_VI["w/o augmentation"]
    r = score_from_distributions(acc / 100, np.array(f) / 100, np.array(a) / 100, n_classes=10)
    x = images(200, (28, 28))
    out = augment(x, r, np.random.default_rng(3))
    assert out.shape == x.shape and out.dtype == x.dtype
    changed = ~np.all(out == x, axis=(1, 2, 3))
    share = changed.mean()
    assert abs(share - r.augmentation_probability) < 0.12  # executed with probability p
    np.testing.assert_array_equal(out, augment(x, r, np.random.default_rng(3)))
    # one changed image is exactly a pad (total round(p·28) per axis) and resize
    k = int(np.flatnonzero(changed)[0])
    total = int(math.floor(r.augmentation_probability * 28 + 0.5))
    matches = [
        (top, left)
        for top in range(total + 1)
        for left in range(total + 1)
        if np.allclose(pad_resize(x[k : k + 1], top, total - top, left, total - left), out[k : k + 1], atol=1e-3)
    ]
    assert len(matches) == 1


def test_augment_with_p_zero_is_identity() -> None:
    r = score(0.9, [0.9] * 9, [0.9] * 9, n_classes=10)
    assert r.augmentation_probability == pytest.approx(0.0, abs=1e-12)
    x = images(10, (8, 8))
    np.testing.assert_array_equal(augment(x, r, np.random.default_rng(0)), x)
    np.testing.assert_array_equal(augment(x, replace(r, augmentation_probability=0.0), np.random.default_rng(0)), x)


# --------------------------------------------------------------------------------------------
# Graph surgery and the audit
# --------------------------------------------------------------------------------------------


def test_all_ones_masks_are_bit_exact_on_tiny_model() -> None:
    model = tiny_cnn()
    masked = insert_region_masks(model)
    assert [(s.conv, s.height, s.width) for s in masked.slots] == [("conv1", 8, 8), ("conv2", 4, 4)]
    x = images(50)
    plain = OnnxSession(model).run({"input": x})[0]
    ours = OnnxSession(masked.model_bytes).run({"input": x, **masked.masks(3, None)})[0]
    assert np.array_equal(plain, ours)


def test_variant_zeroes_exactly_its_region_of_every_conv() -> None:
    model = tiny_cnn(hw=(10, 10), conv_output=True)
    masked = insert_region_masks(model)
    sess = OnnxSession(masked.model_bytes)
    x = images(4, (10, 10))
    _, base = sess.run({"input": x, **masked.masks(3, None)})
    for region in (0, 4, 8):
        _, conv1 = sess.run({"input": x, **masked.masks(3, region)})
        r0, r1, c0, c1 = region_bounds(region, 3, 10, 10)
        inside = np.zeros((10, 10), dtype=bool)
        inside[r0:r1, c0:c1] = True
        assert (conv1[..., inside] == 0).all()
        assert np.array_equal(conv1[..., ~inside], base[..., ~inside])
        m2 = masked.masks(3, region)[masked.slots[1].name][0, 0]
        q0, q1, p0, p1 = region_bounds(region, 3, 5, 5)
        assert (m2[q0:q1, p0:p1] == 0).all() and m2.sum() == 25 - (q1 - q0) * (p1 - p0)


def _masks_right_after_conv(model_bytes: bytes, masked_slots: list[tuple[str, int, int]]) -> bytes:
    """Reference surgery: ``Mul`` by the mask directly after each Conv, nothing clever."""
    model = onnx.load_from_string(model_bytes)
    nodes = []
    k = 0
    for node in model.graph.node:
        nodes.append(node)
        if node.op_type == "Conv":
            name, h, w = masked_slots[k]
            out = node.output[0]
            node.output[0] = out + "_raw"
            nodes.append(helper.make_node("Mul", [out + "_raw", name], [out]))
            model.graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 1, h, w]))
            k += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model.SerializeToString()


def test_mask_after_sole_relu_equals_mask_after_conv() -> None:
    model = tiny_cnn(seed=3)
    masked = insert_region_masks(model)
    ops = [n.op_type for n in onnx.load_from_string(masked.model_bytes).graph.node]
    assert ops[:4] == ["Conv", "Relu", "Mul", "MaxPool"]  # moved behind the Conv's only consumer
    ref = OnnxSession(_masks_right_after_conv(model, [(s.name, s.height, s.width) for s in masked.slots]))
    ours = OnnxSession(masked.model_bytes)
    x = images(40, seed=9)
    for region in (None, 0, 4, 7):
        feeds = {"input": x, **masked.masks(3, region)}
        np.testing.assert_array_equal(ours.run(feeds)[0], ref.run(feeds)[0])


def test_model_without_conv_is_refused() -> None:
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["logits"])],
        "flat",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 2, 5])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(AuditError, match="model has no Conv nodes; D-Score needs a convolutional model"):
        insert_region_masks(model.SerializeToString())


def test_dynamic_spatial_size_needs_input_hw() -> None:
    model = tiny_cnn(dynamic=True)
    with pytest.raises(AuditError, match="input_hw"):
        insert_region_masks(model)
    masked = insert_region_masks(model, input_hw=(8, 8))
    assert [(s.height, s.width) for s in masked.slots] == [(8, 8), (4, 4)]
    audit = run_dscore(model, images(20), None, input_hw=(8, 8))
    assert audit.base_accuracy == 1.0


def test_single_session_equals_separate_sessions_and_label_free() -> None:
    model = tiny_cnn(seed=4)
    x = images(120, seed=5)
    y = np.random.default_rng(6).integers(0, 10, len(x))
    calls: list[tuple[int, int]] = []
    one = run_dscore(model, x, y, batch_size=50, progress=lambda d, t: calls.append((d, t)))
    many = run_dscore(model, x, y, batch_size=50, mode="separate_sessions")
    with pytest.raises(AuditError, match="mode must be one of single_session, separate_sessions"):
        run_dscore(model, x, y, mode="separate")
    assert one.variant_accuracies == many.variant_accuracies
    assert one.translated_accuracies == many.translated_accuracies
    assert one.base_accuracy == many.base_accuracy
    assert calls[-1] == (3 * 19, 3 * 19)  # 3 batches × (2n² + 1) passes
    assert not one.label_free and one.scores_are_logits
    free = run_dscore(model, x, None)
    assert free.label_free and free.base_accuracy == 1.0
    result = free.to_audit_result()
    assert result.details["accuracy_meaning"].startswith("agreement")
    doc = json.loads(result.to_json())
    assert doc["kind"] == "dscore" and set(doc["artifacts"]) == set(heatmaps_png(free.result, 3))
    for png in result.artifacts.values():
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert result.details["maps_smaller_than_grid"] == []
    fine = run_dscore(model, x[:10], None, n=5).to_audit_result(heatmaps=False)
    assert fine.details["maps_smaller_than_grid"] == ["conv2"] and fine.artifacts == {}


@pytest.fixture(scope="module")
def mnist_test() -> tuple[np.ndarray, np.ndarray]:
    from agent.data.datasets import mnist_splits

    test = mnist_splits().test
    return test.x, test.y


def _shipped_mnist() -> bytes:
    if not MNIST_CNN.is_file():
        pytest.skip(
            f"shipped model {MNIST_CNN.relative_to(ROOT)} is missing "
            "(generate it with shipped_models_training/train_cnn.py)"
        )
    return MNIST_CNN.read_bytes()


def test_all_ones_masks_are_bit_exact_on_shipped_mnist(mnist_test: tuple[np.ndarray, np.ndarray]) -> None:
    model = _shipped_mnist()
    x, _ = mnist_test
    masked = insert_region_masks(model)
    plain = OnnxSession(model).run({"input": x})[0]
    ours = OnnxSession(masked.model_bytes).run({masked.input_name: x, **masked.masks(3, None)})[0]
    assert np.array_equal(plain, ours)


def test_central_region_matters_more_than_corners_on_mnist(mnist_test: tuple[np.ndarray, np.ndarray]) -> None:
    """§V-C: deleting the central region lowers accuracy more than deleting a corner region."""
    model = _shipped_mnist()
    x, y = mnist_test
    audit = run_dscore(model, x, y, n=3, t=5)
    acc = audit.variant_accuracies
    assert acc[4] < min(acc[0], acc[2], acc[6], acc[8])
    assert audit.result.feature_distribution[4] == max(audit.result.feature_distribution)
    assert 0.0 <= audit.result.robustness <= audit.result.g
