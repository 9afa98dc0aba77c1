"""The D-Score audit run (paper §IV-§V): evaluate the base model, the ``n²`` region-deleted
variants and the translated inputs batch by batch, score them (eqs. 1-7) and draw the heatmaps."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.audits.dscore.masking import MaskedModel, bake_masks, insert_region_masks
from agent.audits.dscore.scores import DScoreResult, score
from agent.audits.dscore.translation import PadResize, translation_padding
from agent.audits.report import AuditError, AuditResult, ProgressFn
from invariants.onnx_session import OnnxSession


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
            raise AuditError(f"output {output_name!r} is not an output of the model ({', '.join(names)})")
        return output_name
    floats = [o for o in session.outputs if o.dtype.kind == "f" and len(o.shape) == 2]
    if len(floats) == 1:
        return floats[0].name
    by_name = {o.name: o for o in floats}
    if "probabilities" in by_name:
        return "probabilities"
    raise AuditError(f"cannot tell which output holds the class scores ({', '.join(names)}); set output_name")


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
        raise AuditError(f"D-Score needs images [N, C, H, W], got shape {list(x.shape)}")
    if len(x) == 0:
        raise AuditError("no samples to score")
    if y is not None and len(y) != len(x):
        raise AuditError(f"{len(x)} samples but {len(y)} labels")
    h, w = x.shape[2], x.shape[3]
    n2 = n * n
    shifters = [PadResize.build(h, w, *translation_padding(i, n, t, h, w)) for i in range(n2)]
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
        raise AuditError(f"n must be >= 1, got {n}")
    if t <= 0:
        raise AuditError(f"t must be positive, got {t}")
    if batch_size < 1:
        raise AuditError(f"batch_size must be >= 1, got {batch_size}")


def _single_session(model_bytes: bytes, masked: MaskedModel, n: int, output_name: str | None) -> RunFn:
    """One onnxruntime session on the masked graph: the masks are inputs, all ones for the base model."""
    session = OnnxSession(masked.model_bytes)
    out = _pick_output(session, output_name)
    dtype = next(i.dtype for i in session.inputs if i.name == masked.input_name)
    ones = masked.masks(n, None)
    variants = [masked.masks(n, i) for i in range(n * n)]

    def run(xb: np.ndarray, region: int | None) -> np.ndarray:
        feeds = dict(ones if region is None else variants[region])
        feeds[masked.input_name] = np.ascontiguousarray(xb, dtype=dtype)
        return session.run(feeds, [out])[0]

    return run


def _separate_sessions(model_bytes: bytes, masked: MaskedModel, n: int, output_name: str | None) -> RunFn:
    """The slow baseline: ``n²`` separately built variant models, one session each, plus the unmodified
    model for the base and translated passes."""
    base = OnnxSession(model_bytes)
    out = _pick_output(base, output_name)
    in_name = masked.input_name
    dtype = next(i.dtype for i in base.inputs if i.name == in_name)
    sessions = [OnnxSession(bake_masks(masked, masked.masks(n, i))) for i in range(n * n)]

    def run(xb: np.ndarray, region: int | None) -> np.ndarray:
        sess = base if region is None else sessions[region]
        return sess.run({in_name: np.ascontiguousarray(xb, dtype=dtype)}, [out])[0]

    return run


#: How a run evaluates the model and its ``n²`` variants, by the name recorded as the audit's ``mode``.
MODES: dict[str, Callable[[bytes, MaskedModel, int, str | None], RunFn]] = {
    "single_session": _single_session,
    "separate_sessions": _separate_sessions,
}


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
    mode: str = "single_session",
) -> DScoreAudit:
    """D-Score of an ONNX CNN on images ``x`` ``[N, C, H, W]`` (labels ``y`` optional).

    By default (``mode="single_session"``) one onnxruntime session on the masked graph serves the base
    model, the ``n²`` variants and the ``n²`` translated test sets: ``2n² + 1`` forward passes over the
    data in total; ``mode="separate_sessions"`` is the slow baseline of :data:`MODES`, with the same
    results. ``scores_are_logits`` is recorded (``None`` = detected from the first batch); accuracies use
    the arg-max, which softmax does not change.
    """
    _check_args(n, t, batch_size)
    if mode not in MODES:
        raise AuditError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    started = time.perf_counter()
    masked = insert_region_masks(model_bytes, input_hw=input_hw)
    run = MODES[mode](model_bytes, masked, n, output_name)
    base, variants, translated, n_classes, logits = _evaluate(
        run, x, y, n=n, t=t, batch_size=batch_size, scores_are_logits=scores_are_logits, progress=progress
    )
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
        result=score(base, variants, translated, n_classes),
        seconds=time.perf_counter() - started,
        mode=mode,
        conv_maps=[{"conv": m.conv, "height": m.height, "width": m.width} for m in masked.slots],
    )


def heatmaps_png(result: DScoreResult, n: int) -> dict[str, bytes]:
    """The feature (eq. 1) and attention (eq. 2) distributions as ``n × n`` PNG heatmaps."""
    # matplotlib stays out of start-up until heatmaps are drawn
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
