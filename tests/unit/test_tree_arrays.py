"""Trees as numpy arrays (:mod:`invariants.tree_arrays`) give onnxruntime's answers bit for bit: the ADI
forest's label, the TDI leaf, and the whole oracle's verdicts with ``engine="arrays"``, on random inputs,
inputs exactly on split values (and one float32 step either side), NaNs, and score ties at the cut."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from invariants.adi import AlgorithmInvariants
from invariants.compiled import CompiledOracle
from invariants.idi import IdiRuleSet
from invariants.oracle import Oracle
from invariants.tdi import TrainingInvariants
from invariants.tree_arrays import TreeArrays, forest_from_onnx


def _on_splits(x: np.ndarray, feature: np.ndarray, threshold: np.ndarray, seed: int) -> np.ndarray:
    """Copies of ``x`` with one feature set exactly to a split value, and one float32 step below and
    above it (three blocks of ``len(x)`` rows)."""
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(feature), size=len(x))
    rows = np.arange(len(x))
    blocks = []
    for direction in (0.0, -np.inf, np.inf):
        xx = x.copy()
        t = threshold[pick].astype(np.float32)
        xx[rows, feature[pick]] = t if direction == 0.0 else np.nextafter(t, np.float32(direction))
        blocks.append(xx)
    return np.concatenate(blocks)


@pytest.fixture(scope="module")
def adi_forest() -> AlgorithmInvariants:
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(10, 0.3), size=1200).astype(np.float32)
    wrong = (probs.max(axis=1) < 0.6) & (rng.random(1200) < 0.6)
    return AlgorithmInvariants.fit(probs, wrong, n_estimators=40, seed=0)


def test_forest_label_matches_onnxruntime(adi_forest: AlgorithmInvariants) -> None:
    forest = forest_from_onnx(adi_forest.onnx_bytes)
    assert forest is not None
    rng = np.random.default_rng(1)
    x = rng.dirichlet(np.full(10, 0.3), size=4000).astype(np.float32)
    thresholds = forest.arrays._threshold  # every split of every tree
    features = forest.arrays._feature
    x = np.concatenate([x, _on_splits(x[:2000], features, thresholds, seed=2)])
    ref = adi_forest.evaluate(x)
    got = forest.predict(x)
    np.testing.assert_array_equal(got.astype(bool), ref)
    assert 0 < ref.sum() < len(ref)  # both answers occur


def _two_stump_forest(w_left: float, w_right: float) -> bytes:
    """Two one-split trees on feature 0 (split at 0.5) whose leaf weights can sum exactly to 0.5."""
    from onnx import TensorProto, helper

    node = helper.make_node(
        "TreeEnsembleClassifier",
        ["x"],
        ["label", "probabilities"],
        domain="ai.onnx.ml",
        classlabels_int64s=[0, 1],
        nodes_treeids=[0, 0, 0, 1, 1, 1],
        nodes_nodeids=[0, 1, 2, 0, 1, 2],
        nodes_featureids=[0, 0, 0, 1, 0, 0],
        nodes_values=[0.5, 0.0, 0.0, 0.25, 0.0, 0.0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"] * 2,
        nodes_truenodeids=[1, 0, 0, 1, 0, 0],
        nodes_falsenodeids=[2, 0, 0, 2, 0, 0],
        nodes_missing_value_tracks_true=[0, 0, 0, 1, 0, 0],
        class_treeids=[0, 0, 1, 1],
        class_nodeids=[1, 2, 1, 2],
        class_ids=[0, 0, 0, 0],
        class_weights=[0.0, w_left, w_right, 0.0],
        post_transform="NONE",
    )
    graph = helper.make_graph(
        [node],
        "stumps",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 2]),
        ],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    return bytes(helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString())


@pytest.mark.parametrize(("w_left", "w_right"), [(0.25, 0.25), (0.3, 0.2), (0.25, 0.2500001), (0.1, -0.1)])
def test_score_ties_and_nan_follow_onnxruntime(w_left: float, w_right: float) -> None:
    """Scores exactly at the cut (0.25 + 0.25 = 0.5 is not > 0.5), one ulp above it, a negative weight
    (cut 0) and NaNs (the second tree sends them to its true child) give onnxruntime's labels."""
    raw = _two_stump_forest(w_left, w_right)
    forest = forest_from_onnx(raw)
    assert forest is not None
    values = np.array([0.0, 0.25, 0.5, np.nextafter(np.float32(0.5), np.float32(1)), 1.0, np.nan], dtype=np.float32)
    x = np.array([[a, b] for a in values for b in values], dtype=np.float32)
    ref = AlgorithmInvariants(raw).evaluate(x)
    np.testing.assert_array_equal(forest.predict(x).astype(bool), ref)


def test_a_graph_of_another_form_is_not_compiled() -> None:
    constant = AlgorithmInvariants.fit(np.eye(3, dtype=np.float32), np.zeros(3, dtype=bool))
    assert forest_from_onnx(constant.onnx_bytes) is None


def test_lone_leaf_and_deep_trees() -> None:
    """A tree that is a single leaf, and trees with more than 64 leaves (several bit words)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 3)).astype(np.float32)
    # a complete tree of depth 7 on feature 0 (128 leaves) splitting at sorted quantiles
    cuts = np.sort(rng.normal(size=127)).astype(np.float32)
    n = 255
    feature = np.zeros(n, dtype=np.int64)
    threshold = np.zeros(n, dtype=np.float32)
    true_c = np.full(n, -1)
    false_c = np.full(n, -1)
    expect_leaf = np.empty(len(x), dtype=np.int64)
    for i in range(127):  # heap layout: children 2i+1, 2i+2
        true_c[i], false_c[i] = 2 * i + 1, 2 * i + 2
        threshold[i] = cuts[rng.integers(0, 127)]
    for r in range(len(x)):
        node = 0
        while true_c[node] >= 0:
            node = true_c[node] if x[r, feature[node]] <= threshold[node] else false_c[node]
        expect_leaf[r] = node
    lone = (
        np.zeros(1, dtype=np.int64),
        np.zeros(1, dtype=np.float32),
        np.full(1, -1),
        np.full(1, -1),
        np.zeros(1, bool),
    )
    arrays = TreeArrays.from_trees([(feature, threshold, true_c, false_c, np.zeros(n, bool)), lone])
    assert arrays.words == 2
    leaves = arrays.leaves(x)
    np.testing.assert_array_equal(leaves[:, 0], expect_leaf)
    np.testing.assert_array_equal(leaves[:, 1], 0)


@pytest.fixture(scope="module")
def digits_oracle() -> tuple[Oracle, np.ndarray, np.ndarray, np.ndarray]:
    d = load_digits()
    x = d.data.astype(np.float32)
    y = d.target
    rng = np.random.default_rng(0)
    probs = np.eye(10, dtype=np.float32)[y] * 2 + rng.gamma(1.0, 0.6, size=(len(y), 10)).astype(np.float32)
    probs /= probs.sum(axis=1, keepdims=True)
    labels = probs.argmax(axis=1)
    tdi = TrainingInvariants.fit(x[:900], y[:900], confidence=0.9, support=3)
    adi = AlgorithmInvariants.fit(probs[900:1300], labels[900:1300] != y[900:1300], n_estimators=25, seed=0)
    idi = IdiRuleSet.from_yaml(
        "rules:\n  - name: even-form\n    when: {field: form, equals: even}\n    allowed_labels: [0, 2, 4, 6, 8]\n",
        [str(i) for i in range(10)],
    )
    return Oracle(idi, tdi, adi), x[1300:], probs[1300:], labels[1300:]


def test_arrays_engine_gives_the_onnxruntime_verdicts(
    digits_oracle: tuple[Oracle, np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """The whole compiled oracle, arrays against onnxruntime: verdicts, rules and TDI leaves, also with
    features exactly on the TDI tree's split values."""
    oracle, x, probs, labels = digits_oracle
    reference = CompiledOracle(oracle, x.shape[1], 10)
    arrays = CompiledOracle(oracle, x.shape[1], 10, engine="arrays")
    tdi = oracle.tdi
    assert tdi is not None
    inner = tdi.children_left >= 0
    xs = np.concatenate([x, _on_splits(x, tdi.feature[inner], tdi.threshold[inner], seed=4)])
    ps, ls = np.concatenate([probs] * 4), np.concatenate([labels] * 4)
    meta = {"form": np.where(np.arange(len(xs)) % 3 == 0, "even", "any")}
    ref, ref_rules = reference.judge_with_rules(xs, ps, ls, metadata=meta)
    got, got_rules = arrays.judge_with_rules(xs, ps, ls, metadata=meta)
    np.testing.assert_array_equal(got.verdict, ref.verdict)
    np.testing.assert_array_equal(got.rule, ref.rule)
    assert ref_rules is not None and got_rules is not None
    np.testing.assert_array_equal(got_rules, ref_rules)
    assert min(ref.counts().values()) > 0  # every family fires
    for n in (0, 1):
        a, _ = arrays.judge_with_rules(xs[:n], ps[:n], ls[:n])
        b, _ = reference.judge_with_rules(xs[:n], ps[:n], ls[:n])
        np.testing.assert_array_equal(a.verdict, b.verdict)
    with pytest.raises(ValueError, match="engine"):
        CompiledOracle(oracle, x.shape[1], 10, engine="numba")
