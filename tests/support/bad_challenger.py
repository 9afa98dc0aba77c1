"""A real ONNX challenger that misbehaves on demand: the drifted MNIST CNN (:data:`CHALLENGER_MODEL`) wrapped so
that a batch whose largest pixel is one of the :data:`TRIGGERS` values answers NaN, raises inside onnxruntime
(a Gather past the end), computes for seconds (a Loop of matrix products) or answers 11 classes instead of 10.
Pixels of real digits are at most 255, so the bundle fitted for it (``fit --champion``) never sees a trigger,
and the champion answers a triggered batch as any other."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support.challenger import CHALLENGER_MODEL

#: the largest pixel of a batch → what the bad challenger does with it
TRIGGERS = {"nan": 1001.0, "raise": 1002.0, "slow": 1003.0, "other_classes": 1004.0}
#: matrix products of the slow branch (each of two 384×384 matrices: about 10 ms of one core)
SLOW_STEPS = 1000
_SIDE = 384


def _branch(name: str, nodes: list[onnx.NodeProto], out: str, inits: list[onnx.TensorProto]) -> onnx.GraphProto:
    value = helper.make_tensor_value_info(out, TensorProto.FLOAT, None)
    return helper.make_graph(nodes, name, [], [value], initializer=inits)


def _slow_branch() -> onnx.GraphProto:
    """``logits`` after :data:`SLOW_STEPS` products of a matrix seeded by the batch (nothing to fold away)."""
    w = numpy_helper.from_array(np.eye(_SIDE, dtype=np.float32) * 0.5, "slow_w")
    shape = numpy_helper.from_array(np.array([_SIDE, _SIDE], dtype=np.int64), "slow_shape")
    trips = numpy_helper.from_array(np.array(SLOW_STEPS, dtype=np.int64), "slow_trips")
    keep = numpy_helper.from_array(np.array(True), "slow_keep")
    zero = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "slow_zero")
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["state_in", "slow_w"], ["prod"]),
            helper.make_node("Tanh", ["prod"], ["state_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "slow_body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_out", TensorProto.FLOAT, None),
        ],
    )
    nodes = [
        helper.make_node("Expand", ["top", "slow_shape"], ["seed"]),
        helper.make_node("Loop", ["slow_trips", "slow_keep", "seed"], ["state"], body=body),
        helper.make_node("ReduceMax", ["state"], ["peak"], keepdims=0),
        helper.make_node("Mul", ["peak", "slow_zero"], ["nothing"]),
        helper.make_node("Add", ["logits", "nothing"], ["slow_out"]),
    ]
    return _branch("slow", nodes, "slow_out", [w, shape, trips, keep, zero])


def _if(trigger: str, then: onnx.GraphProto, otherwise: onnx.GraphProto, out: str) -> list[onnx.NodeProto]:
    value = f"trigger_{trigger}"
    return [
        helper.make_node("Constant", [], [value], value=numpy_helper.from_array(np.array(TRIGGERS[trigger], "f4"))),
        helper.make_node("Equal", ["top", value], [f"is_{trigger}"]),
        helper.make_node("If", [f"is_{trigger}"], [out], then_branch=then, else_branch=otherwise),
    ]


def bad_challenger_model() -> onnx.ModelProto:
    """The wrapped model: input ``input`` [N, 1, 28, 28], output ``scores`` [N, K] logits (K = 10 but when
    triggered to other classes)."""
    base = onnx.load(str(CHALLENGER_MODEL))
    graph = base.graph
    assert [o.name for o in graph.output] == ["logits"]
    nan = numpy_helper.from_array(np.array(np.nan, dtype=np.float32), "nan_value")
    index = numpy_helper.from_array(np.array([1_000_000], dtype=np.int64), "past_end")
    extra = numpy_helper.from_array(np.zeros((1, 1), dtype=np.float32), "extra_zero")
    width = numpy_helper.from_array(np.array([1], dtype=np.int64), "extra_one")
    nan_branch = _branch("nan", [helper.make_node("Mul", ["logits", "nan_value"], ["nan_out"])], "nan_out", [nan])
    raise_branch = _branch(
        "raise", [helper.make_node("Gather", ["logits", "past_end"], ["raise_out"], axis=1)], "raise_out", [index]
    )
    other_branch = _branch(
        "other",
        [
            helper.make_node("Shape", ["logits"], ["logits_shape"], end=1),
            helper.make_node("Concat", ["logits_shape", "extra_one"], ["extra_dims"], axis=0),
            helper.make_node("Expand", ["extra_zero", "extra_dims"], ["extra_col"]),
            helper.make_node("Concat", ["logits", "extra_col"], ["other_out"], axis=1),
        ],
        "other_out",
        [extra, width],
    )
    plain = _branch("plain", [helper.make_node("Identity", ["logits"], ["plain_out"])], "plain_out", [])
    chain = plain
    nodes: list[onnx.NodeProto] = [helper.make_node("ReduceMax", ["input"], ["top"], keepdims=0)]
    for i, (trigger, branch) in enumerate(
        [("other_classes", other_branch), ("slow", _slow_branch()), ("raise", raise_branch), ("nan", nan_branch)]
    ):
        out = "scores" if trigger == "nan" else f"chain_{i}"
        step = _if(trigger, branch, chain, out)
        if trigger == "nan":
            nodes += step
        else:
            chain = helper.make_graph(
                step, f"chain_{i}", [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]
            )
    graph.node.extend(nodes)
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", "K"]))
    onnx.checker.check_model(base)
    return base


def write_bad_challenger(path: Path) -> Path:
    path.write_bytes(bad_challenger_model().SerializeToString())
    return path
