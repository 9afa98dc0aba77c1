"""The metamorphic relations, one registry for every kind of input (:mod:`agent.audits.modalities`).

A relation transforms the inputs of its kind and leaves the others as they are; the metamorphic audit
(:mod:`agent.audits.metamorphic`) then counts the inputs whose predicted label changed.

* ``image`` inputs: ``shift``, ``brightness``, ``contrast``, ``gaussian_noise``, ``rotation``, ``blur``,
  ``hflip``/``vflip`` (:mod:`agent.perturb.transforms`; channels-last images are turned for them);
* ``numeric`` inputs (columns, and images too): ``scale`` and ``noise``;
* ``text`` inputs, character by character, with no word list (:mod:`agent.perturb.text`): ``typos``
  (a letter swapped with the next, dropped, doubled or replaced, with probability ``strength``/4),
  ``case`` (each character's case flipped with probability ``strength``), ``whitespace`` (each gap
  widened, and white space added at either end, with probability ``strength``), ``punctuation`` (a mark
  after a word with probability ``strength``/2);
* ``category`` inputs: ``unseen_category`` (a share ``strength`` of the rows get a value never seen),
  ``category_swap`` (a share ``strength`` of the rows get *another* seen value: a sensitivity relation,
  since a label may rightly depend on the category);
* ``tokens`` (ids with an attention mask): ``token_swap`` (a share ``strength`` of the real tokens
  replaced by random ids below ``vocab``, 0 = the largest id in the data + 1), ``token_drop`` (a share
  ``strength`` of the real tokens masked out, the first kept), ``truncate`` (each sequence cut by a share
  ``strength`` of its length); the last two need the mask.

A relation configured with ``input: NAME`` (or a list) applies to those inputs only; any text input takes
the text and category relations then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from agent.audits.modalities import InputKinds
from agent.model.inputs import Inputs
from agent.model.views import channels_last
from agent.perturb.text import TEXT_TRANSFORMS, made_up_word, token_drop, token_swap, truncate
from agent.perturb.transforms import TRANSFORMS, Transform, TransformContext

__all__ = ["DEFAULT_RELATIONS", "RELATIONS", "Relation", "RelationContext", "applicable", "not_applicable"]


@dataclass(frozen=True)
class RelationContext:
    """What relations need to know about the audited data (``original``), per input: the value range of
    each image, the column spread of each numeric input (worked out when a relation first asks), the
    vocabulary of each token input; the seen values of each category are in ``kinds``."""

    kinds: InputKinds
    original: Inputs
    value_ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    vocab: Mapping[str, int] = field(default_factory=dict)
    flips_safe: bool = False
    _std: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def of(
        cls,
        batch: Inputs,
        kinds: InputKinds,
        value_range: tuple[float, float] | None = None,
        flips_safe: bool = False,
    ) -> RelationContext:
        ranges: dict[str, tuple[float, float]] = {}
        for name in kinds.mutable:
            arr = np.asarray(batch[name])
            ranges[name] = value_range if value_range is not None else (float(arr.min()), float(arr.max()))
        vocab = {t: int(np.asarray(batch[t]).max(initial=0)) + 1 for t in kinds.tokens}
        return cls(kinds, batch, ranges, vocab, flips_safe)

    def column_std(self, name: str) -> np.ndarray:
        """The standard deviation of each value of input ``name`` over the audited samples (float64)."""
        std = self._std.get(name)
        if std is None:
            std = np.asarray(self.original[name]).reshape(self.original.n, -1).std(axis=0).astype(np.float64)
            self._std[name] = std
        return std

    def transform_context(self, name: str, spread: bool = False) -> TransformContext:
        """The context of an image or table transformation of ``name`` (``spread``: with its column std)."""
        std = self.column_std(name) if spread else None
        return TransformContext(self.value_ranges.get(name, (0.0, 1.0)), std, self.flips_safe)


#: ``fn(batch, input name, rng, context, parameters)``: the batch with that input transformed.
InputFn = Callable[[Inputs, str, np.random.Generator, RelationContext, Mapping[str, float]], Inputs]


@dataclass(frozen=True)
class Relation:
    """A transformation of the inputs of one ``kind``: its function on one input, default parameters,
    whether it flips images (label-preserving only where declared), whether it needs an attention mask."""

    kind: str
    fn: InputFn
    defaults: Mapping[str, float]
    is_flip: bool = False
    needs_mask: bool = False


def _cast(out: np.ndarray, like: np.ndarray) -> np.ndarray:
    """Transformed values back in the input's dtype (integers rounded and clipped to their range)."""
    if like.dtype.kind == "f":
        return out.astype(like.dtype, copy=False)
    info = np.iinfo(like.dtype)
    return np.clip(np.rint(out), info.min, info.max).astype(like.dtype)


def _array(t: Transform) -> InputFn:
    """An image or table transformation of :mod:`agent.perturb.transforms` on one input."""

    def run(batch: Inputs, name: str, rng: np.random.Generator, ctx: RelationContext, p: Mapping[str, float]) -> Inputs:
        arr = batch[name]
        spec = ctx.kinds.signature.get(name)
        turned = t.images_only and spec is not None and channels_last(spec)
        x = np.asarray(arr, dtype=np.float64)
        if turned:
            x = x.transpose(0, 3, 1, 2)
        out = t.fn(x, rng, ctx.transform_context(name, spread=not t.images_only), p)
        if turned:
            out = out.transpose(0, 2, 3, 1)
        return batch.replace(name, np.ascontiguousarray(_cast(out, arr)))

    return run


def _text(fn: Callable[[np.ndarray, float, np.random.Generator], np.ndarray]) -> InputFn:
    def run(batch: Inputs, name: str, rng: np.random.Generator, ctx: RelationContext, p: Mapping[str, float]) -> Inputs:
        return batch.replace(name, fn(batch[name], float(p["strength"]), rng))

    return run


def _unseen(batch: Inputs, name: str, rng: np.random.Generator, ctx: RelationContext, p: Mapping[str, float]) -> Inputs:
    values = np.asarray(batch[name], dtype=object).copy()
    flat = values.reshape(-1)
    seen = set(ctx.kinds.categories.get(name, ())) | {str(v) for v in flat}
    new = f"unseen-{made_up_word(rng, 5)}"
    while new in seen:  # bounded: a made-up word of five letters rarely is a value already
        new = f"unseen-{made_up_word(rng, 6)}"
    flat[rng.random(len(flat)) < float(p["strength"])] = new
    return batch.replace(name, values)


def _swap(batch: Inputs, name: str, rng: np.random.Generator, ctx: RelationContext, p: Mapping[str, float]) -> Inputs:
    """A share of the rows get another seen value (never their own)."""
    values = np.asarray(batch[name], dtype=object).copy()
    flat = values.reshape(-1)
    pool = list(ctx.kinds.categories.get(name, ())) or sorted({str(v) for v in flat})
    if len(pool) < 2:
        return batch.replace(name, values)
    index = {v: i for i, v in enumerate(pool)}
    hit = np.flatnonzero(rng.random(len(flat)) < float(p["strength"]))
    steps = rng.integers(1, len(pool), len(hit))
    for i, step in zip(hit, steps, strict=True):
        current = index.get(str(flat[i]))
        flat[i] = pool[(current + int(step)) % len(pool)] if current is not None else pool[int(step) - 1]
    return batch.replace(name, values)


def _token_swap(
    batch: Inputs, name: str, rng: np.random.Generator, ctx: RelationContext, p: Mapping[str, float]
) -> Inputs:
    mask = ctx.kinds.masks.get(name)
    vocab = int(p["vocab"]) or ctx.vocab.get(name, 2)
    ids = batch[name]
    out = token_swap(ids, batch[mask] if mask is not None else None, float(p["strength"]), rng, vocab)
    return batch.replace(name, out.astype(ids.dtype, copy=False))


def _on_mask(fn: Callable[[np.ndarray, float, np.random.Generator], np.ndarray]) -> InputFn:
    def run(batch: Inputs, name: str, rng: np.random.Generator, ctx: RelationContext, p: Mapping[str, float]) -> Inputs:
        mask = ctx.kinds.masks.get(name)
        assert mask is not None  # checked by not_applicable()
        m = batch[mask]
        return batch.replace(mask, fn(m, float(p["strength"]), rng).astype(m.dtype, copy=False))

    return run


def _image_or_numeric(name: str, t: Transform) -> Relation:
    return Relation("image" if t.images_only else "numeric", _array(t), t.defaults, t.is_flip)


#: Every metamorphic relation by name.
RELATIONS: dict[str, Relation] = {
    **{name: _image_or_numeric(name, t) for name, t in TRANSFORMS.items()},
    "typos": Relation("text", _text(TEXT_TRANSFORMS["typos"]), {"strength": 0.2}),
    "case": Relation("text", _text(TEXT_TRANSFORMS["case"]), {"strength": 0.2}),
    "whitespace": Relation("text", _text(TEXT_TRANSFORMS["whitespace"]), {"strength": 0.5}),
    "punctuation": Relation("text", _text(TEXT_TRANSFORMS["punctuation"]), {"strength": 0.2}),
    "unseen_category": Relation("category", _unseen, {"strength": 1.0}),
    "category_swap": Relation("category", _swap, {"strength": 1.0}),
    "token_swap": Relation("tokens", _token_swap, {"strength": 0.1, "vocab": 0}),
    "token_drop": Relation("tokens", _on_mask(token_drop), {"strength": 0.1}, needs_mask=True),
    "truncate": Relation("tokens", _on_mask(truncate), {"strength": 0.2}, needs_mask=True),
}

#: Relations tested when none are configured, by kind of input.
DEFAULT_RELATIONS: dict[str, tuple[str, ...]] = {
    "image": ("shift", "brightness", "contrast", "gaussian_noise", "blur"),
    "numeric": ("scale", "noise"),
    "text": ("typos", "case", "whitespace", "punctuation"),
    "category": ("unseen_category", "category_swap"),
    "tokens": ("token_swap", "token_drop", "truncate"),
}

_NEEDS = {
    "image": "images [N, (C,) H, W]",
    "numeric": "numeric inputs",
    "text": "a free-text input",
    "category": "a categorical text input",
    "tokens": "token ids [N, L] of a dynamic length",
}


def targets(name: str, kinds: InputKinds, inputs: Sequence[str] = ()) -> tuple[str, ...]:
    """The inputs relation ``name`` transforms: ``inputs`` when named, else every input of its kind
    (image relations read images, ``scale``/``noise`` every numeric input and image)."""
    rel = RELATIONS[name]
    if inputs:
        return tuple(inputs)
    if rel.kind == "numeric":
        return kinds.mutable
    found = kinds.of_kind(rel.kind)
    if rel.needs_mask:
        found = tuple(t for t in found if kinds.masks.get(t) is not None)
    return found


def not_applicable(name: str, kinds: InputKinds, inputs: Sequence[str] = ()) -> str | None:
    """Why relation ``name`` cannot run on a model of ``kinds`` (``None`` when it can); ``inputs``: the
    inputs it was configured for."""
    rel = RELATIONS[name]
    if inputs:
        for i in inputs:
            have = kinds.kind_of(i)
            if have is None:
                return f"{name}: no input {i!r} it could transform (inputs: {kinds.describe()})"
            fits = (
                have == rel.kind
                or (rel.kind == "numeric" and have == "image")
                or ({rel.kind, have} <= {"text", "category"})
            )
            if not fits or (rel.needs_mask and kinds.masks.get(i) is None):
                return f"{name} transforms {_NEEDS[rel.kind]}; input {i!r} is {have}"
        return None
    if targets(name, kinds):
        return None
    need = _NEEDS[rel.kind] + (" with an attention mask" if rel.needs_mask else "")
    return f"{name} needs {need}; the model's inputs are {kinds.describe()}"


def applicable(kinds: InputKinds, flips_safe: bool = False) -> list[str]:
    """The relations that can run on a model of ``kinds`` (flips only when declared safe)."""
    return [n for n, r in RELATIONS.items() if (flips_safe or not r.is_flip) and not_applicable(n, kinds) is None]


def default_relations(kinds: InputKinds) -> list[str]:
    """The relations tested when none are configured: the defaults of every kind of input the model has
    (``scale``/``noise`` only for numeric columns, not for images alone)."""
    out: list[str] = []
    for kind in kinds.present:
        out += [n for n in DEFAULT_RELATIONS[kind] if not_applicable(n, kinds) is None and n not in out]
    return out
