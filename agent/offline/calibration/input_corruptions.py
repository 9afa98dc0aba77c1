"""The corruptions of models whose inputs are not one numeric tensor: several named inputs, text,
categories, token ids (used by ``icos-agent fit``; one numeric tensor is corrupted as a whole by
:mod:`agent.offline.calibration.corruptions`).

As for images and tables, the calibration split is copied and each copy corrupted with one transformation
at one strength, from harmless to label-breaking (:func:`agent.offline.calibration.sets.input_calibration_sets`);
the ``shift_aware`` estimator then learns how accuracy moves with the window statistics over these copies
(:func:`~agent.offline.calibration.estimators.shift_fitting.fit_shift_calibration`). The transformations follow each
input's kind:

* numeric columns (a table's inputs, ``[N, 1]`` or ``[N, D]``): the table corruptions of
  :mod:`agent.offline.calibration.corruptions` on all of them together (generic and audit families);
* images: the image corruptions, input by input;
* free text: :data:`agent.perturb.text.TEXT_TRANSFORMS` (typos, case, white space, punctuation, dropped and
  shuffled words, drifted vocabulary);
* categories (text the view one-hot encodes): an unseen category, a swap to another seen one;
* token ids: random ids, dropped tokens, truncation (on the attention mask).

Set names are ``<input kind>:<transformation>``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from agent.model.classifier import OnnxClassifier
from agent.model.inputs import Inputs
from agent.model.views import is_image, is_token_ids
from agent.offline.calibration.corruptions import (
    as_nchw,
    audit_image_corruptions,
    audit_table_corruptions,
    image_corruptions,
    tabular_corruptions,
)
from agent.perturb.text import TEXT_TRANSFORMS, category_swap, token_drop, token_swap, truncate, unseen_category

#: A corruption of a batch of inputs at a strength in [0, 1].
InputCorruption = Callable[[Inputs, float, np.random.Generator], Inputs]


def _table_corruption(names: list[str], fn: Callable[..., np.ndarray]) -> InputCorruption:
    def run(x: Inputs, s: float, rng: np.random.Generator) -> Inputs:
        parts = [np.asarray(x[n], dtype=np.float64).reshape(x.n, -1) for n in names]
        widths = [p.shape[1] for p in parts]
        out = fn(np.concatenate(parts, axis=1), s, rng)
        result = x
        start = 0
        for n, w in zip(names, widths, strict=True):
            col = out[:, start : start + w].reshape(x[n].shape).astype(x[n].dtype, copy=False)
            result = result.replace(n, col)
            start += w
        return result

    return run


def _image_corruption(name: str, fn: Callable[..., np.ndarray], clip: tuple[float, float]) -> InputCorruption:
    def run(x: Inputs, s: float, rng: np.random.Generator) -> Inputs:
        arr = x[name]
        img = as_nchw(np.asarray(arr, dtype=np.float64))
        out = np.clip(fn(img, s, rng), *clip).reshape(arr.shape)
        return x.replace(name, out.astype(arr.dtype, copy=False))

    return run


def _text_corruption(name: str, fn: Callable[[np.ndarray, float, np.random.Generator], np.ndarray]) -> InputCorruption:
    def run(x: Inputs, s: float, rng: np.random.Generator) -> Inputs:
        return x.replace(name, fn(x[name], s, rng))

    return run


def _swap_corruption(name: str, seen: Sequence[str]) -> InputCorruption:
    def run(x: Inputs, s: float, rng: np.random.Generator) -> Inputs:
        return x.replace(name, category_swap(x[name], s, rng, seen))

    return run


def _token_corruption(ids: str, mask: str | None, kind: str, vocab: int) -> InputCorruption:
    def run(x: Inputs, s: float, rng: np.random.Generator) -> Inputs:
        if kind == "token_swap":
            return x.replace(ids, token_swap(x[ids], x[mask] if mask is not None else None, s, rng, vocab))
        if mask is None:
            return x
        m = x[mask]
        new = token_drop(m, s, rng) if kind == "token_drop" else truncate(m, s, rng)
        return x.replace(mask, new.astype(m.dtype, copy=False))

    return run


def input_corruptions(
    model: OnnxClassifier, train: Inputs, families: Sequence[str] = ("generic", "audit")
) -> dict[str, InputCorruption]:
    """The corruptions that apply to ``model``'s inputs, by set name (see the module docstring)."""
    sig, view = model.signature, model.view
    categories = {v.name: v.categories for v in view.inputs if v.encoding == "onehot"}
    masks = {v.mask for v in view.inputs if v.encoding == "tokens" and v.mask}
    out: dict[str, InputCorruption] = {}
    numeric = [s.name for s in sig.inputs if not s.is_string and s.fixed and not is_image(s) and s.name not in masks]
    if numeric:
        flat = np.concatenate([np.asarray(train[n], dtype=np.float64).reshape(train.n, -1) for n in numeric], axis=1)
        std = flat.std(axis=0) + 1e-12
        table: dict[str, Callable[..., np.ndarray]] = {}
        if "generic" in families:
            table.update(tabular_corruptions(flat.mean(axis=0), std))
        if "audit" in families:
            table.update(audit_table_corruptions(std))
        out.update({f"table:{k}": _table_corruption(numeric, fn) for k, fn in table.items()})
    for spec in sig.inputs:
        name = spec.name
        if is_image(spec) and spec.fixed and name not in masks:
            arr = np.asarray(train[name], dtype=np.float32)
            top, lo = float(max(arr.max(), 1e-6)), float(min(arr.min(), 0.0))
            images: dict[str, Callable[..., np.ndarray]] = {}
            if "generic" in families:
                images.update(image_corruptions(top))
            if "audit" in families:
                images.update(audit_image_corruptions(lo, top))
            out.update({f"{name}:{k}": _image_corruption(name, fn, (lo, top)) for k, fn in images.items()})
        elif spec.is_string and name in categories:
            out[f"{name}:unseen_category"] = _text_corruption(name, unseen_category)
            out[f"{name}:category_swap"] = _swap_corruption(name, categories[name])
        elif spec.is_string:
            out.update({f"{name}:{k}": _text_corruption(name, fn) for k, fn in TEXT_TRANSFORMS.items()})
        elif is_token_ids(spec) and name not in masks:
            mask = next((v.mask for v in view.inputs if v.name == name and v.encoding == "tokens"), None)
            vocab = int(np.asarray(train[name]).max()) + 1
            for kind in ("token_swap", "token_drop", "truncate"):
                out[f"{name}:{kind}"] = _token_corruption(name, mask, kind, vocab)
    return out
