"""The compiled oracle (TDI + ADI in one ONNX graph) gives exactly the reference oracle's verdicts."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from invariants.adi import AlgorithmInvariants
from invariants.compiled import CompiledOracle, float32_floor
from invariants.idi import IdiRuleSet
from invariants.oracle import Oracle
from invariants.tdi import TrainingInvariants


def test_float32_floor_keeps_comparisons() -> None:
    rng = np.random.default_rng(0)
    t64 = rng.normal(size=2000) * 100
    t32 = float32_floor(t64)
    x = np.concatenate(
        [
            t64.astype(np.float32),
            np.nextafter(t64.astype(np.float32), np.float32(np.inf)),
            np.nextafter(t64.astype(np.float32), np.float32(-np.inf)),
        ]
    )
    for t_a, t_b in zip(t64, t32, strict=True):
        np.testing.assert_array_equal(x.astype(np.float64) <= t_a, x <= t_b)


@pytest.fixture(scope="module")
def digits_oracle() -> tuple[Oracle, np.ndarray, np.ndarray, np.ndarray]:
    d = load_digits()
    x = d.data.astype(np.float32)
    y = d.target
    rng = np.random.default_rng(0)
    # a deliberately imperfect "model": noisy one-hot probabilities
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


def test_same_verdicts_as_reference(digits_oracle: tuple[Oracle, np.ndarray, np.ndarray, np.ndarray]) -> None:
    oracle, x, probs, labels = digits_oracle
    compiled = CompiledOracle(oracle, x.shape[1], 10)
    meta = {"form": np.where(np.arange(len(x)) % 3 == 0, "even", "any")}
    ref = oracle.judge(x, probs, labels, metadata=meta)
    got = compiled.judge(x, probs, labels, metadata=meta)
    np.testing.assert_array_equal(ref.verdict, got.verdict)
    np.testing.assert_array_equal(ref.rule, got.rule)
    assert set(ref.counts()) == {"pass", "fail:idi", "fail:tdi", "fail:adi"}
    assert min(ref.counts().values()) > 0  # every family fires in this set


def test_inputs_exactly_on_thresholds(digits_oracle: tuple[Oracle, np.ndarray, np.ndarray, np.ndarray]) -> None:
    oracle, x, probs, labels = digits_oracle
    tdi = oracle.tdi
    assert tdi is not None
    internal = np.flatnonzero(tdi.children_left != -1)
    edge = np.repeat(x[:1], len(internal), axis=0)
    edge[np.arange(len(internal)), tdi.feature[internal]] = tdi.threshold[internal].astype(np.float32)
    compiled = CompiledOracle(Oracle(None, tdi, None), x.shape[1], 10)
    lab = np.zeros(len(edge), dtype=np.int64)
    np.testing.assert_array_equal(tdi.evaluate(edge, lab), compiled.judge(edge, probs[: len(edge)], lab).rule)


def test_empty_batch_and_partial_oracles(digits_oracle: tuple[Oracle, np.ndarray, np.ndarray, np.ndarray]) -> None:
    oracle, x, probs, labels = digits_oracle
    for parts in [(None, oracle.tdi, None), (None, None, oracle.adi), (None, None, None)]:
        ref, comp = Oracle(*parts), CompiledOracle(Oracle(*parts), x.shape[1], 10)
        np.testing.assert_array_equal(ref.judge(x, probs, labels).verdict, comp.judge(x, probs, labels).verdict)
    assert len(CompiledOracle(oracle, x.shape[1], 10).judge(x[:0], probs[:0], labels[:0])) == 0
