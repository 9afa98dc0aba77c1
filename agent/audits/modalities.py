"""What kind of data each input of a model holds, as the audits see it, and which audits apply.

An audit perturbs inputs the way their kind allows: pixels are shifted and blurred, numbers scaled or
mutated digit by digit, text gets typos, a category is replaced, token sequences lose tokens. The kind of
an input follows from the model's signature (:mod:`agent.model.views`), and for text from the data:

* ``image`` — a numeric input of two or three dimensions per sample (``[C, H, W]``, ``[H, W, C]``,
  ``[H, W]``);
* ``numeric`` — any other numeric input of a fixed shape (a table's columns, one input per column or one
  ``[N, D]`` tensor);
* ``tokens`` — integer ids of a dynamic length (``[N, L]``), with the attention mask that goes with them
  (a ``mask`` input is read with its tokens, never perturbed on its own);
* ``category`` — a text input whose values repeat: one the model's feature view one-hot encodes, or, in
  the audited data, at most :data:`~agent.model.views.MAX_CATEGORIES` distinct values, each seen twice
  on average;
* ``text`` — any other text input (free text).

D-Score needs a convolutional image model; data mutation (DEC/IMP/SGN/DIG) changes numbers, so it mutates
the image and numeric inputs and skips the others; metamorphic relations exist for every kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from agent.model.inputs import Inputs, Signature
from agent.model.views import MAX_CATEGORIES, attention_mask_of, is_image, is_token_ids

if TYPE_CHECKING:
    from agent.model.views import FeatureView

__all__ = ["KINDS", "InputKinds", "input_kinds"]

#: The kinds of inputs, in the order they are listed.
KINDS: tuple[str, ...] = ("image", "numeric", "text", "category", "tokens")


@dataclass(frozen=True)
class InputKinds:
    """The inputs of a model by kind (see the module docstring). ``categories``: the values of each
    categorical input (the view's, else those of the audited data, most frequent first); ``masks``: the
    attention mask of each token input (``None`` without one)."""

    signature: Signature
    images: tuple[str, ...] = ()
    numeric: tuple[str, ...] = ()
    text: tuple[str, ...] = ()
    categories: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    tokens: tuple[str, ...] = ()
    masks: Mapping[str, str | None] = field(default_factory=dict)
    #: numeric inputs of dynamic dimensions that are not token ids (no audit perturbs them)
    other: tuple[str, ...] = ()

    def of_kind(self, kind: str) -> tuple[str, ...]:
        """The inputs of ``kind`` (one of :data:`KINDS`)."""
        if kind == "image":
            return self.images
        if kind == "numeric":
            return self.numeric
        if kind == "text":
            return self.text
        if kind == "category":
            return tuple(self.categories)
        if kind == "tokens":
            return self.tokens
        raise ValueError(f"unknown input kind {kind!r}")

    def kind_of(self, name: str) -> str | None:
        """The kind of input ``name`` (``None`` for an attention mask or an unknown name)."""
        return next((k for k in KINDS if name in self.of_kind(k)), None)

    @property
    def present(self) -> list[str]:
        """The kinds the model has inputs of."""
        return [k for k in KINDS if self.of_kind(k)]

    @property
    def mutable(self) -> tuple[str, ...]:
        """The inputs data mutation changes: images and numeric columns."""
        return self.images + self.numeric

    @property
    def not_mutable(self) -> dict[str, str]:
        """The inputs data mutation skips, with their kind (token masks under their token input's)."""
        out = {n: k for k in ("text", "category", "tokens") for n in self.of_kind(k)}
        for mask in self.masks.values():
            if mask is not None:
                out[mask] = "tokens"
        out.update({n: "other" for n in self.other})
        return out

    def describe(self) -> str:
        """``"numeric inputs 'age', 'income'; categorical input 'city'"``: the inputs by kind, for messages."""
        parts = []
        for kind in self.present:
            names = self.of_kind(kind)
            label = _LABELS[kind] + ("s" if len(names) > 1 else "")
            parts.append(f"{label} {', '.join(repr(n) for n in names)}")
        if self.other:
            parts.append(f"other input{'s' if len(self.other) > 1 else ''} {', '.join(repr(n) for n in self.other)}")
        return "; ".join(parts) or "no inputs"


_LABELS = {
    "image": "image input",
    "numeric": "numeric input",
    "text": "text input",
    "category": "categorical input",
    "tokens": "token input",
}


def _categorical(values: np.ndarray) -> tuple[str, ...] | None:
    """The values of a text column, most frequent first, when they repeat like categories; else None."""
    flat = np.asarray(values, dtype=object).reshape(len(values), -1)[:, 0].astype(str)
    if len(flat) == 0:
        return None
    uniq, counts = np.unique(flat, return_counts=True)
    if len(uniq) > MAX_CATEGORIES or 2 * len(uniq) > len(flat):
        return None
    return tuple(str(u) for u in uniq[np.argsort(-counts, kind="stable")])


def input_kinds(signature: Signature, data: Inputs | None = None, view: FeatureView | None = None) -> InputKinds:
    """The inputs of ``signature`` by kind. A text input is a category when ``view`` one-hot encodes it
    (with the categories seen at ``fit``) or when its values in ``data`` repeat; without either, text."""
    onehot = {v.name: tuple(v.categories) for v in (view.inputs if view is not None else ()) if v.encoding == "onehot"}
    masks = {s.name: attention_mask_of(signature, s) for s in signature.inputs if is_token_ids(s)}
    mask_names = {m for m in masks.values() if m is not None}
    images: list[str] = []
    numeric: list[str] = []
    text: list[str] = []
    categories: dict[str, tuple[str, ...]] = {}
    tokens: list[str] = []
    other: list[str] = []
    for spec in signature.inputs:
        name = spec.name
        if name in mask_names:
            continue
        if spec.is_string:
            seen = onehot.get(name)
            if seen is None and data is not None and name in data:
                seen = _categorical(data[name])
            if seen:
                categories[name] = seen
            else:
                text.append(name)
        elif is_token_ids(spec):
            tokens.append(name)
        elif is_image(spec):
            images.append(name)
        elif spec.fixed:
            numeric.append(name)
        else:
            other.append(name)
    return InputKinds(
        signature,
        tuple(images),
        tuple(numeric),
        tuple(text),
        categories,
        tuple(tokens),
        {t: masks[t] for t in tokens},
        tuple(other),
    )
