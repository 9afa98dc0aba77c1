"""D-Score: robustness and fitness of a CNN from region deletion and pad-and-resize translation.

Implements §IV of the D-Score paper ("D-Score: a white-box diagnosis score for CNNs based on
mutation operators"), see ``docs``/papers ``d-score.txt``:

* **Variants (§IV-A "Mutation Operators", §V-B "Deleting Mutation Operator").** The output of every
  2-D ``Conv`` node is split into an ``n × n`` grid of equal rectangles, indexed row-major from the
  upper-left corner; variant ``i`` sets region ``i`` of *every* convolution output to 0 during the
  forward pass. Here this is graph surgery: after each ``Conv`` a ``Mul(conv_out, mask_k)`` is
  inserted, where ``mask_k`` is a new graph input of shape ``[1, 1, H_k, W_k]`` (broadcast over batch
  and channels). One onnxruntime session therefore evaluates the base model (all-ones masks, which
  reproduce the original outputs bit for bit) and all ``n²`` variants (region-zeroed masks).
  Region boundaries on an ``H × W`` map are ``floor(i·H/n)``.
* **Translation (§IV-A "Image Transformation", Fig. 4).** For the region at row ``r``, column ``c``
  the image is padded with zeros: ``r·u_h`` rows on top, ``(n−1−r)·u_h`` at the bottom, ``c·u_w``
  columns left and ``(n−1−c)·u_w`` right, with ``u_h = round(H/t)``, ``u_w = round(W/t)`` (half up),
  then resized back to ``H × W`` by bilinear interpolation (half-pixel centres, no antialiasing).
  The paper's example (``n = 4``, region 7, 1-based) pads ``l/t`` top, ``2l/t`` bottom, ``2k/t`` left,
  ``k/t`` right: paddings are whole multiples of one rounded unit, so we round the unit once and
  multiply, which keeps the paper's 1:2 proportions exact.
* **Scores.** Feature distribution f̃ (eq. 1), attention distribution ã (eq. 2), v_fitness (eq. 3),
  v_robust (eq. 4), the bound g(n) (eq. 5), D-Score (eq. 6), augmentation probability p and padded
  size d (eq. 7) and the random split of the padding (eq. 8, :func:`augment`).

Region indices in this module are 0-based (``0 … n²−1``); the paper counts from 1.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from agent.audits.report import AuditError, AuditResult, ProgressFn
from invariants.onnx_session import OnnxSession

#: A 1-D sequence of numbers: a list, tuple or numpy array.
Floats = Sequence[float] | np.ndarray

__all__ = [
    "DScoreAudit",
    "DScoreError",
    "DScoreResult",
    "MaskSlot",
    "MaskedModel",
    "attention_distribution",
    "augment",
    "feature_distribution",
    "g_bound",
    "heatmaps_png",
    "insert_region_masks",
    "pad_resize",
    "region_bounds",
    "resize_bilinear",
    "run_dscore",
    "run_dscore_separate_sessions",
    "score",
    "score_from_distributions",
    "translate",
    "translation_padding",
]


class DScoreError(AuditError):
    """The model or data cannot be scored with D-Score (message says why)."""


# ----------------------------------------------------------------------------------------------
# Pure maths: eqs. 1-7
# ----------------------------------------------------------------------------------------------


def _grid_n(count: int, what: str) -> int:
    n = math.isqrt(count)
    if n < 1 or n * n != count:
        raise DScoreError(f"{what} must hold n² values for an n×n grid, got {count}")
    return n


def feature_distribution(base_accuracy: float, variant_accuracies: Floats) -> tuple[np.ndarray, bool]:
    """Eq. 1: ``f̃_i = max(f_b − f_i, 0) / Σ_j max(f_b − f_j, 0)``.

    Returns the distribution and whether it was degenerate: when no variant is worse than the
    base model the denominator is 0 and eq. 1 is undefined; we then return the uniform
    distribution ``1/n²`` (no region carries more of the features than another) and ``True``.
    """
    f = np.asarray(variant_accuracies, dtype=np.float64)
    drops = np.maximum(float(base_accuracy) - f, 0.0)
    total = float(drops.sum())
    if total <= 0.0:
        return np.full(len(f), 1.0 / len(f)), True
    return drops / total, False


def attention_distribution(translated_accuracies: Floats) -> tuple[np.ndarray, bool]:
    """Eq. 2: ``ã_i = a_i / Σ_j a_j``; uniform (and ``True``) when every ``a_i`` is 0."""
    a = np.asarray(translated_accuracies, dtype=np.float64)
    total = float(a.sum())
    if total <= 0.0:
        return np.full(len(a), 1.0 / len(a)), True
    return a / total, False


def g_bound(n: int, n_classes: int) -> float:
    """Eq. 5: ``g(n) = 2·sqrt(n² − 1)/n³ + (1/n)·(c − 1)/c``, the upper bound of v_robust."""
    if n < 1 or n_classes < 2:
        raise DScoreError(f"g(n) needs n >= 1 and at least 2 classes (n={n}, c={n_classes})")
    return 2.0 * math.sqrt(n * n - 1) / n**3 + (1.0 / n) * (n_classes - 1) / n_classes


@dataclass(frozen=True)
class DScoreResult:
    """All quantities of §IV for one model and data set (accuracies as fractions in [0, 1]).

    ``robustness_terms`` are the three square-root terms of eq. 4, each already divided by n².
    ``feature_uniform_fallback`` / ``attention_uniform_fallback`` flag the degenerate cases of
    eqs. 1-2 (see :func:`feature_distribution`). ``augmentation_probability`` is eq. 7's p, clipped
    to [0, 1] (the paper's bound assumes every accuracy is at least 1/c; ``p_unclipped`` keeps the
    raw ratio). ``padded_size_factor`` is ``d / d̂ = 1 + p``.
    """

    n: int
    n_classes: int
    base_accuracy: float
    variant_accuracies: tuple[float, ...] | None
    translated_accuracies: tuple[float, ...]
    feature_distribution: tuple[float, ...]
    attention_distribution: tuple[float, ...]
    fitness: float
    robustness: float
    robustness_terms: tuple[float, float, float]
    g: float
    dscore: float
    augmentation_probability: float
    p_unclipped: float
    padded_size_factor: float
    feature_uniform_fallback: bool
    attention_uniform_fallback: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score_from_distributions(
    base_accuracy: float,
    feature_dist: Floats,
    translated_accuracies: Floats,
    n_classes: int,
    *,
    variant_accuracies: Floats | None = None,
    feature_uniform_fallback: bool = False,
) -> DScoreResult:
    """Eqs. 2-7 from an already normalised feature distribution f̃ (as Table VI reports it).

    ``f_i`` in eqs. 3-4 is the normalised f̃_i: with it, Table VI's rows (a_i, f̃_i, accuracy)
    give the table's v_robust, v_fitness and D-Score.

    * eq. 3: ``v_fitness = â − (1/n²)·sqrt(Σ (f̃_i − ã_i)²)``
    * eq. 4: ``v_robust = (1/n²)·(sqrt(Σ (f̃_i − 1/n²)²) + sqrt(Σ (ã_i − 1/n²)²) + sqrt(Σ (a_i − â)²))``
    * eq. 6: ``D-Score = v_fitness − v_robust``; eq. 7: ``p = v_robust / g(n)``, ``d = (1 + p)·d̂``.
    """
    f = np.asarray(feature_dist, dtype=np.float64)
    a = np.asarray(translated_accuracies, dtype=np.float64)
    if f.shape != a.shape or f.ndim != 1:
        raise DScoreError(f"feature distribution ({f.shape}) and translated accuracies ({a.shape}) differ in size")
    n = _grid_n(len(f), "the feature distribution")
    n2 = n * n
    a_hat = float(base_accuracy)
    a_tilde, att_fallback = attention_distribution(a)
    fitness = a_hat - math.sqrt(float(np.sum((f - a_tilde) ** 2))) / n2
    t1 = math.sqrt(float(np.sum((f - 1.0 / n2) ** 2))) / n2
    t2 = math.sqrt(float(np.sum((a_tilde - 1.0 / n2) ** 2))) / n2
    t3 = math.sqrt(float(np.sum((a - a_hat) ** 2))) / n2
    robust = t1 + t2 + t3
    g = g_bound(n, n_classes)
    p_raw = robust / g
    p = min(max(p_raw, 0.0), 1.0)
    return DScoreResult(
        n=n,
        n_classes=int(n_classes),
        base_accuracy=a_hat,
        variant_accuracies=tuple(float(v) for v in variant_accuracies) if variant_accuracies is not None else None,
        translated_accuracies=tuple(float(v) for v in a),
        feature_distribution=tuple(float(v) for v in f),
        attention_distribution=tuple(float(v) for v in a_tilde),
        fitness=fitness,
        robustness=robust,
        robustness_terms=(t1, t2, t3),
        g=g,
        dscore=fitness - robust,
        augmentation_probability=p,
        p_unclipped=p_raw,
        padded_size_factor=1.0 + p,
        feature_uniform_fallback=feature_uniform_fallback,
        attention_uniform_fallback=att_fallback,
    )


def score(
    base_accuracy: float,
    variant_accuracies: Floats,
    translated_accuracies: Floats,
    n_classes: int,
) -> DScoreResult:
    """Eqs. 1-7 from raw accuracies: ``f_b`` (= â), the ``n²`` variant accuracies ``f_i`` and the
    ``n²`` translated-set accuracies ``a_i`` (all fractions in [0, 1])."""
    if len(variant_accuracies) != len(translated_accuracies):
        raise DScoreError(
            f"{len(variant_accuracies)} variant accuracies but {len(translated_accuracies)} translated accuracies"
        )
    f_tilde, fallback = feature_distribution(base_accuracy, variant_accuracies)
    return score_from_distributions(
        base_accuracy,
        f_tilde,
        translated_accuracies,
        n_classes,
        variant_accuracies=variant_accuracies,
        feature_uniform_fallback=fallback,
    )


# ----------------------------------------------------------------------------------------------
# Regions and translation (§IV-A)
# ----------------------------------------------------------------------------------------------


def region_bounds(region: int, n: int, height: int, width: int) -> tuple[int, int, int, int]:
    """Rows ``[r0, r1)`` and columns ``[c0, c1)`` of 0-based ``region`` of an ``n × n`` grid.

    Boundaries are ``floor(i·H/n)``; regions are numbered row-major from the upper-left corner.
    """
    if not 0 <= region < n * n:
        raise DScoreError(f"region {region} is outside 0..{n * n - 1}")
    r, c = divmod(region, n)
    return (r * height) // n, ((r + 1) * height) // n, (c * width) // n, ((c + 1) * width) // n


def _round_half_up(v: float) -> int:
    return int(math.floor(v + 0.5))


def translation_padding(region: int, n: int, t: float, height: int, width: int) -> tuple[int, int, int, int]:
    """Zero padding ``(top, bottom, left, right)`` that pushes the image towards 0-based ``region``.

    ``top = r·u_h``, ``bottom = (n−1−r)·u_h``, ``left = c·u_w``, ``right = (n−1−c)·u_w`` with
    ``u_h = round(H/t)``, ``u_w = round(W/t)`` (half up). For the paper's example (n = 4,
    region 7 counted from 1, i.e. ``region=6`` here) this is ``(u, 2u, 2u, u)``.
    """
    if t <= 0:
        raise DScoreError(f"t must be positive, got {t}")
    if not 0 <= region < n * n:
        raise DScoreError(f"region {region} is outside 0..{n * n - 1}")
    r, c = divmod(region, n)
    u_h = _round_half_up(height / t)
    u_w = _round_half_up(width / t)
    if u_h == 0 and u_w == 0 and n > 1:
        raise DScoreError(f"t={t} is too large for {height}×{width} images: the padding unit rounds to 0 pixels")
    return r * u_h, (n - 1 - r) * u_h, c * u_w, (n - 1 - c) * u_w


def _resize_matrix(in_size: int, out_size: int) -> np.ndarray:
    """``out_size × in_size`` linear-interpolation matrix, half-pixel centres, edge clamped.

    The same sampling as ``cv2.INTER_LINEAR`` and torchvision's ``Resize(antialias=False)``:
    output pixel ``o`` samples the input at ``(o + 0.5)·in/out − 0.5``.
    """
    m = np.zeros((out_size, in_size), dtype=np.float64)
    scale = in_size / out_size
    for o in range(out_size):
        src = min(max((o + 0.5) * scale - 0.5, 0.0), in_size - 1.0)
        i0 = int(math.floor(src))
        i1 = min(i0 + 1, in_size - 1)
        w = src - i0
        m[o, i0] += 1.0 - w
        m[o, i1] += w
    return m


def resize_bilinear(x: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Bilinear resize of the last two axes of ``x`` (e.g. ``[N, C, H, W]``) to ``out_h × out_w``."""
    rh = _resize_matrix(x.shape[-2], out_h).astype(np.float32)
    rw = _resize_matrix(x.shape[-1], out_w).astype(np.float32)
    out = rh @ np.asarray(x, dtype=np.float32) @ rw.T
    return out.astype(x.dtype, copy=False)


@dataclass(frozen=True)
class _PadResize:
    """Zero-pad then bilinear-resize back, folded into two matrices: ``Rh @ x @ Rw.T``.

    Padding with zeros and resizing is linear, so ``resize(pad(x))`` equals the resize matrix of the
    padded size restricted to the columns of the original pixels; no padded array is built.
    """

    rh: np.ndarray
    rw: np.ndarray

    @classmethod
    def build(cls, height: int, width: int, top: int, bottom: int, left: int, right: int) -> _PadResize:
        rh = _resize_matrix(height + top + bottom, height)[:, top : top + height]
        rw = _resize_matrix(width + left + right, width)[:, left : left + width]
        return cls(rh.astype(np.float32), rw.astype(np.float32))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (self.rh @ np.asarray(x, dtype=np.float32) @ self.rw.T).astype(x.dtype, copy=False)


def pad_resize(x: np.ndarray, top: int, bottom: int, left: int, right: int) -> np.ndarray:
    """Zero-pad the last two axes of ``x`` and resize back to the original size (bilinear)."""
    h, w = x.shape[-2], x.shape[-1]
    return _PadResize.build(h, w, top, bottom, left, right)(x)


def translate(x: np.ndarray, region: int, n: int = 3, t: float = 5) -> np.ndarray:
    """§IV-A image translation of a batch ``[N, C, H, W]`` (or ``[..., H, W]``) towards ``region``."""
    h, w = x.shape[-2], x.shape[-1]
    return pad_resize(x, *translation_padding(region, n, t, h, w))


def augment(batch: np.ndarray, result: DScoreResult, rng: np.random.Generator) -> np.ndarray:
    """Score-guided augmentation (§IV-B, eqs. 7-8) of a batch ``[N, C, H, W]``.

    Each image is transformed with probability ``p``: it is padded with ``p·d̂`` zero pixels per
    dimension (so the padded size is ``d = (1 + p)·d̂``), split as ``d_l ~ U[0, p·d̂]``,
    ``d_r = p·d̂ − d_l`` (likewise ``d_u``/``d_d``), then resized back to ``d̂``. Pixel counts are
    rounded half up; untouched images are returned unchanged.
    """
    p = float(result.augmentation_probability)
    out = np.array(batch, copy=True)
    if out.ndim < 2 or len(out) == 0 or p <= 0.0:
        return out
    h, w = out.shape[-2], out.shape[-1]
    pad_h, pad_w = _round_half_up(p * h), _round_half_up(p * w)
    chosen = np.flatnonzero(rng.random(len(out)) < p)
    if len(chosen) == 0 or (pad_h == 0 and pad_w == 0):
        return out
    top = np.minimum(np.floor(rng.uniform(0.0, p * h, len(chosen)) + 0.5).astype(np.int64), pad_h)
    left = np.minimum(np.floor(rng.uniform(0.0, p * w, len(chosen)) + 0.5).astype(np.int64), pad_w)
    rh_full = _resize_matrix(h + pad_h, h).astype(np.float32)  # [h, h + pad_h]
    rw_full = _resize_matrix(w + pad_w, w).astype(np.float32)
    rh = np.transpose(rh_full[:, top[:, None] + np.arange(h)], (1, 0, 2))  # [m, h, h]
    rw = np.transpose(rw_full[:, left[:, None] + np.arange(w)], (1, 0, 2))  # [m, w, w]
    sel = out[chosen].astype(np.float32).reshape(len(chosen), -1, h, w)
    moved = np.einsum("mij,mcjk,mlk->mcil", rh, sel, rw, optimize=True)
    out[chosen] = moved.reshape(out[chosen].shape).astype(out.dtype, copy=False)
    return out


# ----------------------------------------------------------------------------------------------
# Graph surgery: masks after every Conv
# ----------------------------------------------------------------------------------------------


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
    import onnx
    from onnx import helper, shape_inference

    try:
        model = onnx.load_from_string(model_bytes)
    except Exception as exc:  # protobuf DecodeError and friends
        raise DScoreError(f"not an ONNX model: {exc}") from exc
    graph = model.graph
    conv_idx = {i for i, nd in enumerate(graph.node) if nd.op_type == "Conv" and nd.domain in ("", "ai.onnx")}
    if not conv_idx:
        raise DScoreError("model has no Conv nodes; D-Score needs a convolutional model")
    init_names = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in init_names]
    if len(inputs) != 1:
        raise DScoreError(f"D-Score needs a model with exactly one input, found {len(inputs)}")
    inp = inputs[0]
    in_dims = inp.type.tensor_type.shape.dim
    if len(in_dims) != 4:
        raise DScoreError(f"D-Score needs an image input [N, C, H, W], got rank {len(in_dims)}")
    if input_hw is not None:
        for axis, size in zip((2, 3), input_hw, strict=True):
            dim = in_dims[axis]
            if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                raise DScoreError(f"input_hw={tuple(input_hw)} contradicts the model's fixed input size")
            dim.Clear()
            dim.dim_value = int(size)
    hw = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in in_dims[2:]]
    if hw[0] is None or hw[1] is None:
        raise DScoreError(
            f"model input {inp.name!r} has a dynamic spatial size; pass input_hw=(H, W) to fix it for D-Score"
        )
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception as exc:
        raise DScoreError(f"ONNX shape inference failed: {exc}") from exc
    shapes: dict[str, list[int | None]] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]:
        shapes[vi.name] = _static_dims(vi.type)
    elem_types: dict[str, int] = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    }
    used = {name for nd in graph.node for name in (*nd.input, *nd.output)} | {i.name for i in graph.input}
    # Where each Conv's mask goes: after the Conv, or after its ReLU when that ReLU is the Conv's only
    # consumer (ReLU(0) = 0 and the mask is 0/1, so the result is the same, and onnxruntime keeps
    # its fused Conv+ReLU kernel).
    consumers: dict[str, list[int]] = {}
    for i, nd in enumerate(graph.node):
        for name in nd.input:
            consumers.setdefault(name, []).append(i)
    graph_outputs = {o.name for o in graph.output}
    mask_at: dict[int, tuple[str, str]] = {}  # node index -> (conv label, conv output)
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
            raise DScoreError(f"Conv {label!r} is not a 2-D convolution with a known output shape (got {dims})")
        h, w = dims[2], dims[3]
        if h is None or w is None:
            raise DScoreError(
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
    return MaskedModel(model.SerializeToString(), inp.name, (int(hw[0]), int(hw[1])), tuple(slots))


def _bake_masks(masked: MaskedModel, feeds: dict[str, np.ndarray]) -> bytes:
    """The masked model with the given mask values turned into constant initializers."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load_from_string(masked.model_bytes)
    keep = [i for i in model.graph.input if i.name not in feeds]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    for name, value in feeds.items():
        model.graph.initializer.append(numpy_helper.from_array(value, name=name))
    return model.SerializeToString()


# ----------------------------------------------------------------------------------------------
# The audit
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DScoreAudit:
    """Raw accuracies and the §IV scores of one D-Score run.

    ``conv_maps`` lists every masked convolution output (name and spatial size); a map smaller
    than ``n`` in a dimension has empty grid cells, so deleting those regions leaves that layer
    unchanged (reported as ``maps_smaller_than_grid`` in the audit details).
    With ``label_free=True`` (no labels given) every "accuracy" is the agreement with the
    unmodified model's labels on the original inputs, so ``base_accuracy`` is 1.
    """

    n: int
    t: float
    n_samples: int
    n_classes: int
    label_free: bool
    scores_are_logits: bool
    base_accuracy: float
    variant_accuracies: list[float]
    translated_accuracies: list[float]
    result: DScoreResult
    seconds: float
    mode: str
    conv_maps: list[dict[str, Any]]

    def to_audit_result(self, *, heatmaps: bool = True) -> AuditResult:
        r = self.result
        metrics = {
            "dscore": r.dscore,
            "robustness": r.robustness,
            "fitness": r.fitness,
            "base_accuracy": r.base_accuracy,
            "g": r.g,
            "augmentation_probability": r.augmentation_probability,
            "min_variant_accuracy": min(self.variant_accuracies),
            "min_translated_accuracy": min(self.translated_accuracies),
            "mean_translated_accuracy": float(np.mean(self.translated_accuracies)),
            "seconds": self.seconds,
        }
        details: dict[str, Any] = {
            "label_free": self.label_free,
            "accuracy_meaning": (
                "agreement with the unmodified model's labels" if self.label_free else "accuracy against labels"
            ),
            "scores_are_logits": self.scores_are_logits,
            "region_order": "row-major from the upper-left corner, 0-based",
            "variant_accuracies": self.variant_accuracies,
            "translated_accuracies": self.translated_accuracies,
            "score": r.to_dict(),
            "mode": self.mode,
            "conv_maps": self.conv_maps,
            "maps_smaller_than_grid": [m["conv"] for m in self.conv_maps if min(m["height"], m["width"]) < self.n],
        }
        params = {"n": self.n, "t": self.t, "n_samples": self.n_samples, "n_classes": self.n_classes}
        artifacts = heatmaps_png(r, self.n) if heatmaps else {}
        return AuditResult("dscore", params, metrics, details, artifacts)


def _softmax_needed(scores: np.ndarray) -> bool:
    """Logit detection: rows that do not sum to 1 (within 1e-3) or hold negatives are not probabilities."""
    return bool(np.any(scores < 0) or np.any(np.abs(scores.sum(axis=1) - 1.0) > 1e-3))


def _pick_output(session: OnnxSession, output_name: str | None) -> str:
    names = [o.name for o in session.outputs]
    if output_name is not None:
        if output_name not in names:
            raise DScoreError(f"output {output_name!r} is not an output of the model ({', '.join(names)})")
        return output_name
    floats = [o for o in session.outputs if o.dtype.kind == "f" and len(o.shape) == 2]
    if len(floats) == 1:
        return floats[0].name
    by_name = {o.name: o for o in floats}
    if "probabilities" in by_name:
        return "probabilities"
    raise DScoreError(f"cannot tell which output holds the class scores ({', '.join(names)}); set output_name")


RunFn = Callable[[np.ndarray, "int | None"], np.ndarray]


def _evaluate(
    run: RunFn,
    x: np.ndarray,
    y: np.ndarray | None,
    *,
    n: int,
    t: float,
    batch_size: int,
    scores_are_logits: bool | None,
    progress: ProgressFn | None,
) -> tuple[float, list[float], list[float], int, bool]:
    """Accumulate base, variant and translated correct counts batch by batch.

    ``run(xb, region)`` returns class scores of the base model (``region=None``) or of the variant
    with ``region`` deleted.
    """
    if x.ndim != 4:
        raise DScoreError(f"D-Score needs images [N, C, H, W], got shape {list(x.shape)}")
    if len(x) == 0:
        raise DScoreError("no samples to score")
    if y is not None and len(y) != len(x):
        raise DScoreError(f"{len(x)} samples but {len(y)} labels")
    h, w = x.shape[2], x.shape[3]
    n2 = n * n
    shifters = [_PadResize.build(h, w, *translation_padding(i, n, t, h, w)) for i in range(n2)]
    base_ok = 0
    var_ok = np.zeros(n2, dtype=np.int64)
    tr_ok = np.zeros(n2, dtype=np.int64)
    n_batches = -(-len(x) // batch_size)
    total = n_batches * (2 * n2 + 1)
    done = 0
    n_classes = 0
    logits = scores_are_logits
    for start in range(0, len(x), batch_size):
        xb = x[start : start + batch_size]
        scores = run(xb, None)
        if logits is None:
            logits = _softmax_needed(scores)
        n_classes = scores.shape[1]
        pred = scores.argmax(axis=1)
        ref = pred if y is None else np.asarray(y[start : start + batch_size])
        base_ok += int(np.sum(pred == ref))
        for i in range(n2):
            var_ok[i] += int(np.sum(run(xb, i).argmax(axis=1) == ref))
        for i in range(n2):
            tr_ok[i] += int(np.sum(run(shifters[i](xb), None).argmax(axis=1) == ref))
        done += 2 * n2 + 1
        if progress is not None:
            progress(done, total)
    m = float(len(x))
    return (
        base_ok / m,
        [float(v) / m for v in var_ok],
        [float(v) / m for v in tr_ok],
        n_classes,
        bool(logits),
    )


def _check_args(n: int, t: float, batch_size: int) -> None:
    if n < 1:
        raise DScoreError(f"n must be >= 1, got {n}")
    if t <= 0:
        raise DScoreError(f"t must be positive, got {t}")
    if batch_size < 1:
        raise DScoreError(f"batch_size must be >= 1, got {batch_size}")


def run_dscore(
    model_bytes: bytes,
    x: np.ndarray,
    y: np.ndarray | None = None,
    *,
    n: int = 3,
    t: float = 5,
    batch_size: int = 256,
    input_hw: tuple[int, int] | None = None,
    output_name: str | None = None,
    scores_are_logits: bool | None = None,
    progress: ProgressFn | None = None,
) -> DScoreAudit:
    """D-Score of an ONNX CNN on images ``x`` ``[N, C, H, W]`` (labels ``y`` optional).

    One onnxruntime session on the masked graph serves the base model, the ``n²`` variants and
    the ``n²`` translated test sets: ``2n² + 1`` forward passes over the data in total.
    ``scores_are_logits`` is recorded (``None`` = detected from the first batch); accuracies use
    the arg-max, which softmax does not change.
    """
    _check_args(n, t, batch_size)
    started = time.perf_counter()
    masked = insert_region_masks(model_bytes, input_hw=input_hw)
    session = OnnxSession(masked.model_bytes)
    out = _pick_output(session, output_name)
    dtype = next(i.dtype for i in session.inputs if i.name == masked.input_name)
    ones = masked.masks(n, None)
    variants = [masked.masks(n, i) for i in range(n * n)]

    def run(xb: np.ndarray, region: int | None) -> np.ndarray:
        feeds = dict(ones if region is None else variants[region])
        feeds[masked.input_name] = np.ascontiguousarray(xb, dtype=dtype)
        return session.run(feeds, [out])[0]

    return _finish(run, x, y, n, t, batch_size, scores_are_logits, progress, started, "single_session", masked)


def run_dscore_separate_sessions(
    model_bytes: bytes,
    x: np.ndarray,
    y: np.ndarray | None = None,
    *,
    n: int = 3,
    t: float = 5,
    batch_size: int = 256,
    input_hw: tuple[int, int] | None = None,
    output_name: str | None = None,
    scores_are_logits: bool | None = None,
    progress: ProgressFn | None = None,
) -> DScoreAudit:
    """The slow baseline: ``n²`` separately built variant models, one session each, plus the
    unmodified model for the base and translated passes. Same results as :func:`run_dscore`."""
    _check_args(n, t, batch_size)
    started = time.perf_counter()
    masked = insert_region_masks(model_bytes, input_hw=input_hw)
    base = OnnxSession(model_bytes)
    out = _pick_output(base, output_name)
    in_name = masked.input_name
    dtype = next(i.dtype for i in base.inputs if i.name == in_name)
    sessions = [OnnxSession(_bake_masks(masked, masked.masks(n, i))) for i in range(n * n)]

    def run(xb: np.ndarray, region: int | None) -> np.ndarray:
        sess = base if region is None else sessions[region]
        return sess.run({in_name: np.ascontiguousarray(xb, dtype=dtype)}, [out])[0]

    return _finish(run, x, y, n, t, batch_size, scores_are_logits, progress, started, "separate_sessions", masked)


def _finish(
    run: RunFn,
    x: np.ndarray,
    y: np.ndarray | None,
    n: int,
    t: float,
    batch_size: int,
    scores_are_logits: bool | None,
    progress: ProgressFn | None,
    started: float,
    mode: str,
    masked: MaskedModel,
) -> DScoreAudit:
    base, variants, translated, n_classes, logits = _evaluate(
        run, x, y, n=n, t=t, batch_size=batch_size, scores_are_logits=scores_are_logits, progress=progress
    )
    result = score(base, variants, translated, n_classes)
    return DScoreAudit(
        n=n,
        t=t,
        n_samples=len(x),
        n_classes=n_classes,
        label_free=y is None,
        scores_are_logits=logits,
        base_accuracy=base,
        variant_accuracies=variants,
        translated_accuracies=translated,
        result=result,
        seconds=time.perf_counter() - started,
        mode=mode,
        conv_maps=[{"conv": m.conv, "height": m.height, "width": m.width} for m in masked.slots],
    )


# ----------------------------------------------------------------------------------------------
# Heatmaps
# ----------------------------------------------------------------------------------------------


def heatmaps_png(result: DScoreResult, n: int) -> dict[str, bytes]:
    """The feature (eq. 1) and attention (eq. 2) distributions as ``n × n`` PNG heatmaps."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out: dict[str, bytes] = {}
    panels = {
        "dscore_feature_distribution.png": ("Feature distribution f̃ (region deletion)", result.feature_distribution),
        "dscore_attention_distribution.png": ("Attention distribution ã (translation)", result.attention_distribution),
    }
    for name, (title, values) in panels.items():
        grid = np.asarray(values, dtype=np.float64).reshape(n, n)
        fig = Figure(figsize=(3.6, 3.2), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        im = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=max(float(grid.max()), 1e-12))
        for (r, c), v in np.ndenumerate(grid):
            ax.text(c, r, f"{v:.3f}", ha="center", va="center", color="w" if v < grid.max() / 2 else "k", fontsize=8)
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        out[name] = buf.getvalue()
    return out
