"""Choosing a model's feature view at ``fit`` (``fit --features raw|pooled|embedding[:TENSOR]|hashed``, or
from its signature), with the reason ``fit`` prints.

By default:

* numeric inputs of at most :data:`~agent.model.views.RAW_MAX_VALUES` values per sample in all (tables,
  MNIST-sized images), with categorical text columns one-hot: ``raw`` — TDI rules then read as rules about
  the inputs themselves (pixel heatmaps, feature thresholds, categories);
* larger images, free text and token ids: the model's own ``embedding`` (the input of its last dense
  layer) where the graph has one, else ``pooled`` images and ``hashed`` text and tokens;
* a long integer vector of a fixed length (more than :data:`LONG_SEQUENCE` values: token ids padded to the
  length the model was exported with): the model's ``embedding`` where the graph has one, since a rule on
  the id at position 517 says nothing and a tree over thousands of positions costs minutes; ``raw``
  otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent.model.classifier import OnnxClassifier
from agent.model.graph import penultimate_tensor, tensor_exists
from agent.model.inputs import Inputs, Signature
from agent.model.views import (
    MAX_CATEGORIES,
    RAW_MAX_VALUES,
    VIEW_KINDS,
    FeatureView,
    ViewError,
    encode_inputs,
    is_image,
    is_token_ids,
    make_view,
)

#: Samples read to learn a view's categories and an embedding's width.
PROBE_SAMPLES = 64
#: An integer input of one dimension with more values than this per sample is read as a padded sequence.
LONG_SEQUENCE = 512


def categories_of(train: Inputs, signature: Signature) -> dict[str, list[str]]:
    """The text inputs that are categorical (at most :data:`MAX_CATEGORIES` distinct values in the
    training data), with their values, most frequent first."""
    out: dict[str, list[str]] = {}
    for spec in signature.inputs:
        if not spec.is_string:
            continue
        values = np.asarray(train[spec.name], dtype=object).reshape(train.n, -1)[:, 0].astype(str)
        uniq, counts = np.unique(values, return_counts=True)
        if len(uniq) <= MAX_CATEGORIES:
            out[spec.name] = [str(u) for u in uniq[np.argsort(-counts, kind="stable")]]
    return out


def _raw_size(signature: Signature) -> int | None:
    """Values per sample of an all-numeric, fixed-size model (None otherwise)."""
    total = 0
    for spec in signature.inputs:
        if spec.is_string or not spec.fixed:
            return None
        total += spec.size or 0
    return total


def _long_sequences(signature: Signature) -> list[str]:
    """The fixed-length integer vectors longer than :data:`LONG_SEQUENCE` (padded token ids)."""
    return [
        s.name
        for s in signature.inputs
        if not s.is_string and s.fixed and len(s.shape) == 1 and s.dtype.kind in "iu" and (s.size or 0) > LONG_SEQUENCE
    ]


def _embedding_width(model: OnnxClassifier, tensor: str, train: Inputs) -> int:
    probe = make_view("embedding", model.signature, embedding=tensor, embedding_width=1)
    viewed = model.with_view(probe)
    pred = viewed.predict_prepared(train.take(slice(0, min(PROBE_SAMPLES, train.n))))
    return int(np.asarray(pred.extra[tensor]).reshape(pred.probabilities.shape[0], -1).shape[1])


def choose_view(
    model: OnnxClassifier,
    train: Inputs,
    requested: str | None = None,
    *,
    feature_names: Sequence[str] | None = None,
    seed: int = 0,
) -> FeatureView:
    """The feature view of ``model`` (``requested``: ``raw``, ``pooled``, ``hashed``, ``embedding`` or
    ``embedding:TENSOR``; None chooses from the signature), with the reason in ``why``."""
    sig = model.signature
    kind, _, tensor = (requested or "").partition(":")
    if kind and kind not in VIEW_KINDS:
        raise ViewError(f"--features {requested!r}: one of raw, pooled, embedding[:TENSOR], hashed")
    cats = categories_of(train, sig)
    raw_size = _raw_size(sig)
    if not kind:
        free_text = [s.name for s in sig.inputs if s.is_string and s.name not in cats]
        tokens = [s.name for s in sig.inputs if is_token_ids(s)]
        large = [s.name for s in sig.inputs if is_image(s) and (s.size or 0) > RAW_MAX_VALUES]
        sequences = _long_sequences(sig)
        found = penultimate_tensor(model.model_bytes, model.scores_output) if sequences else None
        if found is not None:
            width = _embedding_width(model, found, train)
            why = (
                f"{', '.join(sequences)}: integer sequence(s) of more than {LONG_SEQUENCE} values; the model's own "
                f"representation ({found!r}, {width} values), read in the same run"
            )
            return make_view("embedding", sig, embedding=found, embedding_width=width, seed=seed, why=why)
        if raw_size is not None and raw_size <= RAW_MAX_VALUES and not large:
            why = f"{raw_size} numeric value(s) per sample: rules about the inputs themselves"
            return make_view("raw", sig, inputs=encode_inputs("raw", sig), raw_names=feature_names, seed=seed, why=why)
        if not free_text and not tokens and not large:
            why = "table columns: numbers raw, categories one-hot"
            return make_view(
                "raw", sig, inputs=encode_inputs("raw", sig, cats), raw_names=feature_names, seed=seed, why=why
            )
        what = ", ".join(free_text + tokens + large)
        found = penultimate_tensor(model.model_bytes, model.scores_output)
        if found is not None:
            width = _embedding_width(model, found, train)
            why = f"{what}: the model's own representation ({found!r}, {width} values), read in the same run"
            return make_view("embedding", sig, embedding=found, embedding_width=width, seed=seed, why=why)
        kind = "pooled" if large else "hashed"
        why = f"{what}: no dense layer before the scores to take a representation from; {kind} instead"
        return make_view(kind, sig, inputs=encode_inputs(kind, sig, cats), seed=seed, why=why)
    if kind == "embedding":
        found = tensor or penultimate_tensor(model.model_bytes, model.scores_output)
        if found is None:
            raise ViewError(
                "--features embedding: no dense layer before the scores in this graph; name the tensor "
                "(--features embedding:TENSOR) or choose raw, pooled or hashed"
            )
        if not tensor_exists(model.model_bytes, found):
            raise ViewError(f"--features embedding:{found}: the graph has no tensor of that name")
        width = _embedding_width(model, found, train)
        return make_view("embedding", sig, embedding=found, embedding_width=width, seed=seed, why="--features")
    return make_view(
        kind,
        sig,
        inputs=encode_inputs(kind, sig, cats),
        raw_names=feature_names,
        seed=seed,
        why="--features",
    )
