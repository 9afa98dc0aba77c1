"""Reading a classifier's ONNX graph: where its penultimate representation is, and the graph with extra
outputs (so that one session run also gives that representation).

The penultimate representation is the input of the last dense layer before the scores: walking back from
the scores output through what only rescales or reshapes them (softmax, bias, normalisation, ZipMap, casts,
reshapes), the first ``MatMul``/``Gemm`` (or scikit-learn's ``LinearClassifier``/``SVMClassifier``) takes
it as its data input. Tree ensembles have none: their input is the raw features.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Operators that pass the scores through (rescaled, reshaped, biased): the walk goes on through them.
_PASS_THROUGH = frozenset(
    {
        "Softmax",
        "LogSoftmax",
        "Sigmoid",
        "Identity",
        "Cast",
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Normalizer",
        "ZipMap",
        "Relu",
        "Transpose",
    }
)
#: Dense layers: their data input is the penultimate representation.
_DENSE = frozenset({"MatMul", "Gemm", "LinearClassifier", "LinearRegressor", "SVMClassifier"})


def penultimate_tensor(model_bytes: bytes, scores_output: str) -> str | None:
    """The name of the tensor feeding the last dense layer before ``scores_output`` (None without one)."""
    import onnx

    graph = onnx.load_from_string(model_bytes).graph
    producer = {out: node for node in graph.node for out in node.output}
    constants = {i.name for i in graph.initializer} | {
        out for node in graph.node if node.op_type == "Constant" for out in node.output
    }
    name = scores_output
    for _ in range(64):  # a graph's depth bounds the walk; 64 pass-through steps is far beyond any head
        node = producer.get(name)
        if node is None:
            return None
        data = [i for i in node.input if i and i not in constants]
        if node.op_type in _DENSE:
            return data[0] if data else None
        if node.op_type not in _PASS_THROUGH or len(data) != 1:
            return None
        name = data[0]
    return None


def tensor_exists(model_bytes: bytes, name: str) -> bool:
    import onnx

    graph = onnx.load_from_string(model_bytes).graph
    return any(name in node.output for node in graph.node) or any(i.name == name for i in graph.input)


def with_outputs(model_bytes: bytes, names: Sequence[str]) -> bytes:
    """The model with the intermediate tensors ``names`` added to its graph outputs (their element type
    from shape inference; float where it cannot tell)."""
    import onnx
    from onnx import TensorProto, helper, shape_inference

    model = onnx.load_from_string(model_bytes)
    existing = {o.name for o in model.graph.output}
    todo = [n for n in names if n not in existing]
    if not todo:
        return model_bytes
    try:
        inferred = shape_inference.infer_shapes(model)
        types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    except Exception:  # noqa: BLE001 - custom domains (ai.onnx.ml) may not infer: fall back to float
        types = {}
    for n in todo:
        model.graph.output.append(helper.make_tensor_value_info(n, types.get(n) or TensorProto.FLOAT, None))
    return bytes(model.SerializeToString())
