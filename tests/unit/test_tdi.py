"""Training-data-dependent invariants: tree leaves as rules (ICOS §4.3, §5.4, Table 4)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.tree import DecisionTreeClassifier

from invariants.fit_params import FitParams
from invariants.tdi import TdiRule, TrainingInvariants, format_threshold

#: The fit's defaults, which the TDIs take when given no C, S or leaf size.
DEFAULT = FitParams()


def tiny() -> tuple[np.ndarray, np.ndarray]:
    """Three groups of identical inputs, so the tree is known in advance:

    * (0, 0): 19 × class 0 and 1 × class 1 — cannot be split, support 20, confidence 0.95;
    * (10, 0): 9 × class 1 — support 9, confidence 1;
    * (10, 10): 8 × class 2 — support 8, confidence 1.

    Gini splits x[0] at 5.0 first, then x[1] at 5.0 on the right.
    """
    x = np.array([[0, 0]] * 20 + [[10, 0]] * 9 + [[10, 10]] * 8, dtype=np.float64)
    y = np.array([0] * 19 + [1] + [1] * 9 + [2] * 8)
    return x, y


def test_tiny_tree_rules_are_the_expected_leaves() -> None:
    tdi = TrainingInvariants.fit(*tiny(), confidence=0.99, support=8)  # the tree is built around S = 8
    assert tdi.node_count == 5
    assert tdi.rules == [
        TdiRule(1, 0, 20, 0.95, False, ((0, "<=", 5.0),), "fail :- x[0] <= 5.0, output != 0"),
        TdiRule(3, 1, 9, 1.0, True, ((0, ">", 5.0), (1, "<=", 5.0)), "fail :- x[0] > 5.0 & x[1] <= 5.0, output != 1"),
        TdiRule(4, 2, 8, 1.0, False, ((0, ">", 5.0), (1, ">", 5.0)), "fail :- x[0] > 5.0 & x[1] > 5.0, output != 2"),
    ]
    assert [r.leaf for r in tdi.selected_rules] == [3]


def test_support_is_strict_and_confidence_is_inclusive() -> None:
    tdi = TrainingInvariants.fit(*tiny())
    selected = {(c, s): [r.leaf for r in tdi.reselect(c, s).selected_rules] for c in (0.95, 0.96) for s in (7, 8, 9)}
    # support 8 is not > 8, support 9 is; confidence 0.95 is >= 0.95 but not >= 0.96
    assert selected[(0.96, 8)] == [3]
    assert selected[(0.96, 7)] == [3, 4]
    assert selected[(0.96, 9)] == []
    assert selected[(0.95, 8)] == [1, 3]
    assert selected[(0.95, 7)] == [1, 3, 4]
    assert selected[(0.95, 9)] == [1]
    fitted = TrainingInvariants.fit(*tiny(), confidence=0.95, support=19)
    assert [r.leaf for r in fitted.selected_rules] == [1]
    assert [r.leaf for r in fitted.reselect(0.95, 20).selected_rules] == []


def test_confidence_exactly_at_the_threshold_is_selected() -> None:
    # 99 of 100 identical inputs share a class: confidence 0.99 >= C = 0.99
    x = np.zeros((100, 3))
    y = np.array([4] * 99 + [2])
    tdi = TrainingInvariants.fit(x, y, confidence=0.99)
    (rule,) = tdi.rules
    assert (rule.label, rule.support, rule.confidence, rule.selected) == (4, 100, 0.99, True)
    assert rule.text == "fail :- output != 4"
    assert not tdi.reselect(0.991, 8).rules[0].selected


def test_readable_text_with_feature_and_class_names() -> None:
    tdi = TrainingInvariants.fit(
        *tiny(), feature_names=["petal_length", "petal_width"], class_names=["setosa", "versicolor", "virginica"]
    )
    assert [r.text for r in tdi.rules] == [
        "fail :- petal_length <= 5.0, output != setosa",
        "fail :- petal_length > 5.0 & petal_width <= 5.0, output != versicolor",
        "fail :- petal_length > 5.0 & petal_width > 5.0, output != virginica",
    ]
    with pytest.raises(ValueError, match="3 feature names for 2 features"):
        TrainingInvariants.fit(*tiny(), feature_names=["a", "b", "c"])


def test_threshold_format() -> None:
    assert format_threshold(253.0) == "253.0"
    assert format_threshold(0.5) == "0.5"
    assert format_threshold(-2.0) == "-2.0"
    assert format_threshold(1234567.0) == "1.23457e+06"
    assert format_threshold(0.123456789) == "0.123457"


def test_violation_needs_a_selected_leaf_and_another_label() -> None:
    tdi = TrainingInvariants.fit(*tiny(), confidence=0.95, support=8)  # leaves 1 and 3 selected
    x = np.array([[0, 0], [0, 0], [10, 0], [10, 0], [10, 10], [10, 10], [-3, 4]], dtype=np.float32)
    labels = np.array([0, 2, 1, 0, 0, 2, 1])
    assert tdi.leaves(x).tolist() == [1, 1, 3, 3, 4, 4, 1]
    out = tdi.evaluate(x, labels)
    assert out.dtype == np.int32
    # rule indices into tdi.rules: leaf 1 -> 0, leaf 3 -> 1; leaf 4 is not selected
    assert out.tolist() == [-1, 0, -1, 1, -1, -1, 0]
    assert tdi.coverage(x) == pytest.approx(5 / 7)
    assert tdi.coverage(x[:0]) == 0.0
    assert tdi.evaluate(x[:0], labels[:0]).shape == (0,)


def test_inputs_are_flattened_and_checked() -> None:
    x, y = tiny()
    tdi = TrainingInvariants.fit(x.reshape(-1, 1, 2), y)
    assert tdi.n_features == 2
    assert tdi.leaves(x.reshape(-1, 2, 1)).tolist() == tdi.leaves(x).tolist()
    with pytest.raises(ValueError, match="3 features, the invariants expect 2"):
        tdi.leaves(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="NaN or infinite"):
        TrainingInvariants.fit(np.array([[np.nan, 1.0]] * 10), np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match="labels"):
        TrainingInvariants.fit(x, y[:-1])


@pytest.fixture(scope="module")
def digits_tree() -> tuple[TrainingInvariants, DecisionTreeClassifier, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    tdi = TrainingInvariants.fit(x, y, seed=3)
    reference = DecisionTreeClassifier(criterion="gini", min_samples_leaf=DEFAULT.min_samples_leaf, random_state=3)
    reference.fit(x.astype(np.float32), y)
    return tdi, reference, x


def test_tree_arrays_are_sklearns(digits_tree: tuple[TrainingInvariants, DecisionTreeClassifier, np.ndarray]) -> None:
    tdi, reference, x = digits_tree
    tree = reference.tree_
    assert np.array_equal(tdi.children_left, tree.children_left)
    assert np.array_equal(tdi.children_right, tree.children_right)
    assert np.array_equal(tdi.feature, tree.feature)
    assert np.array_equal(tdi.threshold, tree.threshold)
    assert len(tdi.rules) == tree.n_leaves
    support = {r.leaf: r.support for r in tdi.rules}
    assert all(support[leaf] == tree.n_node_samples[leaf] for leaf in support)
    assert all(r.support >= DEFAULT.min_samples_leaf for r in tdi.rules)
    predicted = reference.predict(x.astype(np.float32))
    by_leaf = {r.leaf: r.label for r in tdi.rules}
    assert [by_leaf[leaf] for leaf in tdi.leaves(x).tolist()] == predicted.tolist()


def test_vectorised_leaves_equal_sklearn_apply(
    digits_tree: tuple[TrainingInvariants, DecisionTreeClassifier, np.ndarray],
) -> None:
    tdi, reference, x = digits_tree
    rng = np.random.default_rng(0)
    batches = [x, x + rng.normal(0.0, 3.0, x.shape), rng.uniform(-5, 25, (500, 64))]
    # values at, just below and just above every threshold, in float64 (float32 rounding matters)
    internal = np.flatnonzero(tdi.children_left != -1)
    probe = np.repeat(x[:1], 3 * internal.size, axis=0)
    for k, node in enumerate(internal):
        t = tdi.threshold[node]
        for j, value in enumerate((t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf))):
            probe[3 * k + j, :] = value
    batches.append(probe)
    with_nan = x[:400].copy()
    with_nan[rng.random(with_nan.shape) < 0.2] = np.nan
    batches.append(with_nan)
    for batch in batches:
        expected = reference.apply(batch.astype(np.float32))
        got = tdi.leaves(batch)
        assert got.dtype == np.int32
        assert np.array_equal(got, expected)


def test_reselect_keeps_the_tree_and_the_original(
    digits_tree: tuple[TrainingInvariants, DecisionTreeClassifier, np.ndarray],
) -> None:
    tdi, _, x = digits_tree
    relaxed = tdi.reselect(0.0, 0)
    assert relaxed is not tdi
    assert relaxed.children_left is tdi.children_left
    assert all(r.selected for r in relaxed.rules)
    c, s = DEFAULT.confidence, DEFAULT.support  # fit's defaults
    assert (tdi.confidence, tdi.support) == (c, s)
    assert [r.selected for r in tdi.rules] == [r.confidence >= c and r.support > s for r in tdi.rules]
    assert [r.text for r in relaxed.rules] == [r.text for r in tdi.rules]
    assert relaxed.coverage(x) == 1.0
    assert tdi.coverage(x) < 1.0


def test_dict_round_trip_is_exact(digits_tree: tuple[TrainingInvariants, DecisionTreeClassifier, np.ndarray]) -> None:
    tdi, _, x = digits_tree
    data = json.loads(json.dumps(tdi.to_dict()))
    assert set(data["leaves"][0]) == {"leaf", "class", "support", "confidence", "selected", "text"}
    assert data["params"] == {
        "criterion": "gini",
        "confidence": DEFAULT.confidence,
        "support": DEFAULT.support,
        "min_samples_leaf": DEFAULT.min_samples_leaf,
        "seed": 3,
    }
    again = TrainingInvariants.from_dict(data)
    assert again.rules == tdi.rules
    noisy = x + np.random.default_rng(1).normal(0, 2, x.shape)
    labels = np.random.default_rng(2).integers(0, 10, size=(x.shape[0],))
    assert np.array_equal(again.leaves(noisy), tdi.leaves(noisy))
    assert np.array_equal(again.evaluate(noisy, labels), tdi.evaluate(noisy, labels))
    # a hand-deselected leaf is honoured as stored
    data["leaves"][tdi.rules.index(tdi.selected_rules[0])]["selected"] = False
    assert len(TrainingInvariants.from_dict(data).selected_rules) == len(tdi.selected_rules) - 1


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("tree"), "missing key 'tree'"),
        (lambda d: d.update(format_version=2), "unsupported TDI format"),
        (lambda d: d["tree"]["children_left"].__setitem__(0, 0), "children_left"),
        (lambda d: d["tree"]["feature"].__setitem__(0, 64), "feature"),
        (lambda d: d["tree"]["threshold"].pop(), "equal length"),
        (lambda d: d["leaves"].pop(), "no leaf table entry"),
        (lambda d: d["leaves"][0].__setitem__("selected", "yes"), "'selected' must be true or false"),
        (lambda d: d["leaves"][0].__setitem__("confidence", 1.5), "outside [0, 1]"),
        (lambda d: d["tree"].__setitem__("threshold", "abc"), "threshold"),
    ],
)
def test_from_dict_refuses_malformed_data(mutate: object, message: str) -> None:
    data = TrainingInvariants.fit(*tiny()).to_dict()
    mutate(data)  # type: ignore[operator]
    with pytest.raises(ValueError) as caught:
        TrainingInvariants.from_dict(data)
    assert message in str(caught.value)
