"""The feature view: what the invariants and the estimators read of each sample, chosen at ``fit`` from the
model's signature, recorded in the bundle and computed the same way at serve time.

A TDI tree over 150,528 raw pixels of a 224×224 image never finishes, and a string or a token id is not a
number a tree can split; so each input is *viewed*:

* ``raw`` — numeric inputs as they are (flattened): tables, and images small enough that their pixel rules
  read as heatmaps (MNIST's 784 pixels). Text columns: one-hot over the categories seen at ``fit`` (at most
  :data:`MAX_CATEGORIES`, the rest in one ``other`` column) when they are categorical, else hashed
  character n-grams. Token ids: a hashed bag of ids (padding masked out) and the sequence length.
* ``pooled`` — images area-averaged to at most :data:`POOL_SIDE` × :data:`POOL_SIDE` per channel.
* ``embedding[:TENSOR]`` — the model's own penultimate representation: the input of the last dense layer
  before the scores (found in the graph, or the tensor named), fetched as an extra output of the same
  session run, so it costs no second pass.
* ``hashed`` — text and token inputs as hashed bags (no vocabulary kept), numbers raw.

A view wider than :data:`MAX_WIDTH` (a raw one: than :data:`RAW_MAX_VALUES`) is reduced by a sparse
random projection (Achlioptas, 2003) whose ±1
entries are a fixed hash of (row, column, seed): reproducible anywhere without storing the matrix. Every
column has a name (``x[3]``, ``color=red``, ``pool[0,2,5]``, ``emb[17]``, ``proj[4]``), so TDI rules say
what they split: only ``raw`` rules are about the inputs themselves.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.errors import UserError
from agent.model.inputs import Inputs, InputSpec, Signature

#: Widest view the trees are grown on; wider ones are projected to this many columns.
MAX_WIDTH = 256
#: A numeric input with at most this many values per sample is kept raw by default.
RAW_MAX_VALUES = 4096
#: Pooled images are at most this many cells a side (per channel).
POOL_SIDE = 8
#: Text columns with at most this many distinct values at ``fit`` are categorical (one-hot).
MAX_CATEGORIES = 32
#: Columns of a hashed bag (text n-grams, token ids).
HASH_WIDTH = 64
#: Character n-gram lengths of hashed text.
NGRAMS = (2, 3)
VIEW_KINDS = ("raw", "pooled", "embedding", "hashed")


class ViewError(UserError, ValueError):
    """A view that cannot be built for this model (e.g. no dense layer to take an embedding from)."""


# -- per-input encoders ------------------------------------------------------------------------------------


def _stable_hash(text: str, seed: int = 0) -> int:
    return zlib.crc32(text.encode("utf-8", "surrogatepass"), seed)


#: Each n-gram's bin, by width: live text repeats its n-grams, so each is hashed once (emptied past
#: :data:`MAX_CACHED_GRAMS`; a lost entry is only hashed again).
_GRAM_BINS: dict[int, dict[str, int]] = {}
MAX_CACHED_GRAMS = 1 << 16


def hashed_text(values: np.ndarray, width: int = HASH_WIDTH) -> np.ndarray:
    """Character n-grams of each text hashed into ``width`` counts, L2-normalised, plus nothing else: the
    length is its own column (:func:`_encode`). The counts of the whole batch are added in one
    ``bincount``, not one array element at a time."""
    flat = [str(v) for v in np.asarray(values, dtype=object).reshape(len(values), -1)[:, 0]]
    bins = _GRAM_BINS.setdefault(width, {})
    if len(bins) > MAX_CACHED_GRAMS:
        bins.clear()
    cells: list[int] = []  # row * width + bin, one per n-gram
    for i, text in enumerate(flat):
        t = f" {text.lower()} "
        row = i * width
        for gram in [t[j : j + n] for n in NGRAMS for j in range(len(t) - n + 1)]:
            b = bins.get(gram)
            if b is None:
                b = bins[gram] = _stable_hash(gram) % width
            cells.append(row + b)
    counts = np.bincount(np.asarray(cells, dtype=np.int64), minlength=len(flat) * width)
    out = counts.astype(np.float32).reshape(len(flat), width)
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norm, out=out, where=norm > 0)
    return out


def hashed_tokens(ids: np.ndarray, mask: np.ndarray | None, width: int = HASH_WIDTH) -> np.ndarray:
    """A bag of token ids hashed into ``width`` shares (padding, where ``mask`` is 0, left out)."""
    a = np.asarray(ids, dtype=np.int64).reshape(len(ids), -1)
    m = np.ones_like(a, dtype=bool) if mask is None else np.asarray(mask).reshape(a.shape) != 0
    bins = (a * 2654435761 % (1 << 32)) % width
    cells = (np.arange(len(a))[:, None] * width + bins)[m]  # row-major cell of every kept token
    out = np.bincount(cells, minlength=len(a) * width).astype(np.float32).reshape(len(a), width)
    total = out.sum(axis=1, keepdims=True)
    np.divide(out, total, out=out, where=total > 0)
    return out


def pooled_image(x: np.ndarray, channels_last: bool, side: int = POOL_SIDE) -> np.ndarray:
    """Images ``[N, C, H, W]`` (or ``[N, H, W, C]``, or ``[N, H, W]``) area-averaged to at most ``side`` ×
    ``side`` cells per channel, flattened channel by channel."""
    a = np.asarray(x, dtype=np.float32)
    if a.ndim == 3:
        a = a[:, None]
    elif channels_last:
        a = a.transpose(0, 3, 1, 2)
    n, c, h, w = a.shape
    sh, sw = min(side, h), min(side, w)
    # cell boundaries that cover every pixel once (uneven cells when the side does not divide)
    ys = np.linspace(0, h, sh + 1).round().astype(int)
    xs = np.linspace(0, w, sw + 1).round().astype(int)
    rows = np.add.reduceat(a, ys[:-1], axis=2) / np.diff(ys)[None, None, :, None]
    cells = np.add.reduceat(rows, xs[:-1], axis=3) / np.diff(xs)[None, None, None, :]
    return cells.reshape(n, c * sh * sw)


def project(x: np.ndarray, width: int, seed: int) -> np.ndarray:
    """A sparse random projection of ``[N, D]`` to ``[N, width]``: entries ±√3 with probability 1/6 each,
    0 otherwise (Achlioptas, 2003), scaled by 1/√width, from a fixed hash of (row, column, seed)."""
    d = x.shape[1]
    j = np.arange(d, dtype=np.uint64)[:, None]
    k = np.arange(width, dtype=np.uint64)[None, :]
    h = (j * np.uint64(0x9E3779B97F4A7C15) + k * np.uint64(0xBF58476D1CE4E5B9) + np.uint64(seed)) & np.uint64(
        0xFFFFFFFF
    )
    h = (h ^ (h >> np.uint64(15))) * np.uint64(0x2C1B3C6D) & np.uint64(0xFFFFFFFF)
    r = (h % np.uint64(6)).astype(np.int64)
    m = np.where(r == 0, 1.0, np.where(r == 1, -1.0, 0.0)).astype(np.float32) * np.float32(np.sqrt(3.0 / width))
    return np.asarray(x, dtype=np.float32) @ m


# -- the view ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputView:
    """How one input is encoded: ``raw``, ``onehot`` (with its categories), ``text`` (hashed n-grams),
    ``tokens`` (hashed ids, with the mask input's name), ``pooled`` (with the channel layout) or ``skip``
    (an attention mask, read by its token input)."""

    name: str
    encoding: str
    categories: tuple[str, ...] = ()
    mask: str | None = None
    channels_last: bool = False

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "encoding": self.encoding}
        if self.categories:
            d["categories"] = list(self.categories)
        if self.mask is not None:
            d["mask"] = self.mask
        if self.channels_last:
            d["channels_last"] = True
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> InputView:
        return cls(
            str(d["name"]),
            str(d["encoding"]),
            tuple(str(c) for c in d.get("categories", ())),
            d.get("mask"),
            bool(d.get("channels_last", False)),
        )


@dataclass(frozen=True)
class FeatureView:
    """What the invariants read of a sample (see the module docstring). ``embedding``: the graph tensor
    whose values are the view (the other inputs' encodings are then not used); ``projected``: the width
    the view is projected to (0: not projected)."""

    kind: str
    inputs: tuple[InputView, ...] = ()
    embedding: str | None = None
    projected: int = 0
    seed: int = 0
    width: int = 0
    names: tuple[str, ...] = field(default=(), repr=False)
    why: str = ""

    @property
    def extra_outputs(self) -> tuple[str, ...]:
        """Graph tensors the model must also output for this view."""
        return (self.embedding,) if self.embedding is not None else ()

    def features(self, batch: Inputs, extra: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """The view of a prepared batch, float32 ``[N, width]`` (``extra``: the model's extra outputs)."""
        if self.embedding is not None:
            if extra is None or self.embedding not in extra:
                raise ViewError(f"the view needs the model's tensor {self.embedding!r}")
            full = np.asarray(extra[self.embedding], dtype=np.float32).reshape(batch.n, -1)
        else:
            full = self._encode(batch)
        if self.projected:
            return project(full, self.projected, self.seed)
        return full

    def _encode(self, batch: Inputs) -> np.ndarray:
        parts = [_encode(v, batch) for v in self.inputs if v.encoding != "skip"]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts, axis=1) if parts else np.zeros((batch.n, 0), dtype=np.float32)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "inputs": [v.to_dict() for v in self.inputs], "width": self.width}
        if self.embedding is not None:
            d["embedding"] = self.embedding
        if self.projected:
            d["projected"] = self.projected
            d["seed"] = self.seed
        if self.why:
            d["why"] = self.why
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], names: Sequence[str] = ()) -> FeatureView:
        kind = str(d["kind"])
        if kind not in VIEW_KINDS:
            raise ViewError(f"unknown feature view {kind!r} (one of {', '.join(VIEW_KINDS)})")
        return cls(
            kind,
            tuple(InputView.from_dict(v) for v in d.get("inputs", ())),
            d.get("embedding"),
            int(d.get("projected", 0)),
            int(d.get("seed", 0)),
            int(d.get("width", 0)),
            tuple(names),
            str(d.get("why", "")),
        )


@functools.lru_cache(maxsize=256)
def _category_index(categories: tuple[str, ...]) -> dict[str, int]:
    """Each category's column, built once per view rather than once per batch (read only)."""
    return {c: i for i, c in enumerate(categories)}


def _encode(v: InputView, batch: Inputs) -> np.ndarray:
    x = batch[v.name]
    n = batch.n
    if v.encoding == "raw":
        return np.asarray(x, dtype=np.float32).reshape(n, -1)
    if v.encoding == "pooled":
        return pooled_image(x, v.channels_last)
    if v.encoding == "onehot":
        values = np.asarray(x, dtype=object).reshape(n, -1)[:, 0]
        index, other = _category_index(v.categories), len(v.categories)
        out = np.zeros((n, other + 1), dtype=np.float32)
        out[np.arange(n), [index.get(str(s), other) for s in values]] = 1.0
        return out
    if v.encoding == "text":
        lengths = np.array([len(str(s)) for s in np.asarray(x, dtype=object).reshape(n, -1)[:, 0]], np.float32)
        return np.concatenate([hashed_text(x), np.log1p(lengths)[:, None]], axis=1)
    if v.encoding == "tokens":
        mask = batch[v.mask] if v.mask is not None and v.mask in batch else None
        ids = np.asarray(x).reshape(n, -1)
        length = (np.asarray(mask).reshape(n, -1) != 0).sum(axis=1) if mask is not None else np.full(n, ids.shape[1])
        return np.concatenate([hashed_tokens(ids, mask), np.log1p(length.astype(np.float32))[:, None]], axis=1)
    raise ViewError(f"unknown input encoding {v.encoding!r}")


def _encoding_names(v: InputView, spec: InputSpec, width: int) -> list[str]:
    if v.encoding == "raw":
        return [v.name] if width == 1 else [f"{v.name}[{i}]" for i in range(width)]
    if v.encoding == "onehot":
        return [f"{v.name}={c}" for c in v.categories] + [f"{v.name}=(other)"]
    if v.encoding in ("text", "tokens"):
        return [f"{v.name}:hash[{i}]" for i in range(width - 1)] + [f"{v.name}:log_length"]
    if v.encoding == "pooled":
        return [f"{v.name}:pool[{i}]" for i in range(width)]
    return []


def is_image(spec: InputSpec) -> bool:
    """A numeric input with two or three dimensions per sample: an image (``[C, H, W]``, ``[H, W, C]`` or
    ``[H, W]``)."""
    return not spec.is_string and len(spec.shape) in (2, 3) and spec.dtype.kind in "fiu"


def channels_last(spec: InputSpec) -> bool:
    """``[H, W, C]`` rather than ``[C, H, W]``: a last dimension of 1, 3 or 4 after two larger ones."""
    s = spec.shape
    return len(s) == 3 and s[-1] in (1, 3, 4) and (s[0] is None or s[0] > 4)


def is_token_ids(spec: InputSpec) -> bool:
    return not spec.is_string and spec.dtype.kind in "iu" and len(spec.shape) == 1 and spec.shape[0] is None


def attention_mask_of(signature: Signature, tokens: InputSpec) -> str | None:
    """The mask input that goes with a token-id input (named like ``attention_mask``)."""
    for s in signature.inputs:
        if s is not tokens and "mask" in s.name.lower() and s.shape == tokens.shape:
            return s.name
    return None


# -- building a view -------------------------------------------------------------------------------------------


def input_width(v: InputView, spec: InputSpec) -> int:
    """Columns of the view that input ``spec`` encoded as ``v`` takes."""
    if v.encoding == "raw":
        return spec.size or 0
    if v.encoding == "pooled":
        s = [POOL_SIDE if d is None else int(d) for d in spec.shape]
        if len(s) == 2:
            c, h, w = 1, s[0], s[1]
        elif v.channels_last:
            h, w, c = s[0], s[1], s[2]
        else:
            c, h, w = s[0], s[1], s[2]
        return c * min(POOL_SIDE, h) * min(POOL_SIDE, w)
    if v.encoding == "onehot":
        return len(v.categories) + 1
    if v.encoding in ("text", "tokens"):
        return HASH_WIDTH + 1
    return 0


def encode_inputs(
    kind: str, signature: Signature, categories: Mapping[str, Sequence[str]] | None = None
) -> list[InputView]:
    """How each input is encoded in a view of ``kind`` (``raw``, ``pooled`` or ``hashed``); ``categories``:
    the values seen at ``fit`` of the text inputs that are categorical."""
    cats = categories or {}
    masks = {attention_mask_of(signature, s) for s in signature.inputs if is_token_ids(s)} - {None}
    out: list[InputView] = []
    for spec in signature.inputs:
        if spec.name in masks:
            out.append(InputView(spec.name, "skip"))
        elif spec.is_string:
            if kind != "hashed" and spec.name in cats:
                out.append(InputView(spec.name, "onehot", tuple(cats[spec.name])))
            else:
                out.append(InputView(spec.name, "text"))
        elif is_token_ids(spec):
            out.append(InputView(spec.name, "tokens", mask=attention_mask_of(signature, spec)))
        elif not spec.fixed:
            raise ViewError(f"input {spec.name!r} has dynamic dimensions {list(spec.shape)}: no raw view of it")
        elif is_image(spec) and (kind == "pooled" or (spec.size or 0) > RAW_MAX_VALUES):
            out.append(InputView(spec.name, "pooled", channels_last=channels_last(spec)))
        else:
            out.append(InputView(spec.name, "raw"))
    return out


def make_view(
    kind: str,
    signature: Signature,
    *,
    inputs: Sequence[InputView] = (),
    embedding: str | None = None,
    embedding_width: int = 0,
    seed: int = 0,
    why: str = "",
    raw_names: Sequence[str] | None = None,
) -> FeatureView:
    """A view with its width and column names worked out (projected when wider than :data:`MAX_WIDTH`).
    ``raw_names``: the names of a single raw input's columns (a table's feature names)."""
    if embedding is not None:
        width, names = embedding_width, [f"emb[{i}]" for i in range(embedding_width)]
        inputs = ()
    else:
        names = []
        width = 0
        for v in inputs:
            spec = signature.get(v.name)
            assert spec is not None
            w = input_width(v, spec)
            width += w
            if v.encoding == "raw" and len(inputs) == 1:
                # a single raw input keeps the names it came with (a table's columns); images read as x[i]
                names += list(raw_names) if raw_names is not None and len(raw_names) == w else []
            else:
                names += _encoding_names(v, spec, w)
    # raw views keep their columns up to RAW_MAX_VALUES (pixel rules of an MNIST-sized image); others are
    # projected past MAX_WIDTH
    projected = MAX_WIDTH if width > (RAW_MAX_VALUES if kind == "raw" else MAX_WIDTH) else 0
    if projected:
        names = [f"proj[{i}]" for i in range(projected)]
    return FeatureView(kind, tuple(inputs), embedding, projected, seed, projected or width, tuple(names), why)


def default_view(signature: Signature) -> FeatureView:
    """The view of a model no bundle has chosen one for yet: raw numbers (pooled large images), hashed
    text and tokens."""
    return make_view("raw", signature, inputs=encode_inputs("raw", signature))


def view_of_bundle(
    feature_view: Mapping[str, Any] | None, feature_names: Sequence[str] | None, signature: Signature
) -> FeatureView:
    """The view a bundle records; a bundle without one (fitted before views existed) reads the raw values
    of its single input."""
    if feature_view is not None:
        return FeatureView.from_dict(feature_view, feature_names or ())
    return make_view("raw", signature, inputs=encode_inputs("raw", signature), raw_names=feature_names)
