"""Regions and translation of D-Score (paper §IV-A "Image Transformation", Fig. 4): region bounds
on an ``n × n`` grid, pad-and-resize translation towards a region, and the random padding split of
the augmentation (eq. 8). Region indices are 0-based (the paper counts from 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agent.audits.dscore.scores import DScoreResult
from agent.audits.report import AuditError


def region_bounds(region: int, n: int, height: int, width: int) -> tuple[int, int, int, int]:
    """Rows ``[r0, r1)`` and columns ``[c0, c1)`` of 0-based ``region`` of an ``n × n`` grid.

    Boundaries are ``floor(i·H/n)``; regions are numbered row-major from the upper-left corner.
    """
    if not 0 <= region < n * n:
        raise AuditError(f"region {region} is outside 0..{n * n - 1}")
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
        raise AuditError(f"t must be positive, got {t}")
    if not 0 <= region < n * n:
        raise AuditError(f"region {region} is outside 0..{n * n - 1}")
    r, c = divmod(region, n)
    u_h = _round_half_up(height / t)
    u_w = _round_half_up(width / t)
    if u_h == 0 and u_w == 0 and n > 1:
        raise AuditError(f"t={t} is too large for {height}×{width} images: the padding unit rounds to 0 pixels")
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
class PadResize:
    """Zero-pad then bilinear-resize back, folded into two matrices: ``Rh @ x @ Rw.T``.

    Padding with zeros and resizing is linear, so ``resize(pad(x))`` equals the resize matrix of the
    padded size restricted to the columns of the original pixels; no padded array is built.
    """

    rh: np.ndarray
    rw: np.ndarray

    @classmethod
    def build(cls, height: int, width: int, top: int, bottom: int, left: int, right: int) -> PadResize:
        rh = _resize_matrix(height + top + bottom, height)[:, top : top + height]
        rw = _resize_matrix(width + left + right, width)[:, left : left + width]
        return cls(rh.astype(np.float32), rw.astype(np.float32))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (self.rh @ np.asarray(x, dtype=np.float32) @ self.rw.T).astype(x.dtype, copy=False)


def pad_resize(x: np.ndarray, top: int, bottom: int, left: int, right: int) -> np.ndarray:
    """Zero-pad the last two axes of ``x`` and resize back to the original size (bilinear)."""
    h, w = x.shape[-2], x.shape[-1]
    return PadResize.build(h, w, top, bottom, left, right)(x)


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
