"""Graph surgery of D-Score's deleting mutation operator (paper §IV-A, §V-B): a ``Mul`` by a mask
input after every 2-D ``Conv``, so one onnxruntime session evaluates the base model (all-ones masks)
and every region-deleted variant (region-zeroed masks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.audits.dscore.translation import region_bounds
from agent.audits.report import AuditError


@dataclass(frozen=True)
class MaskSlot:
    """One inserted mask input: its name, the Conv it follows and the conv output's spatial size."""

    name: str
    conv: str
    height: int
    width: int
    dtype: np.dtype


@dataclass(frozen=True)
class MaskedModel:
    """The model with a ``Mul`` by a ``[1, 1, H_k, W_k]`` mask input after every ``Conv``."""

    model_bytes: bytes
    input_name: str
    input_hw: tuple[int, int]
    slots: tuple[MaskSlot, ...]

    def masks(self, n: int, region: int | None) -> dict[str, np.ndarray]:
        """Feeds for every mask: all ones (``region=None``, the base model) or ``region`` zeroed."""
        feeds: dict[str, np.ndarray] = {}
        for slot in self.slots:
            m = np.ones((1, 1, slot.height, slot.width), dtype=slot.dtype)
            if region is not None:
                r0, r1, c0, c1 = region_bounds(region, n, slot.height, slot.width)
                m[..., r0:r1, c0:c1] = 0
            feeds[slot.name] = m
        return feeds


def _static_dims(type_proto: Any) -> list[int | None]:
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return []
    return [int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]


#: Element-wise activations with f(0) = 0 behind which a 0/1 mask may move unchanged.
_ZERO_PRESERVING = frozenset({"Relu", "LeakyRelu"})


def insert_region_masks(model_bytes: bytes, *, input_hw: tuple[int, int] | None = None) -> MaskedModel:
    """Insert ``Mul(conv_out, mask_k)`` after every top-level ``Conv`` node (graph surgery, §V-B).

    The masked tensor keeps its name (now produced by the ``Mul``), so every consumer and any
    graph output sees the masked value. When a Conv's only consumer is a ``Relu``/``LeakyRelu``,
    the ``Mul`` goes after that activation instead: with a 0/1 mask and ``f(0) = 0`` this is the
    same function (the deleted neurons' output is 0 either way) and keeps onnxruntime's fused
    Conv+activation kernel. Spatial sizes come from ONNX shape inference; when the
    model's input has dynamic H/W, ``input_hw=(H, W)`` fixes them before inference.
    """
    # onnx stays out of start-up until a D-Score audit runs
    import onnx

    try:
        model = onnx.load_from_string(model_bytes)
    except Exception as exc:  # protobuf DecodeError and friends
        raise AuditError(f"not an ONNX model: {exc}") from exc
    graph = model.graph
    conv_idx = {i for i, nd in enumerate(graph.node) if nd.op_type == "Conv" and nd.domain in ("", "ai.onnx")}
    if not conv_idx:
        raise AuditError("model has no Conv nodes; D-Score needs a convolutional model")
    inp, hw = _image_input(graph, input_hw)
    shapes, elem_types = _inferred_types(model)
    slots = _insert_masks(graph, _mask_points(graph, conv_idx), shapes, elem_types)
    return MaskedModel(model.SerializeToString(), inp.name, hw, tuple(slots))


def _image_input(graph: Any, input_hw: tuple[int, int] | None) -> tuple[Any, tuple[int, int]]:
    """The graph's one image input ``[N, C, H, W]`` and its spatial size (``input_hw`` fixing a dynamic one)."""
    init_names = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in init_names]
    if len(inputs) != 1:
        raise AuditError(f"D-Score needs a model with exactly one input, found {len(inputs)}")
    inp = inputs[0]
    in_dims = inp.type.tensor_type.shape.dim
    if len(in_dims) != 4:
        raise AuditError(f"D-Score needs an image input [N, C, H, W], got rank {len(in_dims)}")
    if input_hw is not None:
        for axis, size in zip((2, 3), input_hw, strict=True):
            dim = in_dims[axis]
            if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                raise AuditError(f"input_hw={tuple(input_hw)} contradicts the model's fixed input size")
            dim.Clear()
            dim.dim_value = int(size)
    hw = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in in_dims[2:]]
    if hw[0] is None or hw[1] is None:
        raise AuditError(
            f"model input {inp.name!r} has a dynamic spatial size; pass input_hw=(H, W) to fix it for D-Score"
        )
    return inp, (int(hw[0]), int(hw[1]))


def _inferred_types(model: Any) -> tuple[dict[str, list[int | None]], dict[str, int]]:
    """Every tensor's static dimensions and element type, by ONNX shape inference."""
    from onnx import shape_inference

    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception as exc:
        raise AuditError(f"ONNX shape inference failed: {exc}") from exc
    infos = [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    shapes: dict[str, list[int | None]] = {}
    for vi in infos:
        shapes[vi.name] = _static_dims(vi.type)
    elem_types: dict[str, int] = {vi.name: vi.type.tensor_type.elem_type for vi in infos}
    return shapes, elem_types


def _mask_points(graph: Any, conv_idx: set[int]) -> dict[int, tuple[str, str]]:
    """Where each Conv's mask goes, ``{node index: (conv label, conv output)}``: after the Conv, or after its
    ReLU when that ReLU is the Conv's only consumer (ReLU(0) = 0 and the mask is 0/1, so the result is the
    same, and onnxruntime keeps its fused Conv+ReLU kernel)."""
    consumers: dict[str, list[int]] = {}
    for i, nd in enumerate(graph.node):
        for name in nd.input:
            consumers.setdefault(name, []).append(i)
    graph_outputs = {o.name for o in graph.output}
    mask_at: dict[int, tuple[str, str]] = {}
    for i in sorted(conv_idx):
        conv = graph.node[i]
        out = conv.output[0]
        users = consumers.get(out, [])
        at = i
        if len(users) == 1 and out not in graph_outputs:
            nxt = graph.node[users[0]]
            if nxt.op_type in _ZERO_PRESERVING and nxt.domain in ("", "ai.onnx") and len(nxt.output) == 1:
                at = users[0]
        mask_at[at] = (conv.name or out, out)
    return mask_at


def _insert_masks(
    graph: Any,
    mask_at: dict[int, tuple[str, str]],
    shapes: dict[str, list[int | None]],
    elem_types: dict[str, int],
) -> list[MaskSlot]:
    """Rewrite ``graph``'s nodes with a ``Mul`` by a new mask input after each node of ``mask_at``."""
    import onnx
    from onnx import helper

    used = {name for nd in graph.node for name in (*nd.input, *nd.output)} | {i.name for i in graph.input}
    slots: list[MaskSlot] = []
    new_nodes: list[onnx.NodeProto] = []
    for idx, original in enumerate(graph.node):
        node = onnx.NodeProto()
        node.CopyFrom(original)
        new_nodes.append(node)
        if idx not in mask_at:
            continue
        label, conv_out = mask_at[idx]
        out = node.output[0]
        dims = shapes.get(conv_out, [])
        if len(dims) != 4:
            raise AuditError(f"Conv {label!r} is not a 2-D convolution with a known output shape (got {dims})")
        h, w = dims[2], dims[3]
        if h is None or w is None:
            raise AuditError(
                f"cannot infer the spatial size of Conv {label!r}'s output; pass input_hw=(H, W) to fix it"
            )
        k = len(slots)
        mask_name, pre = f"dscore_mask_{k}", f"{out}__dscore_conv"
        while mask_name in used or pre in used:
            mask_name, pre = mask_name + "_", pre + "_"
        used.update((mask_name, pre))
        elem = elem_types.get(out, onnx.TensorProto.FLOAT) or onnx.TensorProto.FLOAT
        node.output[0] = pre
        new_nodes.append(helper.make_node("Mul", [pre, mask_name], [out], name=f"dscore_mask_mul_{k}"))
        graph.input.append(helper.make_tensor_value_info(mask_name, elem, [1, 1, h, w]))
        slots.append(MaskSlot(mask_name, label, h, w, np.dtype(helper.tensor_dtype_to_np_dtype(elem))))
    del graph.node[:]
    graph.node.extend(new_nodes)
    return slots


def bake_masks(masked: MaskedModel, feeds: dict[str, np.ndarray]) -> bytes:
    """The masked model with the given mask values turned into constant initializers."""
    # onnx stays out of start-up until a D-Score audit runs
    import onnx
    from onnx import numpy_helper

    model = onnx.load_from_string(masked.model_bytes)
    keep = [i for i in model.graph.input if i.name not in feeds]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    for name, value in feeds.items():
        model.graph.initializer.append(numpy_helper.from_array(value, name=name))
    return model.SerializeToString()
